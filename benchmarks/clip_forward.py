"""The CLIP scorer's model ceiling: one image+text forward per batch, no service, no decoding.

`benchmarks/serve.py` measures the service; this measures what the GPU can do with the same
model and batch sizes when nothing else is in the way, so the service's gap has a known floor.
For each batch size it times `ClipScorer.encode_images` + `encode_text` on preprocessed pixels
already on the device (random, never zeros) with CUDA events after warm-up (median of `--reps`,
rotating among 4 input sets so no run reads a cached input), eager and with every transformer
block under `torch.compile(dynamic=True)` (the training loop's `compile_blocks`), and with the
scorer's `cuda_graphs` option (one graph replay per tower at the bucket size). It also measures the
bf16 matmul ceiling (8192³ on random data) so MFU has a measured denominator beside the 790
TFLOP/s used elsewhere.

    PYTHONPATH=src python3 benchmarks/clip_forward.py --out clip_forward.json        # CUDA
    PYTHONPATH=src python3 benchmarks/clip_forward.py --smoke                        # CPU, tiny-clip
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from rewardplane.serve.scorers.clip import ClipScorer
from rewardplane.train.loop import compile_blocks
from serve import FLOP_PER_PAIR, PEAK_FLOPS  # benchmarks/serve.py: the same FLOP counts and peak


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU: tiny-clip fp32, batch 2/4, few reps")
    p.add_argument("--shapes", default="clip-vit-h-14,clip-vit-l-14")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--batches", default="16,32,64,128")
    p.add_argument("--variants", default="eager,graphs,compile")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.smoke:
        args.shapes, args.dtype, args.batches, args.reps = "tiny-clip", "fp32", "2,4", 3
        args.variants = "eager,compile"  # graphs need CUDA
    args.shapes = args.shapes.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.variants = args.variants.split(",")
    return args


def timed(fn, reps: int, device: str) -> float:
    """Median seconds of `fn()` over `reps` runs (CUDA events on the GPU, a host clock on the CPU)."""
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_ceiling(device: str) -> float | None:
    if device != "cuda":
        return None
    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    return 2 * n**3 / timed(lambda: a @ b, 20, device)


def measure(shape: str, variant: str, args, device: str) -> list[dict]:
    options = {"cuda_graphs": True} if variant == "graphs" else {}
    scorer = ClipScorer(
        "bench",
        shape=shape,
        dtype=args.dtype,
        device=device,
        options=options,
        max_batch_size=max(args.batches),
    )
    t0 = time.perf_counter()
    scorer.load()
    if variant == "compile":
        compile_blocks(scorer.model)
    dtype = scorer.model.dtype
    size = scorer.preprocess.size
    texts = [f"a photo of item {i}" for i in range(8)]
    rows = []
    for batch in args.batches:
        inputs = [torch.randn(batch, 3, size, size, device=device, dtype=dtype) for _ in range(4)]
        turn = itertools.count()

        def forward(inputs: list = inputs, turn=turn) -> None:
            with torch.inference_mode():
                img = scorer.encode_images(inputs[next(turn) % 4])
                txt = scorer.encode_text(texts)
                torch.nn.functional.cosine_similarity(img[:, None], txt[None], dim=-1)

        warm = time.perf_counter()
        for _ in range(3):
            forward()
        if device == "cuda":
            torch.cuda.synchronize()
        warm_s = time.perf_counter() - warm
        seconds = timed(forward, args.reps, device)
        pairs_per_s = batch / seconds
        rows.append(
            {
                "shape": shape,
                "variant": variant,
                "dtype": args.dtype,
                "batch": batch,
                "ms": seconds * 1000,
                "pairs_per_s": pairs_per_s,
                "mfu": pairs_per_s * FLOP_PER_PAIR.get(shape, 0.0) / PEAK_FLOPS,  # tiny-clip: none
                "warmup_s": warm_s,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    rows[0]["load_s"] = time.perf_counter() - t0
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        print("no CUDA: use --smoke for the CPU configuration", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    ceiling = matmul_ceiling(device)
    rows = []
    for shape in args.shapes:
        for variant in args.variants:
            rows += measure(shape, variant, args, device)
            if device == "cuda":
                torch.cuda.empty_cache()  # the last variant's model is gone with its frame
    import transformers

    result = {
        "meta": {
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "peak_flops": PEAK_FLOPS,
            "measured_bf16_matmul_flops": ceiling,
            "text_prompts_per_batch": 8,
        },
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(f"bf16 matmul 8192^3: {ceiling / 1e12:.0f} TFLOP/s" if ceiling else "cpu: no matmul ceiling")
    print("| shape | variant | batch | ms | pairs/s | MFU |")
    for r in rows:
        print(
            f"| {r['shape']} | {r['variant']} | {r['batch']} | {r['ms']:.2f} | "
            f"{r['pairs_per_s']:.0f} | {100 * r['mfu']:.1f}% |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
