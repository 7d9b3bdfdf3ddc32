"""The benchmark runner: read, score, apply the released rules, bootstrap, write the artifacts
(the path is described in `rewardplane.eval.benchmarks`'s docstring); also reads a run's
`examples.jsonl` back for `rewardplane eval --compare`."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from rewardplane.core import atomic
from rewardplane.core.background import ahead
from rewardplane.core.errors import UsageError
from rewardplane.core.hashing import sha256_bytes
from rewardplane.data import reasons as R
from rewardplane.data.reasons import Rejection
from rewardplane.data.records import TokenizedBranch, TokenizedPair
from rewardplane.eval import bootstrap
from rewardplane.eval.benchmarks import common, loader, rewardbench, rewardbench2, rmbench
from rewardplane.eval.benchmarks.loader import Item
from rewardplane.eval.settings import EvalSettings

log = logging.getLogger(__name__)

BENCHMARKS: dict[str, ModuleType] = {m.NAME: m for m in (rewardbench, rewardbench2, rmbench)}
WORST_FILE = "worst.json"
DEFAULT_MAX_LENGTH = 4096
TRUNCATION = ("truncate", "drop")


def get(name: str) -> ModuleType:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise UsageError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}") from None


def read_items(module: ModuleType, path: str | Path) -> tuple[list[Item], dict[str, Any]]:
    """Accepted items in file order, and the data section: rows read, rejected per reason code."""
    columns, rows = loader.read_table(path)
    loader.check_columns(path, columns, module.REQUIRED, module.TITLE)
    counts = {reason: 0 for reason in R.REASONS}
    items: list[Item] = []
    seen: set[str] = set()
    first_examples: dict[str, str] = {}
    n_rows = 0
    for index, row in enumerate(rows):
        n_rows += 1
        try:
            if not isinstance(row, dict):
                raise Rejection(R.SCHEMA, "row is not an object")
            item = module.parse(row)
            if item.id in seen:
                raise Rejection(R.DUPLICATE_ID, f"id {item.id!r} already used")
        except Rejection as rejection:
            counts[rejection.reason] += 1
            first_examples.setdefault(rejection.reason, f"row {index}: {rejection}")
            continue
        seen.add(item.id)
        items.append(item)
    data = {
        "path": str(path),
        "rows": n_rows,
        "valid": len(items),
        "rejected": n_rows - len(items),
        "rejections": {k: v for k, v in counts.items() if v},
        "first_rejection": first_examples,
    }
    if not items:
        raise UsageError(f"{path}: no {module.TITLE} example left after validation ({data['rejections']})")
    return items, data


def data_sha256(items: list[Item]) -> str:
    """SHA-256 over the accepted examples (id, subset, prompt, responses) in order: what was measured."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(json.dumps(item.to_json(), sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


ENCODE_CHUNK = 2048
"""Texts per tokenizer call: a fast tokenizer encodes a batch on several threads, GIL released."""

STREAM_ITEMS = 256
"""Examples tokenised per chunk handed to the scorer (`TokenisedTexts.stream`): small enough that
the GPU starts soon after the first, large enough to keep the tokenizer's batches and the packed
forwards full (a best-of-4 chunk is ≈ 1,000 texts, ≈ 550k tokens: 8 forwards of 65,536)."""


def _untruncated_branches(
    tokenizer: Any, keys: list[tuple[str, str]], score_position: str | None
) -> list[TokenizedBranch | None]:
    """`tokenize_branch` of each (prompt, response), None where it is rejected. At the default
    score position each distinct prompt is rendered and tokenised once (a best-of-4 item has one
    prompt for four responses) and the branches are encoded in large batched calls, with the
    same ids as one `tokenize_branch` call per text (`data/tokenize.encode_branches`)."""
    from rewardplane.data.tokenize import (
        TEMPLATE_END,
        branch_text,
        encode_branches,
        render_prompt,
        tokenize_branch,
    )

    def messages(prompt: str, response: str) -> tuple[list, list]:
        return [{"role": "user", "content": prompt}], [{"role": "assistant", "content": response}]

    if score_position is not None and score_position != TEMPLATE_END:
        out: list[TokenizedBranch | None] = []
        for prompt, response in keys:
            try:
                out.append(
                    tokenize_branch(tokenizer, *messages(prompt, response), score_position=score_position)
                )
            except Rejection:
                out.append(None)
        return out
    rendered: dict[str, Any] = {}
    prompts, texts = [], []
    for prompt, response in keys:
        user, assistant = messages(prompt, response)
        if prompt not in rendered:
            rendered[prompt] = render_prompt(tokenizer, user)
        prompts.append(rendered[prompt])
        texts.append(branch_text(tokenizer, user, rendered[prompt], assistant))
    out = []
    for k in range(0, len(texts), ENCODE_CHUNK):
        out += encode_branches(tokenizer, prompts[k : k + ENCODE_CHUNK], texts[k : k + ENCODE_CHUNK])
    return out


def tokenize_texts(
    tokenizer: Any,
    keys: list[tuple[str, str]],
    *,
    max_length: int,
    truncation: str,
    score_position: str | None = None,
) -> tuple[list[TokenizedBranch | None], list[int], list[bool]]:
    """(branch or None when dropped, completion tokens before truncation, truncated?) per distinct text.

    Over-long sequences are cut from the left (the front of the prompt first), keeping the end
    of the response and the end-of-turn token the score is read at; with `drop` they are left
    out and their examples rejected as `oversize`. `score_position` is the checkpoint's recorded
    one (where its score is read), so the texts are tokenised the way the model was trained.
    """
    branches: list[TokenizedBranch | None] = []
    lengths: list[int] = []
    cut: list[bool] = []
    for branch in _untruncated_branches(tokenizer, keys, score_position):
        if branch is None:
            branches.append(None)
            lengths.append(0)
            cut.append(False)
            continue
        lengths.append(int(sum(branch.loss_mask)))
        over = len(branch.input_ids) - max_length
        if over > 0:
            cut.append(True)
            if truncation == "drop":
                branches.append(None)
                continue
            branch = TokenizedBranch(
                input_ids=branch.input_ids[over:],
                loss_mask=branch.loss_mask[over:],
                score_index=branch.score_index - over,
            )
        else:
            cut.append(False)
        branches.append(branch)
    return branches, lengths, cut


class TokenisedTexts:
    """The distinct (prompt, response) texts of a benchmark, tokenised chunk by chunk as the
    scorer takes them (`stream`), and what that decided: the examples kept, the order in which
    their texts went to the scorer, and per text its branch, completion tokens and truncation."""

    def __init__(self, n: int) -> None:
        self.branches: list[TokenizedBranch | None] = [None] * n
        self.lengths = [0] * n
        self.cut = [False] * n
        self.kept: list[Item] = []
        self.order: list[int] = []  # text index of each score, in the order the scorer got them
        self._done = [False] * n
        self._sent = [False] * n

    def stream(
        self,
        items: list[Item],
        index: dict[tuple[str, str], int],
        tokenizer: Any,
        data: dict[str, Any],
        *,
        max_length: int,
        truncation: str,
    ) -> Iterator[list[TokenizedBranch]]:
        """Per chunk of `STREAM_ITEMS` examples: tokenise its texts not seen before, reject the
        examples with a dropped or empty text (counted in `data` by reason), and yield the kept
        examples' texts not yet sent, so every text is scored once."""
        keys = list(index)
        for start in range(0, len(items), STREAM_ITEMS):
            chunk = items[start : start + STREAM_ITEMS]
            ids = [[index[(it.prompt, t)] for t in (*it.chosen, *it.rejected)] for it in chunk]
            new = [i for i in dict.fromkeys(i for row in ids for i in row) if not self._done[i]]
            branches, lengths, cut = tokenize_texts(
                tokenizer, [keys[i] for i in new], max_length=max_length, truncation=truncation
            )  # fmt: skip
            for i, branch, length, was_cut in zip(new, branches, lengths, cut, strict=True):
                self.branches[i], self.lengths[i], self.cut[i], self._done[i] = branch, length, was_cut, True
            out: list[TokenizedBranch] = []
            for item, row in zip(chunk, ids, strict=True):
                missing = [i for i in row if self.branches[i] is None]
                if missing:
                    reason = R.OVERSIZE if any(self.cut[i] for i in missing) else R.EMPTY_COMPLETION
                    data["rejections"][reason] = data["rejections"].get(reason, 0) + 1
                    data["first_rejection"].setdefault(reason, f"id {item.id}: a response {reason}")
                    continue
                self.kept.append(item)
                for i in row:
                    if not self._sent[i]:
                        self._sent[i] = True
                        self.order.append(i)
                        out.append(self.branches[i])  # type: ignore[arg-type]
            yield out


def score_branch_stream(
    scorer: Any, chunks: Iterable[list[TokenizedBranch]], batch_size: int, progress: Any = None
) -> tuple[np.ndarray, int]:
    """One float64 score per branch (arrival order) and the token count: through the scorer's own
    `score_branch_chunks` where it has one (each chunk's forwards queued as it arrives; progress
    in pairs, two branches a unit), else all chunks gathered and scored by `score_branches`."""
    if scorer.score_branch_chunks is not None:
        counted: list[int] = []

        def counting() -> Iterator[list[TokenizedBranch]]:
            for chunk in chunks:
                counted.append(sum(len(b) for b in chunk))
                yield chunk

        return scorer.score_branch_chunks(counting(), progress, per_unit=2), sum(counted)
    return score_branches(scorer, [b for chunk in chunks for b in chunk], batch_size, progress)


def score_branches(
    scorer: Any, branches: list[TokenizedBranch], batch_size: int, progress: Any = None
) -> tuple[np.ndarray, int]:
    """One float64 score per branch (input order) and the token count: through the scorer's own
    `score_branches` where it has one (progress in pairs: two branches a unit), else two
    branches per pair, by length."""
    if scorer.score_branches is not None:
        return scorer.score_branches(branches, progress, per_unit=2), sum(len(b) for b in branches)
    order = sorted(range(len(branches)), key=lambda i: (-len(branches[i]), i))
    pairs = []
    for k in range(0, len(order), 2):
        a = order[k]
        b = order[k + 1] if k + 1 < len(order) else order[k]
        pairs.append(TokenizedPair(pair_id=f"text-{k // 2}", chosen=branches[a], rejected=branches[b]))
    first, second, _ = scorer.score(pairs, batch_size, progress)
    scores = np.empty(len(branches), dtype=np.float64)
    for k in range(len(pairs)):
        scores[order[2 * k]] = first[k]
        if 2 * k + 1 < len(order):
            scores[order[2 * k + 1]] = second[k]
    return scores, sum(len(b) for b in branches)


def _distinct_texts(items: list[Item]) -> dict[tuple[str, str], int]:
    """(prompt, response) → its position: each distinct text is tokenised and scored once."""
    index: dict[tuple[str, str], int] = {}
    for item in items:
        for text in (*item.chosen, *item.rejected):
            index.setdefault((item.prompt, text), len(index))
    return index


def _score_distinct(scorer, items: list[Item], data: dict[str, Any], options: EvalSettings, **limits: Any):
    """(index, tokenised texts, their scores in `texts.order`, tokens, seconds): each distinct
    text tokenised (on a thread, ahead of the forwards) and scored once."""
    from rewardplane.eval.runner import scoring_progress

    index = _distinct_texts(items)
    texts = TokenisedTexts(len(index))
    chunks = texts.stream(items, index, scorer.tokenizer, data, **limits)
    started = time.perf_counter()
    with scoring_progress((len(index) + 1) // 2, options.progress, options.progress_every_s) as bar:
        used_scores, tokens = score_branch_stream(scorer, ahead(chunks), options.batch_size, bar)
        bar.retotal((len(texts.order) + 1) // 2)
    return index, texts, used_scores, tokens, time.perf_counter() - started


def _per_example(items: list[Item], index: dict, used: list[int], used_scores: np.ndarray):
    """(chosen, rejected): each example's scores, read back from its distinct texts' scores."""
    scores = np.full(len(index), np.nan)
    scores[used] = used_scores

    def pick(item: Item, texts: tuple[str, ...]) -> np.ndarray:
        return np.array([scores[index[(item.prompt, t)]] for t in texts], dtype=np.float64)

    return [pick(it, it.chosen) for it in items], [pick(it, it.rejected) for it in items]


def _example_rows(
    module, items, chosen, rejected, records, index, texts: TokenisedTexts, digest: str
) -> list:
    """examples.jsonl's rows: each example's scores, the benchmark's own record, lengths and cuts."""
    rows = []
    for item, c, r, rec in zip(items, chosen, rejected, records, strict=True):
        c_ids = [index[(item.prompt, t)] for t in item.chosen]
        r_ids = [index[(item.prompt, t)] for t in item.rejected]
        rows.append(
            {
                "id": item.id,
                "subset": item.subset,
                "benchmark": module.NAME,
                "chosen_scores": c.tolist(),
                "rejected_scores": r.tolist(),
                **rec,
                "chosen_tokens": [texts.lengths[i] for i in c_ids],
                "rejected_tokens": [texts.lengths[i] for i in r_ids],
                "chosen_chars": [len(t) for t in item.chosen],
                "rejected_chars": [len(t) for t in item.rejected],
                "truncated": any(texts.cut[i] for i in (*c_ids, *r_ids)),
                "data_sha256": digest,
            }
        )
    return rows


def _statistics(
    module, items: list[Item], rows: list[dict[str, Any]], options: EvalSettings
) -> dict[str, Any]:
    """The benchmark's statistics block: per subset, its aggregates, bootstrapped."""
    subset_sizes: dict[str, int] = {}
    for item in items:
        subset_sizes[item.subset] = subset_sizes.get(item.subset, 0) + 1
    return common.statistics_block(
        rows, module.SUBSET_STATISTICS, module.aggregates(subset_sizes), module.CHANCE,
        seed=options.seed, replicates=options.replicates, ranges=getattr(module, "RANGES", {}),
    )  # fmt: skip


def _length_bias(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Does the model prefer longer completions? Scores against completion tokens, per example."""
    return common.length_bias(
        [r["chosen_scores"] for r in rows], [r["rejected_scores"] for r in rows],
        [r["chosen_tokens"] for r in rows], [r["rejected_tokens"] for r in rows], "completion tokens",
    )  # fmt: skip


def _throughput(n_texts: int, tokens: int, seconds: float, record: dict[str, Any]) -> dict[str, Any]:
    """summary.json's `throughput`: distinct texts, pairs and tokens per second, how it scored."""
    return {
        "distinct_texts": n_texts,
        "pairs": n_texts / 2,
        "tokens": tokens,
        "seconds": seconds,
        "texts_per_s": n_texts / seconds if seconds > 0 else None,
        "pairs_per_s": n_texts / 2 / seconds if seconds > 0 else None,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        **record,
    }


def evaluate_benchmark(
    *,
    benchmark: str,
    data_path: str | Path,
    model_path: str | Path,
    out_dir: str | Path,
    options: EvalSettings = EvalSettings(),
    max_length: int = DEFAULT_MAX_LENGTH,
    truncation: str = "truncate",
    scorer: Any = None,
) -> dict[str, Any]:
    """Read, score, apply the released rules, bootstrap, write the artifacts; return the summary."""
    from rewardplane.eval.runner import _device, load_model

    module = get(benchmark)
    if truncation not in TRUNCATION:
        raise UsageError(f"truncation must be one of {TRUNCATION}, got {truncation!r}")
    items, data = read_items(module, data_path)
    device = _device(options.device)
    if scorer is None:
        scorer = load_model(model_path, device=device, **options.model_kwargs())

    index, texts, used_scores, tokens, seconds = _score_distinct(
        scorer, items, data, options, max_length=max_length, truncation=truncation
    )
    items, used = texts.kept, texts.order
    data["valid"], data["rejected"] = len(items), data["rows"] - len(items)
    if not items:
        raise UsageError(f"{data_path}: no example left after tokenisation ({data['rejections']})")
    bad = np.flatnonzero(~np.isfinite(used_scores))
    if bad.size:
        raise UsageError(
            f"model gave {bad.size} non-finite score(s); nothing written", code="non_finite_scores"
        )
    chosen, rejected = _per_example(items, index, used, used_scores)
    digest = data_sha256(items)
    rows = _example_rows(
        module, items, chosen, rejected, module.score(items, chosen, rejected), index, texts, digest
    )
    data.update(
        distinct_texts=len(used),
        truncated_texts=int(sum(texts.cut[i] for i in used)),
        truncated_examples=sum(row["truncated"] for row in rows),
        max_length=max_length,
        truncation=truncation,
    )
    stats = _statistics(module, items, rows, options)
    examples_bytes = common.example_lines(rows)
    summary: dict[str, Any] = {
        "schema": common.SUMMARY_SCHEMA,
        "benchmark": module.NAME,
        "title": module.TITLE,
        "matched": module.MATCHED,
        "chance": module.CHANCE,
        "headline": headline(module, stats),
        "n_examples": len(rows),
        **stats,
        "details": details(module, items, rows),
        "length_bias": _length_bias(rows),
        "data": data,
        "data_sha256": digest,
        "objective": scorer.objective,
        "model": {"path": str(model_path), **scorer.metadata},
        "throughput": _throughput(len(used), tokens, seconds, {**options.record(device), **scorer.scoring}),
        "bootstrap": {
            "seed": options.seed,
            "replicates": options.replicates,
            "generator": bootstrap.GENERATOR,
        },
        "examples_file": common.EXAMPLES_FILE,
        "examples_sha256": sha256_bytes(examples_bytes),
        "worst_file": WORST_FILE,
    }
    out = Path(out_dir)
    atomic.write_bytes(out / common.EXAMPLES_FILE, examples_bytes)
    atomic.write_json(out / WORST_FILE, common.worst_pairs(items, rows))
    atomic.write_json(out / "summary.json", summary)
    return summary


def headline(module: ModuleType, stats: dict[str, Any]) -> dict[str, Any]:
    aggregates = stats["aggregates"]
    name = module.HEADLINE if module.HEADLINE in aggregates else next(iter(aggregates))
    block = aggregates[name]["bootstrap"]
    low, high = block["ci_95"]
    sentence = (
        f"{module.TITLE} {name}: {block['point']:.3f} (95% interval {low:.3f}–{high:.3f}; one-sided lower "
        f"bound {block['lower_95']:.3f}) on {aggregates[name]['n']} examples, against chance "
        f"{module.CHANCE:g}: {'above' if block['pass'] else 'not shown above'} chance."
    )
    return {"name": name, "score": block["point"], "ci_95": [low, high], "lower_95": block["lower_95"],
            "chance": module.CHANCE, "sentence": sentence}  # fmt: skip


def details(module: ModuleType, items: list[Item], rows: list[dict[str, Any]]) -> dict[str, Any]:
    if module is rewardbench2:
        return {"ties": rewardbench2.subset_details(items, rows)}
    if module is rmbench:
        return {"style_matrix": rmbench.style_matrices(rows)}
    return {"sections": rewardbench.section_weights({it.subset for it in items})}


def read_examples(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a benchmark examples.jsonl (or the one inside a directory), checked for the fields compare needs."""
    path = Path(path)
    if path.is_dir():
        path = path / common.EXAMPLES_FILE
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(
                    f"{path}:{line_no}: not JSON ({exc.msg})", code="bad_examples_file"
                ) from None
            missing = [k for k in (*common.EXAMPLE_SCHEMA_KEYS, "benchmark", "data_sha256") if k not in row]
            if missing:
                raise UsageError(f"{path}:{line_no}: missing {', '.join(missing)}", code="bad_examples_file")
            rows.append(row)
    if not rows:
        raise UsageError(f"{path}: no examples", code="bad_examples_file")
    return rows


def is_examples_file(path: str | Path) -> bool:
    path = Path(path)
    return path.name == common.EXAMPLES_FILE or (path.is_dir() and (path / common.EXAMPLES_FILE).is_file())
