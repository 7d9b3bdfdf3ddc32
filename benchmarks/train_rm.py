"""Reward-model training throughput: rewardplane's loop vs TRL's RewardTrainer, same model and data.

Full run (H200): a Qwen2-0.5B-shaped decoder (random init, vocab 151936), branches of up to
1024 tokens, packed rows of 1024, bf16 autocast, AdamW. Reports pairs/s, tokens/s, MFU and
peak memory for both trainers.

MFU = 6 · N · tokens / time / peak, with N the *non-embedding* parameters (a reward model has
no LM head and an embedding lookup costs no FLOPs; attention-score FLOPs are not counted, so
this slightly understates utilisation). Peak = 790 TFLOP/s, the dense bf16 matmul ceiling
measured on the H200 (the datasheet's 989 TFLOP/s is also reported for reference).

    PYTHONPATH=src python3 benchmarks/train_rm.py --out train_rm.json            # CUDA, full
    PYTHONPATH=src python3 benchmarks/train_rm.py --smoke --out train_rm_cpu.json  # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from rewardplane.data.records import TokenizedBranch, TokenizedPair

PEAK_MEASURED = 790e12
PEAK_DATASHEET = 989e12


def make_pairs(n: int, *, max_len: int, vocab: int, seed: int) -> list[TokenizedPair]:
    """Random branches of max_len/4 .. max_len tokens sharing a prompt (ids avoid specials)."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        prompt = [rng.randrange(8, vocab) for _ in range(rng.randint(max_len // 8, max_len // 4))]

        def branch(prompt: list[int] = prompt) -> TokenizedBranch:
            total = rng.randint(max_len // 4, max_len)
            ids = prompt + [rng.randrange(8, vocab) for _ in range(max(1, total - len(prompt)))]
            ids = ids[:max_len]
            return TokenizedBranch(ids, [0] * len(prompt) + [1] * (len(ids) - len(prompt)), len(ids) - 1)

        pairs.append(TokenizedPair(f"b{i}", branch(), branch()))
    return pairs


def non_embedding_params(model: torch.nn.Module) -> int:
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    skip = {id(p) for p in embed.parameters()} if embed is not None else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def result_block(pairs: int, tokens: int, seconds: float, n_params: int, peak_mem: int | None) -> dict:
    flops = 6 * n_params * tokens
    return {
        "pairs_per_s": pairs / seconds,
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "pairs": pairs,
        "tokens": tokens,
        "mfu": flops / seconds / PEAK_MEASURED,
        "mfu_vs_datasheet": flops / seconds / PEAK_DATASHEET,
        "peak_memory_gib": None if peak_mem is None else peak_mem / 2**30,
    }


def bench_rewardplane(args, pairs, device) -> dict:
    from rewardplane.data.synth import builtin_tokenizer
    from rewardplane.train.config import TrainConfig, from_dict
    from rewardplane.train.distributed import DistInfo
    from rewardplane.train.loop import Trainer
    from rewardplane.train.recipe import build_objective

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = from_dict(
            TrainConfig,
            {
                "model": {
                    "tiny": args.model,
                    "config_overrides": {"vocab_size": args.vocab},
                    "attn_implementation": args.attn,
                    "gradient_checkpointing": args.gradient_checkpointing,
                },
                "data": {"max_length": args.seq_len},
                "optim": {"lr": 1e-5, "schedule": "constant"},
                "run": {
                    "run_dir": run_dir,
                    "max_steps": args.warmup + args.steps,
                    "global_batch_pairs": args.batch_pairs,
                    "grad_accum": args.grad_accum,
                    "layout": "packed",
                    "precision": "bf16" if device.type == "cuda" else "fp32",
                    "progress": False,
                    "compile": args.compile,
                },
            },
        )
        info = DistInfo(rank=0, world_size=1, local_rank=0, device=device)
        trainer = Trainer(
            cfg,
            build_objective(cfg),
            train_pairs=pairs,
            tokenizer=builtin_tokenizer(),
            train_pairs_sha256="bench",
            info=info,
        )
        n_params = non_embedding_params(trainer.raw_model.backbone) + trainer.raw_model.head.weight.numel()
        for _ in range(args.warmup):
            trainer.train_step()
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        tokens = 0
        efficiency = []
        started = time.perf_counter()
        for _ in range(args.steps):
            m = trainer.train_step()
            tokens += m["tokens"]
            efficiency.append(m["padding_efficiency"])
        sync(device)
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        out = result_block(args.steps * args.batch_pairs, tokens, seconds, n_params, peak)
        out["padding_efficiency"] = sum(efficiency) / len(efficiency)
        out["non_embedding_params"] = n_params
        out["attn_implementation"] = trainer.raw_model.config._attn_implementation
        out["compile"] = args.compile
        out["micro_batch_pairs"] = args.batch_pairs // args.grad_accum
        if args.profile_out:
            out["profile"] = str(profile_steps(trainer, device, args.profile_out))
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return out


def profile_steps(trainer, device: torch.device, path: Path, steps: int = 2) -> Path:
    """Kernel-time table of a few more optimizer steps (where the step time goes)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            trainer.train_step()
        sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=90))
    return path


def bench_trl(args, pairs, device) -> dict:
    """TRL RewardTrainer on the same pre-tokenised pairs (padded batches, its own collator)."""
    try:
        import trl
        from datasets import Dataset
        from transformers import AutoModelForSequenceClassification, TrainerCallback
    except ImportError as exc:
        return {"skipped": f"TRL not importable here ({exc})"}

    from rewardplane.data.synth import builtin_tokenizer
    from rewardplane.models.tiny import tiny_config

    tok = builtin_tokenizer()
    config = tiny_config(args.model, vocab_size=args.vocab, num_labels=1, pad_token_id=tok.pad_token_id)
    # TRL's padded batches need a mask-capable kernel; rk_varlen is rewardplane's packed path.
    config._attn_implementation = "sdpa" if args.attn in ("auto", "rk_varlen") else args.attn
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    n_params = non_embedding_params(model)
    # TRL 1.x takes pre-tokenised preference rows as `chosen_ids` / `rejected_ids`.
    rows = {
        "chosen_ids": [p.chosen.input_ids for p in pairs],
        "rejected_ids": [p.rejected.input_ids for p in pairs],
    }
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, _control, **_kw):
            sync(device)
            if state.global_step == args.warmup:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                marks.append(time.perf_counter())
            elif state.global_step == args.warmup + args.steps:
                marks.append(time.perf_counter())

    per_device = args.batch_pairs // args.grad_accum
    with tempfile.TemporaryDirectory() as out_dir:
        rc = trl.RewardConfig(
            output_dir=out_dir,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=args.grad_accum,
            max_steps=args.warmup + args.steps,
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            bf16=device.type == "cuda",
            max_length=args.seq_len,
            report_to="none",
            save_strategy="no",
            logging_steps=10_000,
            gradient_checkpointing=args.gradient_checkpointing,
            dataloader_num_workers=0,
            use_cpu=device.type != "cuda",
        )
        trainer = trl.RewardTrainer(
            model=model,
            args=rc,
            train_dataset=Dataset.from_dict(rows),
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.train()
    sync(device)
    seconds = marks[1] - marks[0]
    used = pairs[args.warmup * args.batch_pairs : (args.warmup + args.steps) * args.batch_pairs]
    tokens = sum(p.num_tokens for p in used)  # real tokens; TRL also computes on its padding
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    out = result_block(len(used), tokens, seconds, n_params, peak)
    out["trl_version"] = trl.__version__
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny-llama, short sequences, a few steps (CPU)")
    parser.add_argument("--model", default="qwen2-0.5b")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-pairs", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--attn", default="auto", help="auto = rk_varlen on CUDA (TRL gets sdpa then)")
    parser.add_argument("--compile", action="store_true", help="rewardplane: torch.compile each block")
    parser.add_argument("--profile-out", type=Path, help="write a torch.profiler kernel table here")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.vocab, args.seq_len = "tiny-llama", 512, 128
        args.batch_pairs, args.grad_accum, args.steps, args.warmup = 8, 2, 3, 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    pairs = make_pairs((args.warmup + args.steps) * args.batch_pairs, max_len=args.seq_len, vocab=512, seed=0)
    report = {
        "benchmark": "train_rm",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "peak_flops_measured": PEAK_MEASURED,
        "rewardplane": bench_rewardplane(args, pairs, device),
    }
    import transformers

    report["transformers"] = transformers.__version__
    report["trl"] = {"skipped": "--skip-trl"} if args.skip_trl else bench_trl(args, pairs, device)
    if "pairs_per_s" in report["trl"]:
        report["speedup_pairs_per_s"] = report["rewardplane"]["pairs_per_s"] / report["trl"]["pairs_per_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
