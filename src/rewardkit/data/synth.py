"""A deterministic built-in preference task for the demo and the tests.

The rule: the prompt asks for things of one category ("Name a fruit."; fruit, animal or
color); the chosen answer lists words of that category, the rejected answer lists words of
an off-topic category that is never asked for (tool, drink or metal). A model learns it
from the answers' words alone (it does not have to read the prompt), which is what makes it
learnable by a 2-layer model in seconds; the point of the task is the shortcut control:

- both answers have 1-4 words drawn independently from the same distribution, and the
  off-topic words have about the same length as the on-topic ones, so the longer answer (in
  words, characters or tokens) is the chosen one about half the time and a length heuristic
  scores about 0.5.

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

from rewardkit.data import reasons as R

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


def generate_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` valid rows, identical for the same (n, seed); ids are `synth-<seed>-<index>`."""
    rng = random.Random(f"rewardkit-synth:{seed}")
    return [_row(rng, f"synth-{seed}-{index:07d}") for index in range(n)]


def _answer(rng: random.Random, category: str) -> str:
    words = rng.sample(CATEGORIES[category], rng.randint(1, MAX_WORDS))
    text = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return text + "."


def _row(rng: random.Random, pair_id: str) -> dict[str, Any]:
    category = rng.choice(sorted(ASKED))
    other = rng.choice(sorted(OFF_TOPIC))
    question = rng.choice(QUESTIONS).format(c=category)
    chosen, rejected = _answer(rng, category), _answer(rng, other)
    shape = rng.choice(SHAPES)
    metadata = {"subset": shape, "category": category}
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
    from rewardkit.data.builtin_tokenizer import build_tokenizer

    return build_tokenizer(corpus() * 4, vocab_size=512)
