"""`rewardkit eval --benchmark rewardbench2` throughput against the padding-free scoring ceiling.

Data: N RewardBench-2-shaped items (default 3,000; best-of-4: one chosen and three rejected
responses per prompt, subsets Factuality / Precise IF / Math / Safety / Focus), written as a
JSONL file in the published schema and read back by the benchmark reader. Text lengths as in
benchmarks/serve_text.py: prompt tokens log-normal (median 150, σ 0.7), responses log-normal
(median 330, σ 0.9), each ChatML rendering clipped to [64, 2048] tokens, English-like words
through the same byte-level BPE. Model: a Qwen2-0.5B-shaped `*ForSequenceClassification`
(random init at the real shape; bf16 on CUDA, fp32 on CPU).

Variants (all score the same 4·N distinct texts):
  cli          `rewardkit eval --benchmark` exactly as shipped: the model saved to a directory and
               loaded by the objective scorer (fp32, right-padded batches of distinct texts sorted
               by length, --batch-size)
  packed       the same `evaluate_benchmark` run (reader, de-duplication, rules, bootstrap) with a
               scorer that runs the padding-free path (`models/packed_scoring.py`: one `rk_varlen`
               forward per --max-batch-tokens, bf16), each prompt's four responses sharing the
               prompt once (`--share`, default on)
  ceiling      `packed_scores` alone on the same token sequences (no reading, rules or bootstrap),
               with and without prefix sharing: serve_text.py's variants (c) and (c+)

Reported per variant: texts/s (= seq/s), pairs/s (texts / 2), tokens/s, seconds; for the eval
variants both the scoring time (`summary.json` throughput) and the end-to-end wall time, and
the ratio to the ceiling measured in the same process. Goal (issue 26): `packed` within 10% of
the ceiling.

    python3 benchmarks/eval_throughput.py --out eval_throughput.json                 # CUDA
    python3 benchmarks/eval_throughput.py --shape tiny --items 48 --variants packed,ceiling --out smoke.json  # CPU
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_text  # the corpus, tokenizer and model builders of the text-serving benchmark

SUBSETS = ("Factuality", "Precise IF", "Math", "Safety", "Focus")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--shape", default="qwen2-0.5b", choices=sorted(serve_text.SHAPES))
    p.add_argument("--items", type=int, default=3000)
    p.add_argument("--variants", default="cli,packed,ceiling")
    p.add_argument("--batch-size", type=int, default=16, help="cli: pairs per padded batch")
    p.add_argument("--max-batch-tokens", type=int, default=65536, help="packed / ceiling: tokens per forward")
    p.add_argument("--no-share", action="store_true", help="packed: do not share each prompt's tokens")
    p.add_argument("--replicates", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=1, help="ceiling: best of this many passes")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_items(tokenizer, n: int, seed: int) -> list[dict]:
    """RewardBench-2 rows (one chosen, three rejected) with serve_text's length distributions."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = serve_text.words_for(tokenizer, int(min(4000, rng.lognormvariate(math.log(150), 0.7))), rng)
        responses = []
        for _ in range(4):
            response = serve_text.words_for(
                tokenizer, int(min(4000, rng.lognormvariate(math.log(330), 0.9))), rng
            )
            while len(serve_text.render(tokenizer, prompt, response)) > 2048:
                response = response[: int(len(response) * 0.8)]
            while len(serve_text.render(tokenizer, prompt, response)) < 64:
                response += " " + serve_text.words_for(tokenizer, 32, rng)
            responses.append(response)
        rows.append(
            {
                "id": str(i),
                "prompt": prompt,
                "chosen": responses[:1],
                "rejected": responses[1:],
                "num_correct": 1,
                "subset": SUBSETS[i % len(SUBSETS)],
            }
        )
    return rows


def packed_scorer(model, tokenizer, *, budget: int, share: bool, device: str):
    """A PairScorer whose score() runs the padding-free path on every branch of the pairs it gets."""
    import numpy as np
    import torch

    from rewardkit.models.packed_scoring import packed_scores, plan_packed
    from rewardkit.objectives.base import PairScorer

    def score(pairs, batch_size):
        seqs = [b.input_ids for p in pairs for b in (p.chosen, p.rejected)]
        order = sorted(range(len(seqs)), key=lambda i: seqs[i])  # same-prompt texts side by side
        out = np.empty(len(seqs), dtype=np.float64)
        chunk: list[int] = []
        used = 0

        def flush():
            if not chunk:
                return
            plan = plan_packed([seqs[i] for i in chunk], share_prefixes=share, min_prefix=16)
            with torch.inference_mode():
                values = packed_scores(model.base_model, model.score, plan).float().cpu().numpy()
            out[chunk] = values

        for i in order:
            if chunk and used + len(seqs[i]) > budget:
                flush()
                chunk, used = [], 0
            chunk.append(i)
            used += len(seqs[i])
        flush()
        if device == "cuda":
            torch.cuda.synchronize()
        return out[0::2], out[1::2], None

    return PairScorer("reward_model", tokenizer, {"variant": "packed", "share_prefixes": share}, score)


def main(argv=None) -> int:
    import torch

    import rewardkit.models.attention  # noqa: F401  (registers rk_varlen)
    from rewardkit.eval.benchmarks import evaluate_benchmark

    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    variants = args.variants.split(",")
    tokenizer = serve_text.build_tokenizer()
    rows = build_items(tokenizer, args.items, args.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model = serve_text.build_model(args.shape, len(tokenizer), pad, device, "sdpa")
    params = serve_text.non_embedding_params(model)
    results: dict = {
        "machine": {
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "shape": args.shape,
        "items": args.items,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "non_embedding_params": params,
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rb2.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        seqs = [
            serve_text.render(tokenizer, r["prompt"], t) for r in rows for t in (*r["chosen"], *r["rejected"])
        ]
        tokens = sum(map(len, seqs))
        results["texts"], results["tokens"] = len(seqs), tokens

        def record(name, seconds, extra=None):
            entry = {
                "seconds": seconds,
                "texts_per_s": len(seqs) / seconds,
                "pairs_per_s": len(seqs) / 2 / seconds,
                "tokens_per_s": tokens / seconds,
                "mfu": 2 * params * tokens / seconds / serve_text.PEAK_FLOPS if device == "cuda" else None,
                **(extra or {}),
            }
            results["variants"][name] = entry
            print(f"{name:<22} {entry['texts_per_s']:>9.1f} texts/s {entry['pairs_per_s']:>9.1f} pairs/s "
                  f"{entry['tokens_per_s']:>11.0f} tokens/s", flush=True)  # fmt: skip

        def eval_variant(name, scorer, model_path):
            started = time.perf_counter()
            summary = evaluate_benchmark(
                benchmark="rewardbench2", data_path=data, model_path=model_path, out_dir=Path(tmp) / name,
                batch_size=args.batch_size, device=device, max_length=4096, replicates=args.replicates, scorer=scorer,
            )  # fmt: skip
            wall = time.perf_counter() - started
            scoring = summary["throughput"]["seconds"]
            record(name, scoring, {"end_to_end_seconds": wall, "end_to_end_pairs_per_s": len(seqs) / 2 / wall,
                                   "score": summary["headline"]["score"]})  # fmt: skip

        if "cli" in variants:
            model.save_pretrained(Path(tmp) / "model")
            tokenizer.save_pretrained(Path(tmp) / "model")
            eval_variant("cli", None, Path(tmp) / "model")
        model.set_attn_implementation("rk_varlen")  # padding-free from here on, as serve_text.py (c)
        if "ceiling" in variants:
            for share in (False, True):
                run, saved = serve_text.packed_pass(model, seqs, args.max_batch_tokens, share)
                warm, _ = serve_text.packed_pass(model, seqs[:64], args.max_batch_tokens, share)
                record(f"ceiling{'+share' if share else ''}", serve_text.timed(run, warm, device, args.repeats),
                       {"saved_tokens": saved})  # fmt: skip

        if "packed" in variants:
            share = not args.no_share
            scorer = packed_scorer(model, tokenizer, budget=args.max_batch_tokens, share=share, device=device)
            warm_rows = Path(tmp) / "warm.jsonl"
            warm_rows.write_text("".join(json.dumps(r) + "\n" for r in rows[:16]))
            evaluate_benchmark(benchmark="rewardbench2", data_path=warm_rows, model_path="warm",
                               out_dir=Path(tmp) / "warm", device=device, replicates=100, scorer=scorer)  # fmt: skip
            eval_variant("packed" + ("+share" if share else ""), scorer, "in-process")

    v = results["variants"]
    for name in ("packed", "packed+share"):
        if name in v:
            for ceiling in ("ceiling", "ceiling+share"):
                if ceiling in v:
                    v[name][f"scoring_vs_{ceiling}"] = v[name]["texts_per_s"] / v[ceiling]["texts_per_s"]
                    v[name][f"end_to_end_vs_{ceiling}"] = (
                        len(seqs) / v[name]["end_to_end_seconds"] / v[ceiling]["texts_per_s"]
                    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
