"""Verifier throughput and latency (docs/benchmarks/verifiers.md).

    .venv/bin/python benchmarks/verifiers.py --out docs/benchmarks/verifiers.json
    .venv/bin/python benchmarks/verifiers.py --only math --out math.json   # the math section alone

1. math, in-thread reference: `check_answer` (math-verify parse + verify, the exact work a pool
   worker does, after the same warm-up) called in this thread on typical RL answers (a few
   hundred words ending in a boxed answer, half right): items/s on one core, p50/p99 per item.
2. math, the worker pool alone (`MathScorer.score_batch` from `clients` threads, batches of 32,
   no HTTP): items/s, and this process's CPU per item (the pool's own cost in the server).
3. math through `POST /v1/score`: a `rewardplane serve` subprocess with a `math` scorer (one worker
   process per usable core unless `--math-workers`); throughput with batches of 32 from
   `--math-clients` concurrent clients (default 2 per core: enough items in flight that every
   worker always has the next one), the server process's and its workers' CPU per item, then
   per-item latency (batch 1, one client): p50/p99. Goals (issue #25): items/s >= 80 % of
   cores x the in-thread rate; p99 < 25 ms.
4. judge against a stand-in engine (every answer takes 50 ms, as generation would): items/s
   sending the prompts straight to it with 16 in flight, with 1 in flight (verl's default
   rate-limited judge wrapper), and through `POST /v1/score` with a `judge` scorer at
   concurrency 16. This isolates the scorer's and the service's cost; it is not a model's speed.
5. judge with a real engine (`--only judge_engine`; the GPU command is in
   docs/benchmarks/verifiers.md): a Llama-3.2-1B-shaped model (bf16, random weights, made to
   answer every prompt with a fixed script of filler tokens ending in "Score: 7" by
   `rewardplane.models.tiny.scripted_causal_lm`, so every answer is the same length and parses)
   with the SmolLM2 tokenizer and chat template. `transformers serve` (continuous batching) is
   the engine: prompts/s and generated tokens/s straight to it at 16 in flight and at 1 in
   flight (verl's default rate-limited wrapper), and through `POST /v1/score` with a `judge`
   scorer at concurrency 16; then the in-process backend (`backend: transformers`) on the same
   model through `POST /v1/score`. The compute per token is the 1B shape's; the answers are not
   a judge's (no real weights can be fetched), so these are throughput figures only.
   `--smoke` runs the same code with a tiny Llama on the CPU.
3. code sandbox: start-up latency (from `LocalSandbox.run()` to the program's first statement,
   both read from the same wall clock) and round trip per run, p50/p99, with the isolation in
   force; and trivial-program runs/s at `concurrency` = cores. References measured in the same
   run: a fresh `python3 -I -c pass`, `python3 -S -c pass`, and a fork from this process. Then
   assert-style items/s through `CodeScorer.score_batch` (`--code-items` MBPP-shaped items: a
   function and 5 asserts with literal expected values, half right; batches of 32, `concurrency`
   = cores; the median and best of 3 passes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

from verifiers_code import bench_code_assert, bench_process_refs, bench_sandbox
from verifiers_judge import bench_judge_engine, bench_judge_fake, export_smollm2_tokenizer
from verifiers_math import (
    answers,
    bench_math_http,
    bench_math_in_thread,
    bench_math_parallel,
    bench_math_pool,
)


def _installed(pkg: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(pkg)
    except md.PackageNotFoundError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--math-items", type=int, default=2000)
    ap.add_argument("--sandbox-runs", type=int, default=400)
    ap.add_argument("--code-items", type=int, default=512, help="assert-style items per pass")
    ap.add_argument("--judge-items", type=int, default=1024)
    ap.add_argument("--math-clients", type=int, default=None, help="concurrent clients (default 2 per core)")
    ap.add_argument("--math-workers", type=int, default=None, help="pool workers (default: the scorer's)")
    ap.add_argument(
        "--only", choices=["math", "sandbox", "judge", "judge_engine"], default=None, help="run one section"
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--judge-engine-items", type=int, default=512)
    ap.add_argument(
        "--judge-max-tokens", type=int, default=96, help="max_tokens (scripted answers are 53 tokens)"
    )
    ap.add_argument(
        "--judge-concurrency",
        type=int,
        default=16,
        help="judge_engine: requests in flight (direct and /v1/score)",
    )
    ap.add_argument("--judge-local-batch", type=int, default=64, help="in-process backend's max_batch_size")
    ap.add_argument(
        "--judge-phase-s", type=float, default=40.0, help="judge_engine: seconds per phase, about"
    )
    ap.add_argument("--judge-tokenizer", default=None, help="a saved tokenizer with a chat template")
    ap.add_argument("--engine-args", default="--continuous-batching", help="extra `transformers serve` flags")
    ap.add_argument("--smoke", action="store_true", help="judge_engine on the CPU with a tiny Llama")
    ap.add_argument("--export-tokenizer", default=None, help="save SmolLM2's tokenizer to DIR and exit")
    args = ap.parse_args()
    if args.export_tokenizer:
        print("saved", export_smollm2_tokenizer(Path(args.export_tokenizer)))
        return
    import importlib.metadata as md

    cores = len(os.sched_getaffinity(0))
    data = answers(args.math_items)
    res: dict = {
        "machine": {
            "platform": platform.platform(),
            "cpu": platform.processor() or platform.machine(),
            "cores": cores,
            "python": platform.python_version(),
            **{
                pkg.replace("-", "_"): md.version(pkg)
                for pkg in ("math-verify", "sympy", "torch", "transformers", "openai", "fastapi")
                if _installed(pkg)
            },
            "load_avg_at_start": os.getloadavg(),
        },
        "command": " ".join(["python", *sys.argv]),
    }
    if args.only in (None, "math"):
        clients = args.math_clients or max(4, 2 * cores)
        res["math_in_thread"] = bench_math_in_thread(data)
        print("math in-thread:", res["math_in_thread"], flush=True)
        res["math_parallel"] = bench_math_parallel(data, cores)
        print("math in-thread x cores processes, no IPC:", res["math_parallel"], flush=True)
        res["math_pool"] = bench_math_pool(data, args.math_workers or cores, clients)
        print("math pool (no HTTP):", res["math_pool"], flush=True)
        res["math_http"] = bench_math_http(data, args.math_workers, clients)
        print("math http:", res["math_http"], flush=True)
        # again after, on a shared machine the load moves: the ratio uses the mean of both
        res["math_in_thread_after"] = bench_math_in_thread(data)
        print("math in-thread, after:", res["math_in_thread_after"], flush=True)
        rate = statistics.mean(res[k]["items_per_s"] for k in ("math_in_thread", "math_in_thread_after"))
        ideal = cores * rate
        res["math_http"]["fraction_of_cores_x_in_thread"] = res["math_http"]["items_per_s"] / ideal
        res["math_pool"]["fraction_of_cores_x_in_thread"] = res["math_pool"]["items_per_s"] / ideal
        http = res["math_http"]
        spent = (http["server_cpu_us_per_item"] or 0.0) + (http["workers_cpu_us_per_item"] or 0.0)
        res["math_summary"] = {
            "cores": cores,
            "in_thread_items_per_s": rate,
            "cores_x_in_thread": ideal,
            "v1_score_items_per_s": http["items_per_s"],
            "ratio": http["fraction_of_cores_x_in_thread"],
            # the same, against what `cores` independent processes reached together (the
            # hardware's own ceiling: SMT siblings, shared caches, other tenants)
            "parallel_processes_items_per_s": res["math_parallel"]["items_per_s"],
            "parallel_over_cores_x_in_thread": res["math_parallel"]["items_per_s"] / ideal,
            "ratio_to_parallel": http["items_per_s"] / res["math_parallel"]["items_per_s"],
            # load-independent view: verification CPU (in-thread) / all CPU the service spent
            # per item (its server process + its workers); throughput ~ this x cores in use
            "cpu_efficiency": statistics.mean(
                res[k]["cpu_us_per_item"] for k in ("math_in_thread", "math_in_thread_after")
            )
            / spent
            if spent
            else None,
            "ratio_goal": 0.8,
            "p50_ms": res["math_http"]["latency_batch1_p50_ms"],
            "p99_ms": res["math_http"]["latency_batch1_p99_ms"],
            "p99_goal_ms": 25.0,
            "in_thread_p99_ms": res["math_in_thread"]["p99_ms"],
        }
        print("math summary:", res["math_summary"], flush=True)
    if args.only in (None, "sandbox"):
        res["process_refs"] = bench_process_refs()
        print("process refs:", res["process_refs"], flush=True)
        from rewardplane.serve.execution.sandbox import probe

        isolations = ["namespaces", "rlimits"] if probe("namespaces")[0] else ["rlimits"]
        res["sandbox"] = [bench_sandbox(iso, args.sandbox_runs, cores) for iso in isolations]
        for s in res["sandbox"]:
            print("sandbox:", s, flush=True)
        res["code_assert"] = bench_code_assert(args.code_items, cores)
        print("code assert-style:", res["code_assert"], flush=True)
    if args.only == "judge_engine":  # a GPU section: never part of the default CPU run
        res["judge_engine"] = bench_judge_engine(args)
    if args.only in (None, "judge"):
        res["judge_fake_engine"] = bench_judge_fake(args.judge_items, 16, 0.05)
        print("judge (fake engine):", res["judge_fake_engine"], flush=True)
    res["machine"]["load_avg_at_end"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
