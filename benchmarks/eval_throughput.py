"""`rewardplane eval --benchmark rewardbench2` throughput against the padding-free scoring ceiling (issue 26).

Data: N RewardBench-2-shaped items (default 3,000; best-of-4: one chosen and three rejected
responses per prompt, subsets Factuality / Precise IF / Math / Safety / Focus), written as JSONL
in the published schema. Lengths as benchmarks/serve_text.py's corpus: prompt tokens log-normal
(median 150, σ 0.7), responses log-normal (median 330, σ 0.9), each ChatML rendering kept in
[64, 2048] tokens, words from serve_text_corpus.WORDS through its byte-level BPE. The texts are built
from word indices drawn with NumPy (every word is one token of that BPE, so a text of n words
is n tokens and nothing is tokenised to size it): the first version tokenised and re-rendered
every text in Python loops and ran out of time on the H200 before printing anything.

Model: a `*ForSequenceClassification` at Qwen2-0.5B's shapes (random init, seed 0; bf16 on
CUDA, fp32 on CPU), saved as an HF directory.

Measured in one process, in this order (a progress line is printed before each step):
  eval      the shipped command, `rewardplane eval --benchmark rewardbench2 --dtype bf16`, called
            through `rewardplane.cli.main` after a warm-up call on the first 16 items: reading, tokenising,
            scoring (models/packed_scoring.score_sequences: packed rk_varlen forwards of at most
            --max-batch-tokens tokens, each prompt's four responses sharing its tokens),
            released rules, 10,000-replicate bootstrap, artifacts. `scoring` is the time
            summary.json records for the forwards (wall clock around a call that ends by
            copying the scores to the host); `end_to_end` the whole command.
  ceiling   serve_text.py's variants (c) and (c+), through its own code (`packed_pass`,
            `timed`: CUDA events, after a warm-up): `packed_scores` alone on the same token
            sequences in item order, plans built before the clock starts, without and with
            prefix sharing.

Reported: items/s, completions/s (= texts/s = seq/s), pairs/s (completions / 2, as summary.json
counts them), tokens/s, MFU (2 × non-embedding parameters × tokens/s / 790 TFLOP/s), and the
ratios eval / ceiling formed within the run. Goal (issue 26): eval within 10% of the ceiling.

    python3 benchmarks/eval_throughput.py --out eval_throughput.json     # CUDA, ≈ 2–4 minutes
    python3 benchmarks/eval_throughput.py --smoke --out smoke.json       # CPU, tiny shape, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_text_corpus  # the text-serving benchmark's corpus words and tokenizer
import serve_text_models  # its model builder, passes and ceiling

SUBSETS = ("Factuality", "Precise IF", "Math", "Safety", "Focus")
STARTED = time.perf_counter()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="JSON results (rewritten after every step)")
    p.add_argument("--shape", default="qwen2-0.5b", choices=sorted(serve_text_models.SHAPES))
    p.add_argument("--items", type=int, default=3000)
    p.add_argument("--max-batch-tokens", type=int, default=65536, help="tokens per packed forward")
    p.add_argument("--replicates", type=int, default=10_000, help="the eval's bootstrap replicates")
    p.add_argument("--repeats", type=int, default=1, help="ceiling: best of this many timed passes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length-scale", type=float, default=1.0, help="scales the length medians and bounds")
    p.add_argument(
        "--smoke", action="store_true", help="tiny shape, 12 short items, 100 replicates: a CPU check"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.items, args.replicates, args.length_scale = "tiny", 12, 100, 0.1
    return args


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", flush=True)


def build_items(tokenizer, n: int, seed: int, scale: float = 1.0) -> list[dict]:
    """RewardBench-2 rows (one chosen, three rejected) with serve_text's length distributions,
    drawn as word indices; each response is cut or extended so its rendering stays in [64, 2048]
    (medians and bounds times `scale`)."""
    import numpy as np

    from rewardplane.data.tokenize import tokenize_branch

    words = np.array(serve_text_corpus.WORDS)
    joined = " ".join(serve_text_corpus.WORDS)
    if len(tokenizer(joined, add_special_tokens=False)["input_ids"]) != len(words):
        raise SystemExit("serve_text's words are no longer one token each; the lengths below would be wrong")
    template = len(tokenize_branch(tokenizer, [{"role": "user", "content": "a"}],
                                   [{"role": "assistant", "content": "b"}]).input_ids) - 2  # fmt: skip
    rng = np.random.default_rng(seed)
    low, high = max(template + 2, int(64 * scale)), int(2048 * scale)
    prompt_len = np.clip(rng.lognormal(math.log(150 * scale), 0.7, n).astype(int), 1, high // 2)
    response_len = rng.lognormal(math.log(330 * scale), 0.9, (n, 4)).astype(int)
    room = prompt_len[:, None] + template
    response_len = np.clip(response_len, low - room, high - room)
    response_len = np.maximum(response_len, 1)
    ids = rng.integers(0, len(words), int(prompt_len.sum() + response_len.sum()))
    texts = iter(" ".join(chunk) for chunk in np.split(words[ids], np.cumsum(
        np.concatenate([prompt_len[:, None], response_len], axis=1).ravel())[:-1]))  # fmt: skip
    rows = []
    for i in range(n):
        prompt = next(texts)
        responses = [next(texts) for _ in range(4)]
        rows.append({"id": str(i), "prompt": prompt, "chosen": responses[:1], "rejected": responses[1:],
                     "num_correct": 1, "subset": SUBSETS[i % len(SUBSETS)]})  # fmt: skip
    return rows


def rates(seconds: float, items: int, texts: int, tokens: int, params: int, device: str) -> dict:
    return {
        "seconds": seconds,
        "items_per_s": items / seconds,
        "completions_per_s": texts / seconds,
        "pairs_per_s": texts / 2 / seconds,
        "tokens_per_s": tokens / seconds,
        "mfu": 2 * params * tokens / seconds / serve_text_models.PEAK_FLOPS if device == "cuda" else None,
    }


def run_eval(data: Path, model_dir: Path, out: Path, args, device: str, dtype: str, replicates: int) -> float:
    """`rewardplane eval --benchmark rewardbench2` as a user types it; its own output swallowed, the
    wall time returned."""
    from rewardplane.cli import main

    argv = ["eval", "--benchmark", "rewardbench2", "--data", str(data), "--model", str(model_dir),
            "--out", str(out), "--device", device, "--dtype", dtype, "--replicates", str(replicates),
            "--max-batch-tokens", str(args.max_batch_tokens)]  # fmt: skip
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"rewardplane {' '.join(argv)} exited {code}")
    return time.perf_counter() - started


def main(argv=None) -> int:
    progress("importing torch and transformers")
    import torch
    import transformers

    import rewardplane.models.attention  # noqa: F401  (registers rk_varlen)
    from rewardplane.eval.benchmarks.runner import tokenize_texts

    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        torch.set_num_threads(1)  # a tiny model on a shared CPU: more threads only contend
    dtype = "bf16" if device == "cuda" else "fp32"
    result: dict = {
        "machine": {
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "command": " ".join([sys.executable, *sys.argv]),
        "shape": args.shape,
        "dtype": dtype,
        "max_batch_tokens": args.max_batch_tokens,
    }

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))

    progress(f"building {args.items} items ({args.shape}, {device}, {dtype})")
    tokenizer = serve_text_corpus.build_tokenizer()
    rows = build_items(tokenizer, args.items, args.seed, args.length_scale)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data, warm_data = root / "rb2.jsonl", root / "warm.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        warm_data.write_text("".join(json.dumps(r) + "\n" for r in rows[: min(16, len(rows) // 3)]))
        progress("building the model and saving it as an HF directory")
        model = serve_text_models.build_model(
            args.shape, len(tokenizer), tokenizer.pad_token_id, device, "sdpa"
        )
        params = serve_text_models.non_embedding_params(model)
        model.save_pretrained(root / "model")
        tokenizer.save_pretrained(root / "model")

        progress("eval: warm-up on the first items")
        run_eval(warm_data, root / "model", root / "warm", args, device, dtype, 100)
        progress(f"eval: rewardplane eval --benchmark rewardbench2 --dtype {dtype} on {len(rows)} items")
        wall = run_eval(data, root / "model", root / "eval", args, device, dtype, args.replicates)
        summary = json.loads((root / "eval" / "summary.json").read_text())
        record = summary["throughput"]
        texts, tokens = record["distinct_texts"], record["tokens"]
        result["corpus"] = {"items": len(rows), "completions": texts, "tokens": tokens}
        result["eval"] = {
            "scoring": rates(record["seconds"], len(rows), texts, tokens, params, device),
            "end_to_end": rates(wall, len(rows), texts, tokens, params, device),
            "throughput_record": record,
            "headline": summary["headline"]["score"],
        }
        progress(f"eval: scoring {result['eval']['scoring']['completions_per_s']:.1f} completions/s, "
                 f"end to end {result['eval']['end_to_end']['completions_per_s']:.1f} ({record['path']})")  # fmt: skip
        save()

        progress("ceiling: tokenising the same texts")
        keys = [(r["prompt"], t) for r in rows for t in (*r["chosen"], *r["rejected"])]
        branches, _, _ = tokenize_texts(tokenizer, keys, max_length=4096, truncation="truncate")
        seqs = [b.input_ids for b in branches]
        if sum(map(len, seqs)) != tokens:
            raise SystemExit("the ceiling's sequences are not the ones eval scored")
        result["corpus"]["median_tokens"] = statistics.median(map(len, seqs))
        model.set_attn_implementation("rk_varlen")  # serve_text.py's (c) and (c+)
        result["ceiling"] = {}
        for name, share in (("c", False), ("c+", True)):
            progress(f"ceiling ({name}): planning and timing")
            run, saved = serve_text_models.packed_pass(model, seqs, args.max_batch_tokens, share)
            warm, _ = serve_text_models.packed_pass(
                model, seqs[: min(96, len(seqs) // 4)], args.max_batch_tokens, share
            )
            seconds = serve_text_models.timed(run, warm, device, args.repeats)
            result["ceiling"][name] = {**rates(seconds, len(rows), texts, tokens, params, device),
                                       "saved_tokens": saved}  # fmt: skip
            progress(f"ceiling ({name}): {result['ceiling'][name]['completions_per_s']:.1f} completions/s")
            save()

    result["ratios"] = {
        f"eval_{kind}_over_ceiling_{name}": result["eval"][kind]["completions_per_s"] / c["completions_per_s"]
        for kind in ("scoring", "end_to_end")
        for name, c in result["ceiling"].items()
    }
    save()
    progress(json.dumps(result["ratios"]))
    if args.out:
        progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    # TOKENIZERS_PARALLELISM is left as a user has it (unset: the fast tokenizer encodes a batch
    # on all cores); nothing here forks after the tokenizer runs
    sys.exit(main())
