"""A deterministic built-in preference task for the demo and the tests.

The rule: the prompt asks for things of one category ("Name a fruit."; fruit, animal or
color); the on-topic answer lists words of that category, the off-topic answer lists words
of a category that is never asked for (tool, drink or metal). A model learns it from the
answers' words alone (it does not have to read the prompt), which is what makes it
learnable by a 2-layer model in seconds. Both answers have 1-4 words drawn independently
from the same distribution, and the off-topic words have about the same length as the
on-topic ones, so by construction the longer answer is the on-topic one about half the time.

The labels come from a simulated annotator who mostly follows the rule but is swayed by
length, as human raters are: with d = words(off-topic) − words(on-topic), the pair is
labelled the wrong way round (the off-topic answer `chosen`) with probability
`flip_probability(d)` = 0.08 for d ≤ 0 and min(0.2·d, 0.6) for d > 0. So about 17% of labels
disagree with the rule, a model that learns the rule perfectly scores about 0.83 against the
labels, the best any model can do is about 0.84 (preferring the longer off-topic answer when
d = 3), a length-only heuristic scores about 0.59, and a model trained on these labels shows
a real length bias — which is what the demo's report is there to reveal: an accuracy well
below 1 with a visible interval, a calibration curve over several bins, and accuracy that
depends on whether the chosen answer is the longer one. `metadata.flipped` marks the pairs
whose label disagrees with the rule. `generate_rows(..., annotator_noise=False)` gives the
rule's labels only (the pre-noise task, row for row).

A rule that needs the prompt (the rejected answer from *another asked* category, so no word
is good or bad on its own) was tried first and rejected: tiny-llama stayed at chance (loss
0.693) for 350+ steps, far beyond the two-minute budget.

Rows come in three shapes (plain strings, an explicit message-list prompt, implicit-prompt
conversations, half of them multi-turn); each pair has an `id` and `metadata.subset` = its
shape. `corrupt_rows` builds rows that fail each reason code, for the validation demo.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from rewardplane.data import reasons as R

ASKED: dict[str, tuple[str, ...]] = {
    "fruit": ("apple", "pear", "plum", "kiwi", "mango", "lemon", "grape", "peach"),
    "animal": ("horse", "tiger", "zebra", "camel", "otter", "mouse", "eagle", "sheep"),
    "color": ("red", "blue", "green", "yellow", "purple", "orange", "brown", "black"),
}
OFF_TOPIC: dict[str, tuple[str, ...]] = {
    "tool": ("hammer", "saw", "drill", "wrench", "chisel", "shovel", "rake", "axe"),
    "drink": ("tea", "coffee", "milk", "juice", "water", "cocoa", "soda", "cider"),
    "metal": ("iron", "copper", "gold", "silver", "zinc", "tin", "lead", "nickel"),
}
CATEGORIES = {**ASKED, **OFF_TOPIC}
QUESTIONS = ("Name a {c}.", "Which {c} do you like?", "Give me some {c} words.", "List a {c} or two.")
SYSTEM = "Answer with words only."
SMALL_TALK = (("Hello!", "Hi, how can I help?"), ("Good morning.", "Good morning to you."))
SHAPES = ("plain", "chat", "chat_implicit")
MAX_WORDS = 4
BASE_FLIP = 0.08
FLIP_PER_WORD = 0.2
MAX_FLIP = 0.6


def flip_probability(length_difference: int) -> float:
    """P(the annotator labels the off-topic answer `chosen`), d = words(off-topic) − words(on-topic)."""
    if length_difference <= 0:
        return BASE_FLIP
    return min(FLIP_PER_WORD * length_difference, MAX_FLIP)


def generate_rows(n: int, seed: int = 0, *, annotator_noise: bool = True) -> list[dict[str, Any]]:
    """`n` valid rows, identical for the same (n, seed); ids are `synth-<seed>-<index>`.

    The annotator's draws come from their own stream, so `annotator_noise=False` gives the
    same rows with the rule's labels, and a prefix of `n` rows is the same for any larger `n`.
    """
    # the seed strings keep the pre-rename name: they define the rows (and every hash, probe and
    # accuracy quoted from them), not the package
    rng = random.Random(f"rewardkit-synth:{seed}")
    annotator = random.Random(f"rewardkit-synth-annotator:{seed}")
    rows = []
    for index in range(n):
        flip = annotator.random()  # drawn for every row, so rows never shift
        rows.append(_row(rng, f"synth-{seed}-{index:07d}", flip if annotator_noise else None))
    return rows


def _answer(rng: random.Random, category: str) -> tuple[str, int]:
    words = rng.sample(CATEGORIES[category], rng.randint(1, MAX_WORDS))
    text = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return text + ".", len(words)


def _row(rng: random.Random, pair_id: str, flip: float | None = None) -> dict[str, Any]:
    category = rng.choice(sorted(ASKED))
    other = rng.choice(sorted(OFF_TOPIC))
    question = rng.choice(QUESTIONS).format(c=category)
    (chosen, on_words), (rejected, off_words) = _answer(rng, category), _answer(rng, other)
    flipped = flip is not None and flip < flip_probability(off_words - on_words)
    if flipped:
        chosen, rejected = rejected, chosen
    shape = rng.choice(SHAPES)
    metadata = {"subset": shape, "category": category}
    if flip is not None:
        metadata["flipped"] = flipped
    if shape == "plain":
        return {
            "id": pair_id,
            "prompt": question,
            "chosen": chosen,
            "rejected": rejected,
            "metadata": metadata,
        }
    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    if rng.random() < 0.5:
        greeting, reply = rng.choice(SMALL_TALK)
        history += [{"role": "user", "content": greeting}, {"role": "assistant", "content": reply}]
    history.append({"role": "user", "content": question})
    chosen_turn = {"role": "assistant", "content": chosen}
    rejected_turn = {"role": "assistant", "content": rejected}
    if shape == "chat":
        return {
            "id": pair_id,
            "prompt": history,
            "chosen": [chosen_turn],
            "rejected": [rejected_turn],
            "metadata": metadata,
        }
    return {
        "id": pair_id,
        "chosen": [*history, chosen_turn],
        "rejected": [*history, rejected_turn],
        "metadata": metadata,
    }


def corrupt_rows(k: int, seed: int = 0) -> list[tuple[str | None, Any]]:
    """`k` rows for each reason code, as `(expected_reason, row)` in `REASONS` order.

    `duplicate_id` needs a first occurrence: each one is preceded by a valid row
    (`expected_reason` None) with the same id. `oversize` rows have over-long distinct
    completions; `post_truncation` rows have completions that differ only after 700 words.
    With the default `drop` policy both are rejected as `oversize`; with `truncate` the
    post-truncation rows are rejected as `post_truncation` and the oversize rows are cut and
    kept, unless the limits leave no room for the prompt (see docs/data.md).
    """
    rng = random.Random(f"rewardkit-synth-corrupt:{seed}")
    out: list[tuple[str | None, Any]] = []
    for i in range(k):
        base = _row(rng, f"corrupt-{seed}-{i}")
        question, chosen, rejected = "Name a fruit.", "kiwi and plum.", "red."
        long_words = " ".join(rng.choice(CATEGORIES["fruit"]) for _ in range(700))
        rows: dict[str, list[tuple[str | None, Any]]] = {
            R.SCHEMA: [
                (
                    R.SCHEMA,
                    [question, chosen, rejected]
                    if i % 2
                    else {"prompt": 7, "chosen": chosen, "rejected": rejected},
                )
            ],
            R.MISSING_FIELD: [(R.MISSING_FIELD, {"prompt": question, "chosen": chosen})],
            R.BAD_ROLE: [
                (
                    R.BAD_ROLE,
                    {
                        "prompt": [{"role": "robot", "content": question}],
                        "chosen": chosen,
                        "rejected": rejected,
                    },
                )
            ],
            R.NON_TEXT_CONTENT: [
                (
                    R.NON_TEXT_CONTENT,
                    {
                        "prompt": [
                            {"role": "user", "content": [{"type": "image_url", "image_url": "x.png"}]}
                        ],
                        "chosen": chosen,
                        "rejected": rejected,
                    },
                )
            ],
            R.EMPTY_COMPLETION: [
                (R.EMPTY_COMPLETION, {"prompt": question, "chosen": chosen, "rejected": "  "})
            ],
            R.IDENTICAL: [(R.IDENTICAL, {"prompt": question, "chosen": chosen, "rejected": chosen})],
            R.PROMPT_MISMATCH: [
                (
                    R.PROMPT_MISMATCH,
                    {
                        "chosen": [
                            {"role": "user", "content": question},
                            {"role": "assistant", "content": chosen},
                        ],
                        "rejected": [
                            {"role": "user", "content": "Name a color."},
                            {"role": "assistant", "content": rejected},
                        ],
                    },
                )
            ],
            R.DUPLICATE_ID: [(None, base), (R.DUPLICATE_ID, {**_row(rng, base["id"]), "id": base["id"]})],
            R.NON_FINITE_MARGIN: [
                (
                    R.NON_FINITE_MARGIN,
                    {
                        "prompt": question,
                        "chosen": chosen,
                        "rejected": rejected,
                        "margin": float("nan") if i % 2 else float("inf"),
                    },
                )
            ],
            R.OVERSIZE: [
                (R.OVERSIZE, {"prompt": question, "chosen": long_words + " kiwi.", "rejected": "red."})
            ],
            R.POST_TRUNCATION: [
                (
                    R.POST_TRUNCATION,
                    {"prompt": question, "chosen": long_words + " kiwi.", "rejected": long_words + " red."},
                )
            ],
        }
        for reason in R.REASONS:
            out.extend(rows[reason])
    # stable sort: each duplicate_id row stays right after its first occurrence
    return sorted(out, key=lambda item: R.REASONS.index(item[0] or R.DUPLICATE_ID))


def corpus() -> list[str]:
    """Texts the built-in tokenizer is trained on: every word and phrase the task uses."""
    texts = [q.format(c=c) for q in QUESTIONS for c in ASKED]
    texts += [SYSTEM, *(text for pair in SMALL_TALK for text in pair)]
    texts += [" ".join(words) + "." for words in CATEGORIES.values()]
    texts += [", ".join(words) + " and " + words[0] for words in CATEGORIES.values()]
    texts += [word for words in CATEGORIES.values() for word in words]  # line-initial forms
    texts += ["system", "user", "assistant", "system: user: assistant: \n\n"]
    return texts


@functools.cache
def builtin_tokenizer():
    """The deterministic tokenizer for the synth task (ChatML template); built once per process."""
    from rewardplane.data.builtin_tokenizer import build_tokenizer

    return build_tokenizer(corpus() * 4, vocab_size=512)
