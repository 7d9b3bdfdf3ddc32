"""Text reward models at the hardware ceiling: padded vs sorted vs padding-free vs over HTTP.

One corpus, one run, side by side (docs/benchmarks/serve_text.md). The corpus is 256 prompts x
8 responses (GRPO groups, which arrive together): prompt tokens log-normal (median 150, sigma
0.7), response log-normal (median 330, sigma 0.9), the whole ChatML rendering clipped to
[64, 2048] tokens, English-like words through a byte-level BPE trained on them.

Variants, per model shape (random init at the real shapes, bf16):
  a  transformers AutoModelForSequenceClassification, padded batches of 32 in arrival order
  b  the same, sorted by length
  c  in-process padding-free (varlen) forward of the whole corpus: the ceiling
  c+ (c) with each group's prompt packed once (prefix sharing)
  cb, cb+  (c) and (c+) cut into forwards of --batcher-tokens input tokens, the size of the
     batches the server forms: the ceiling at the served batch size
  d  rewardplane serve over HTTP (`--config`), 16 concurrent clients sending groups of 8, the
     scorer's default of two batches in flight (run 7 called this d2; its d was d1)
  d1 (d) with one batch at a time (`pipeline_depth: 1`)
  e  (d) with prefix sharing on
  e1 (e) with one batch at a time
  h  host capacity: (d) with the model forward replaced by a near-zero-cost stand-in
     (benchmarks/serve_text_standin.py); everything else is the real server path
  h+ (h) with prefix sharing on
  parity  served = transformers (benchmarks/serve_text_parity.py): every item's served score
     (packed, prefix-shared, padded in process; `--deploy` over HTTP with `deploy` in
     --serve-modes) against a plain transformers forward of the same ids, one sequence at a
     time; --parity-groups groups of the same corpus. `--models smollm2 --smollm2 CKPT` scores
     the real-weights checkpoint benchmarks/smollm2_weights.py builds, through the `rm` scorer.

MFU = 2 x non-embedding params x real tokens/s / 790e12 (real tokens: the corpus's, not padding).

--trace DIR records every packed forward's host and GPU times, in process and in the server
(benchmarks/serve_text_trace.py), and adds trace_* fields to each row: GPU busy fraction, ms
per forward, launch time. --profile DIR attaches py-spy to the server (--profile-gil,
--profile-idle). --switch-interval sets the server's sys.setswitchinterval.

    python3 benchmarks/serve_text.py --out serve_text.json                 # CUDA: all variants
    python3 benchmarks/serve_text.py --models tiny --variants a,b,c,c+ --n-groups 8   # CPU smoke
    python3 benchmarks/serve_text.py --models qwen2-0.5b --variants h --serve-modes config  # host only
    python3 benchmarks/serve_text.py --variants parity --serve-modes deploy --out parity.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from serve_text_corpus import build_corpus, build_tokenizer
from serve_text_http import http_variant, request_body
from serve_text_models import (
    PEAK_FLOPS,
    SHAPES,
    build_model,
    non_embedding_params,
    packed_pass,
    padded_pass,
    timed,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--models", default="qwen2-0.5b,llama-3.2-1b,llama-3.1-8b")
    p.add_argument("--variants", default="a,b,c,c+,d,e")
    p.add_argument("--n-groups", type=int, default=256)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-batch-tokens", type=int, default=65536, help="tokens per packed forward (c, d)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument(
        "--batcher-tokens", type=int, default=32768, help="the served scorer's token_budget (d, e)"
    )
    p.add_argument("--serve-modes", default="config,deploy", help="d/e through --config and/or --deploy")
    p.add_argument("--repeats", type=int, default=2, help="timed passes per in-process variant (best kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parity-groups", type=int, default=16, help="parity: groups of --group-size items")
    p.add_argument("--smollm2", type=Path, default=None, help="parity: the real-weights checkpoint directory")
    p.add_argument(
        "--simulate-us-per-token",
        type=float,
        default=0.0,
        help="h/h+: a simulated GPU of this many microseconds per token (batching-policy studies on CPU)",
    )
    p.add_argument(
        "--simulate-batch-ms",
        type=float,
        default=0.0,
        help="with --simulate-us-per-token: host time per batch before the device (plan, copies, launches)",
    )
    p.add_argument("--profile", type=Path, default=None, help="py-spy the timed HTTP runs into this folder")
    p.add_argument("--profile-gil", action="store_true", help="with --profile: only the GIL holder")
    p.add_argument(
        "--trace", type=Path, default=None, help="the served forwards' GPU timeline into this folder"
    )
    p.add_argument(
        "--switch-interval", type=float, default=None, help="the server's sys.setswitchinterval (seconds)"
    )
    p.add_argument(
        "--profile-idle", action="store_true", help="with --profile: idle threads too (where each one waits)"
    )
    return p.parse_args(argv)


def parity_section(shape: str, tok_dir: Path, args, device: str) -> dict:
    """Served = transformers for one model (serve_text_parity.py), bf16, on its own corpus of
    --parity-groups groups (the smollm2 checkpoint: the corpus its embedding rows were packed for)."""
    from serve_text_parity import parity

    options = {"max_batch_tokens": args.max_batch_tokens}
    if SHAPES[shape] is None:
        from transformers import AutoTokenizer

        from smollm2_weights import CORPUS

        if args.smollm2 is None:
            raise SystemExit("--models smollm2 needs --smollm2 CKPT (benchmarks/smollm2_weights.py build)")
        tokenizer = AutoTokenizer.from_pretrained(args.smollm2)
        rows = build_corpus(tokenizer, CORPUS["n_groups"], CORPUS["group_size"], CORPUS["seed"])
        spec = {"name": "rm", "kind": "rm", "path": str(args.smollm2), "options": options}
    else:
        rows = build_corpus(build_tokenizer(), args.parity_groups, args.group_size, args.seed)
        served = "tiny-text-rm" if shape == "tiny" else shape
        spec = {
            "name": "rm",
            "kind": "hf_seqcls",
            "shape": served,
            "options": {**options, "tokenizer": str(tok_dir)},
        }
    spec.update(dtype="bf16" if device == "cuda" else "fp32", device=device, max_batch_size=4096,
                max_wait_ms=2.0, token_budget=args.batcher_tokens)  # fmt: skip
    deploy = "deploy" in args.serve_modes.split(",")
    return parity(shape, spec, rows, request_body=request_body, deploy=deploy)


def main(argv=None) -> int:
    import torch
    import transformers

    import rewardplane.models.attention  # noqa: F401  (registers rk_varlen)

    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_tokenizer()
    rows = build_corpus(tokenizer, args.n_groups, args.group_size, args.seed)
    seqs = [r["ids"] for r in rows]
    real_tokens = sum(map(len, seqs))
    variants = args.variants.split(",")
    result = {
        "machine": {
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "command": " ".join([sys.executable, *sys.argv]),
        "corpus": {
            "sequences": len(seqs),
            "tokens": real_tokens,
            "median_tokens": statistics.median(map(len, seqs)),
            "groups": args.n_groups,
        },
        "rows": [],
        "summary": [],
    }
    traced = None
    if args.trace is not None:
        from serve_text_trace import install

        traced = install(str(args.trace / "inproc"))
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = Path(tmp) / "tokenizer"
        tokenizer.save_pretrained(tok_dir)
        for shape in args.models.split(","):
            if "parity" in variants:
                result.setdefault("parity", []).append(parity_section(shape, tok_dir, args, device))
                print(json.dumps(result["parity"][-1]), flush=True)
                if args.out:
                    args.out.write_text(json.dumps(result, indent=2))
            if SHAPES[shape] is None:
                continue
            per: dict[str, dict] = {}
            in_process = bool({"a", "b", "c", "c+", "cb", "cb+"} & set(variants))
            # without an in-process variant the model only counts parameters: no weights (meta)
            at = device if in_process else "meta"
            model = build_model(shape, len(tokenizer), tokenizer.pad_token_id, at, "sdpa")
            params = non_embedding_params(model)
            pad, warm = tokenizer.pad_token_id, seqs[:96]
            if "a" in variants:
                run = padded_pass(model, seqs, pad, device)
                per["a"] = {
                    "seconds": timed(run, padded_pass(model, warm, pad, device), device, args.repeats)
                }
            if "b" in variants:
                run = padded_pass(model, sorted(seqs, key=len), pad, device)
                per["b"] = {
                    "seconds": timed(run, padded_pass(model, warm, pad, device), device, args.repeats)
                }
            # cb / cb+: c / c+ cut into the batches a served scorer forms (--batcher-tokens of input
            # per forward), so the device's own rate at the served batch shape is known
            for name, share, budget in (
                ("c", False, args.max_batch_tokens),
                ("c+", True, args.max_batch_tokens),
                ("cb", False, args.batcher_tokens),
                ("cb+", True, args.batcher_tokens),
            ):
                if name in variants:
                    model.set_attn_implementation("rk_varlen")
                    run, saved = packed_pass(model, seqs, budget, share)
                    warm_run, _ = packed_pass(model, warm, budget, share)
                    start = time.perf_counter()
                    per[name] = {"seconds": timed(run, warm_run, device, args.repeats), "saved_tokens": saved}
                    if traced is not None:  # the in-process forwards' timeline, as the server's
                        from serve_text_trace import summarise

                        window = (start, time.perf_counter())
                        per[name].update({f"trace_{k}": v for k, v in summarise(traced, *window).items()})
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
            served = "tiny-text-rm" if shape == "tiny" else shape
            for name, share, standin, depth in (
                ("d", False, False, None),
                ("d1", False, False, 1),  # d with one batch at a time (pipeline_depth 1)
                ("e", True, False, None),
                ("e1", True, False, 1),  # e with one batch at a time
                ("h", False, True, None),
                ("h2", False, True, 2),  # h with two batches in flight (with --simulate-us-per-token)
                ("h+", True, True, None),
            ):
                for mode in args.serve_modes.split(","):
                    label = name if mode == "config" else f"{name}:{mode}"
                    if name in variants:
                        per[label] = http_variant(
                            served, tok_dir, rows, args, share, device, mode, standin=standin, label=label,
                            pipeline_depth=depth,
                        )  # fmt: skip
            for name, row in per.items():
                seconds = row["seconds"]
                row.setdefault("seq_per_s", len(seqs) / seconds)
                row.setdefault("tokens_per_s", real_tokens / seconds)
                mfu = 2 * params * row["tokens_per_s"] / PEAK_FLOPS
                result["rows"].append({"model": shape, "variant": name, "mfu": mfu, "params": params, **row})
                print(json.dumps(result["rows"][-1]), flush=True)
            summary = {"model": shape}
            if "c" in per and "d" in per:
                summary["http_over_varlen_ceiling"] = per["d"]["seq_per_s"] / per["c"]["seq_per_s"]
            if "d" in per and "e" in per:
                summary["prefix_sharing_speedup"] = per["e"]["seq_per_s"] / per["d"]["seq_per_s"]
            if "d:deploy" in per and "e:deploy" in per:
                summary["deploy_prefix_sharing_speedup"] = (
                    per["e:deploy"]["seq_per_s"] / per["d:deploy"]["seq_per_s"]
                )
            for shared, plain in (("e1", "d1"), ("e1:deploy", "d1:deploy")):
                if shared in per and plain in per:  # prefix sharing, both one batch at a time
                    summary[f"{shared}_over_{plain}"] = per[shared]["seq_per_s"] / per[plain]["seq_per_s"]
            for label in ("d1", "d1:deploy"):
                if "c" in per and label in per:  # one batch at a time, same run
                    summary[f"{label}_over_varlen_ceiling"] = per[label]["seq_per_s"] / per["c"]["seq_per_s"]
            if "c" in per and "d:deploy" in per:
                summary["deploy_http_over_varlen_ceiling"] = (
                    per["d:deploy"]["seq_per_s"] / per["c"]["seq_per_s"]
                )
            for mode in args.serve_modes.split(","):
                label = "h" if mode == "config" else "h:deploy"
                if "c" in per and label in per:  # how far the host alone is from the GPU ceiling
                    summary[f"host_{mode}_over_varlen_ceiling"] = (
                        per[label]["seq_per_s"] / per["c"]["seq_per_s"]
                    )
            if "c" in per and "c+" in per:
                summary["inprocess_prefix_sharing_speedup"] = per["c+"]["seq_per_s"] / per["c"]["seq_per_s"]
            result["summary"].append(summary)
            if args.out:  # after each model, so a run cut short keeps what it measured
                args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
