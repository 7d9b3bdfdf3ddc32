"""DPO training throughput and peak memory: rewardplane (live / precomputed reference) vs TRL's DPOTrainer.

Every mode trains the same random-initialised policy shape on the same token ids (random
prompts and completions of varying length, fixed seed) with AdamW, a constant learning rate,
grad-norm clipping at 1.0 and, on CUDA, bf16 autocast over fp32 master weights. Each mode runs
in its own subprocess so its peak memory is its own. Throughput counts real (non-pad) tokens of
chosen + rejected sequences over the timed steps, after warm-up steps.

    # H200 (full configuration, ~3 min):
    PYTHONPATH=src python3 benchmarks/train_dpo.py --out train_dpo_h200.json
    # CPU smoke (tiny model, seconds):
    PYTHONPATH=src python3 benchmarks/train_dpo.py --smoke --out train_dpo_cpu.json
    # LoRA adapters (r=16 on every linear layer) against a pinned snapshot reference:
    PYTHONPATH=src python3 benchmarks/train_dpo.py --lora 16 --reference snapshot \
        --modes rewardplane_live,rewardplane_precomputed --out lora_snapshot.json

With `--lora R` the policy trains adapters on a frozen base (alpha = 2R). `--reference
initial_policy` (default) makes the base itself the reference, reached with adapters disabled
(TRL: `peft_config` and no `ref_model`); `--reference snapshot` writes the policy's starting
weights as a pinned local Hugging Face snapshot, which the policy starts from and the reference
is loaded from (an SFT -> DPO run), so the reference is a second copy that precompute can free.

TRL runs only where `trl` (and `datasets`) import; otherwise its entry records why it was skipped.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("rewardplane_live", "rewardplane_precomputed", "trl_live")


def make_token_pairs(args) -> list[dict]:
    """Prompt / chosen / rejected token ids, lengths uniform in [L/2, L]."""
    rng = random.Random(args.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(16, args.vocab) for _ in range(n)]

    rows = []
    for _ in range(args.pairs):
        prompt = ids(rng.randint(args.prompt_len // 2, args.prompt_len))
        rows.append(
            {
                "prompt_ids": prompt,
                "chosen_ids": ids(rng.randint(args.completion_len // 2, args.completion_len)),
                "rejected_ids": ids(rng.randint(args.completion_len // 2, args.completion_len)),
            }
        )
    return rows


def device_and_memory():
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return torch.device("cuda")
    return torch.device("cpu")


def peak_memory() -> dict:
    import torch

    if not torch.cuda.is_available():
        import resource

        return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
    }


SNAPSHOT_REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_snapshot(args, directory: Path) -> Path:
    """The benchmark policy's starting weights as a pinned local snapshot (HF's local_dir layout)."""
    import torch
    from huggingface_hub._local_folder import write_download_metadata
    from transformers import AutoModelForCausalLM

    from rewardplane.core.hashing import sha256_file
    from rewardplane.models.reference import git_blob_sha1
    from rewardplane.models.tiny import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        tiny_config(args.model, vocab_size=args.vocab), dtype=torch.float32
    )
    model.save_pretrained(directory)
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        etag = git_blob_sha1(path) if path.suffix == ".json" else sha256_file(path)
        write_download_metadata(directory, path.name, SNAPSHOT_REVISION, etag)
    return directory


def model_overrides(args, run_dir: Path) -> list[str]:
    """The `model.` / `dpo.reference.` overrides for the policy source, adapters and reference."""
    if args.reference == "snapshot":
        snapshot = write_snapshot(args, run_dir / "snapshot")
        source = [
            "model.tiny=null",
            f"model.path={snapshot}",
            "dpo.reference.source=snapshot",
            "dpo.reference.repo=bench/policy",
            f"dpo.reference.revision={SNAPSHOT_REVISION}",
            f"dpo.reference.path={snapshot}",
        ]
    else:
        source = [f"model.tiny={args.model}", f"model.config_overrides.vocab_size={args.vocab}"]
        if args.lora:
            source.append("dpo.reference.source=initial_policy")
    if args.lora:
        source += [f"model.lora.r={args.lora}", f"model.lora.alpha={2 * args.lora}"]
    return source


def run_rewardplane(args, *, precompute: bool) -> dict:
    import torch

    from rewardplane.data.builtin_tokenizer import build_tokenizer
    from rewardplane.data.records import TokenizedBranch, TokenizedPair
    from rewardplane.objectives.base import TrainPairs
    from rewardplane.train.config import load_dpo_config
    from rewardplane.train.loop import Trainer
    from rewardplane.train.recipe import build_objective

    device = device_and_memory()
    rows = make_token_pairs(args)

    def branch(prompt: list[int], completion: list[int]) -> TokenizedBranch:
        ids = prompt + completion
        return TokenizedBranch(ids, [0] * len(prompt) + [1] * len(completion), len(ids) - 1)

    pairs = [
        TokenizedPair(
            f"b{i}", branch(r["prompt_ids"], r["chosen_ids"]), branch(r["prompt_ids"], r["rejected_ids"])
        )
        for i, r in enumerate(rows)
    ]
    tokenizer = build_tokenizer(["benchmark corpus"], vocab_size=300)
    run_dir = Path(tempfile.mkdtemp(prefix="rk-dpo-bench-"))
    cfg = load_dpo_config(
        None,
        [
            *model_overrides(args, run_dir),
            f"data.max_length={args.prompt_len + args.completion_len}",
            f"run.global_batch_pairs={args.batch_pairs}",
            f"run.grad_accum={args.grad_accum}",
            f"run.max_steps={args.warmup + args.steps}",
            f"run.layout={args.layout}",
            f"run.run_dir={run_dir}",
            "run.progress=false",
            f"optim.lr={args.lr}",
            "optim.schedule=constant",
            "optim.max_grad_norm=1.0",
            f"dpo.beta={args.beta}",
            f"dpo.precompute_reference={str(precompute).lower()}",
            f"model.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
            f"dpo.reference_dtype={args.reference_dtype}",
        ],
    )
    objective = build_objective(cfg, TrainPairs(pairs, "benchmark"))
    started = time.perf_counter()
    # builds the policy, then readies the reference (live: moves it to the device; precomputed:
    # scores every pair once and frees it) before the policy moves there
    trainer = Trainer(cfg, objective, train_pairs=pairs, tokenizer=tokenizer, train_pairs_sha256="benchmark")
    if device.type == "cuda":
        torch.cuda.synchronize()
    prepare_s = time.perf_counter() - started
    prepare = peak_memory()  # model build and the reference pass
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step_tokens_per_s, losses = [], []
    for step in range(args.warmup + args.steps):
        metrics = trainer.train_step()
        losses.append(metrics["loss"])
        if step >= args.warmup:
            step_tokens_per_s.append(metrics["tokens_per_s"])
    train = peak_memory()
    return {
        "tokens_per_s": statistics.median(step_tokens_per_s),
        "build_and_prepare_s": prepare_s,
        "losses": losses,
        **{key: max(prepare[key], train[key]) for key in train},  # the whole run's peak
        **{f"prepare_{key}": value for key, value in prepare.items()},
        **{f"train_{key}": value for key, value in train.items()},
    }


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from rewardplane.data.builtin_tokenizer import build_tokenizer
    from rewardplane.models.tiny import tiny_config

    device = device_and_memory()
    torch.manual_seed(0)
    config = tiny_config(args.model, vocab_size=args.vocab)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tokenizer = build_tokenizer(["benchmark corpus"], vocab_size=300)
    dataset = Dataset.from_list(make_token_pairs(args))

    class PreTokenized(DPOTrainer):
        """The rows already hold prompt_ids / chosen_ids / rejected_ids: skip TRL's text tokenisation."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[tuple[float, int]] = []
            self.trainer = None

        def on_step_end(self, _args, state, control, **kwargs):
            if device.type == "cuda":
                torch.cuda.synchronize()
            self.marks.append((time.perf_counter(), int(getattr(self.trainer, "_total_train_tokens", 0))))

    out_dir = tempfile.mkdtemp(prefix="trl-dpo-bench-")
    trl_args = DPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=args.batch_pairs // args.grad_accum,
        gradient_accumulation_steps=args.grad_accum,
        max_steps=args.warmup + args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        bf16=device.type == "cuda",
        use_cpu=device.type != "cuda",
        beta=args.beta,
        max_length=None,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_dropout=True,
        # TRL 1.16 turns gradient checkpointing on by default; both trainers get the same setting
        gradient_checkpointing=args.gradient_checkpointing,
    )
    timer = Timer()
    if args.lora:  # adapters on the frozen base, which TRL then uses as the reference (no ref_model)
        from peft import LoraConfig

        adapters = {
            "peft_config": LoraConfig(
                r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        }  # fmt: skip
    else:  # TRL 1.x rebuilds a missing ref_model from a hub path, which we lack
        adapters = {"ref_model": copy.deepcopy(model)}
    trainer = PreTokenized(
        model=model,
        args=trl_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        **adapters,
    )
    timer.trainer = trainer
    trainer.train()
    timed = timer.marks[args.warmup - 1 :] if args.warmup else [(timer.marks[0][0], 0), *timer.marks]
    seconds = timed[-1][0] - timed[0][0]
    tokens = timed[-1][1] - timed[0][1]
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {"tokens_per_s": tokens / seconds if seconds > 0 else None, "losses": losses, **peak_memory()}


def worker(args) -> dict:
    import torch

    torch.manual_seed(0)
    if args.worker == "rewardplane_live":
        return run_rewardplane(args, precompute=False)
    if args.worker == "rewardplane_precomputed":
        return run_rewardplane(args, precompute=True)
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        return {"skipped": f"trl not importable: {exc}"}
    return run_trl(args)


def versions() -> dict:
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    try:
        import trl

        info["trl"] = trl.__version__
    except ImportError:
        info["trl"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    else:
        info["cpu_count"] = os.cpu_count()
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model and data (CPU, seconds)")
    parser.add_argument("--model", default=None, help="a rewardplane.models.tiny config (default qwen2-0.5b)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--pairs", type=int, default=None)
    parser.add_argument("--batch-pairs", type=int, default=None)
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--completion-len", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layout", default="packed", choices=["right", "left", "packed"])
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--reference-dtype", choices=["fp32", "bf16"], default="fp32", help="rewardplane modes"
    )
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="on for both trainers (default: off for both)"
    )
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-batches per step (both trainers; divides --batch-pairs)",
    )
    parser.add_argument("--lora", type=int, default=0, help="train LoRA adapters of this rank (alpha = 2 r)")
    parser.add_argument(
        "--reference",
        choices=["initial_policy", "snapshot"],
        default="initial_policy",
        help="snapshot: a pinned local snapshot of the starting weights (rewardplane modes only)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reference == "snapshot" and "trl_live" in args.modes.split(","):
        parser.error("--reference snapshot measures rewardplane's modes only: drop trl_live from --modes")
    full = {
        "model": "qwen2-0.5b",
        "pairs": 96,
        "batch_pairs": 8,
        "prompt_len": 512,
        "completion_len": 256,
        "steps": 8,
    }
    smoke = {
        "model": "tiny-llama",
        "pairs": 24,
        "batch_pairs": 4,
        "prompt_len": 48,
        "completion_len": 24,
        "steps": 3,
    }
    for key, value in (smoke if args.smoke else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    from rewardplane.models.tiny import TINY_CONFIGS

    args.vocab = TINY_CONFIGS[args.model].get("vocab_size", 512)

    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0

    settings = {k: v for k, v in vars(args).items() if k not in ("out", "worker", "modes")}
    results: dict[str, dict] = {}
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    for mode in args.modes.split(","):
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, *passthrough, "--worker", mode],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode == 0 and lines:
            results[mode] = json.loads(lines[-1][len("RESULT ") :])
        else:
            results[mode] = {"error": (proc.stderr or proc.stdout)[-2000:], "returncode": proc.returncode}
        results[mode]["wall_s"] = time.perf_counter() - started
        print(f"{mode}: {json.dumps({k: v for k, v in results[mode].items() if k != 'losses'})}", flush=True)
    memory_key = (
        "peak_allocated_gib"
        if "peak_allocated_gib" in results.get("rewardplane_live", {})
        else "peak_rss_gib"
    )
    summary = {}
    live, pre, trl_live = (results.get(m, {}) for m in MODES)
    if live.get("tokens_per_s") and trl_live.get("tokens_per_s"):
        summary["speedup_vs_trl"] = live["tokens_per_s"] / trl_live["tokens_per_s"]
    if live.get(memory_key) and pre.get(memory_key):
        summary["precomputed_over_live_peak_memory"] = pre[memory_key] / live[memory_key]
    report = {"settings": settings, "versions": versions(), "results": results, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
