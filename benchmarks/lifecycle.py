"""Offload / onload of a reward model at copy-engine speed: times, bandwidth, memory left (issue 27).

For each model (random init from its config, bf16, a sequence-classification reward model for
the LLM shapes; the `clip-vit-h-14` CLIP scorer for CLIP, eager and with its CUDA graphs):

- offload time (weights → the kept pinned host buffers, device memory back to the driver), the
  first cycle apart (it allocates and page-locks the host buffers once);
- onload time and host→device GB/s (one bulk copy per dtype group on a side stream), and
  onload-to-ready: onload + what the scorer needs before it can score (CLIP: re-captured CUDA
  graphs) + the first scored batch, synchronised;
- GPU memory after offload, read with NVML (the process's own use when NVML shows processes,
  else the device's used memory: the benchmark is alone on the GPU), and torch's reserved bytes;
- the same bytes copied with a plain pinned `copy_` (`torch.empty(pin_memory=True)` → a device
  buffer, non_blocking, CUDA events) in the same run, as the bandwidth ceiling; onload GB/s as a
  fraction of it is the goal's number (≥ 0.8);
- that every cycle's scores equal the first ones bit for bit.

    PYTHONPATH=src python3 benchmarks/lifecycle.py --out lifecycle.json                  # CUDA
    PYTHONPATH=src python3 benchmarks/lifecycle.py --smoke --out /tmp/lifecycle.json     # CPU, tiny
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from rewardplane.models.offload import WeightOffloader, device_memory

GiB = 1024**3

CLIP_SHAPES = {"clip-vit-h-14", "clip-vit-l-14", "tiny-clip"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--models", default="qwen2-0.5b,llama-3.2-1b,llama-3.1-8b,clip-vit-h-14,clip-vit-h-14+graphs"
    )
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--cycles", type=int, default=5, help="offload/onload cycles per model")
    p.add_argument("--copy-reps", type=int, default=5, help="repetitions of the plain pinned copy")
    p.add_argument("--clip-batch", type=int, default=64, help="CLIP max_batch_size (graph buckets)")
    p.add_argument("--smoke", action="store_true", help="CPU: tiny-llama and tiny-clip, 2 cycles")
    p.add_argument("--out", type=Path, required=True, help="JSON results")
    args = p.parse_args(argv)
    if args.smoke:
        args.models, args.dtype, args.cycles, args.copy_reps, args.clip_batch = (
            "tiny-llama,tiny-clip",
            "fp32",
            2,
            2,
            4,
        )
    args.models = [m for m in args.models.split(",") if m]
    return args


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_used() -> dict[str, Any]:
    """NVML's view (process, else device) and torch's, in bytes."""
    gc.collect()
    mem = device_memory()
    if mem.get("device") == "cpu":
        return {}
    used = mem.get("nvml_process_used_bytes", mem.get("nvml_device_used_bytes"))
    return {
        "nvml_used_bytes": used,
        "nvml_source": "process" if "nvml_process_used_bytes" in mem else "device",
        "torch_reserved_bytes": mem["torch_reserved_bytes"],
        "torch_allocated_bytes": mem["torch_allocated_bytes"],
        **({"nvml_error": mem["nvml_error"]} if "nvml_error" in mem else {}),
    }


def pinned_copy_gbps(nbytes: int, reps: int) -> dict[str, Any]:
    """The ceiling: a plain pinned host buffer copied to a device buffer of the same size."""
    if not torch.cuda.is_available():
        return {}
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(reps + 1):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1000.0)
    times = times[1:]  # the first copy pays lazy initialisation
    del src, dst
    gc.collect()
    torch.cuda.empty_cache()
    return {
        "bytes": nbytes,
        "median_seconds": statistics.median(times),
        "median_gbps": nbytes / statistics.median(times) / 1e9,
        "best_gbps": nbytes / min(times) / 1e9,
    }


# --- the models -----------------------------------------------------------------------------------


class LlmCase:
    """A sequence-classification reward model of an LLM shape; ready = one scored batch."""

    def __init__(self, name: str, dtype: torch.dtype, device: str) -> None:
        from transformers import AutoModelForSequenceClassification

        from rewardplane.models.tiny import tiny_config  # the published shapes (random init)

        config = tiny_config(name, num_labels=1, pad_token_id=0)
        torch.manual_seed(0)
        with torch.device(device):
            self.model = AutoModelForSequenceClassification.from_config(config, dtype=dtype).eval()
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(1, config.vocab_size, (8, 256), generator=g).to(device)
        self.offloader = WeightOffloader(self.model)

    def score(self) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(input_ids=self.ids).logits.float()
        sync()
        return out.cpu()

    def offload(self):
        return self.offloader.offload()

    def onload(self):
        return self.offloader.onload()

    def after_onload(self) -> None:
        pass

    @property
    def nbytes(self) -> int:
        return self.offloader.nbytes

    def close(self) -> None:
        self.offloader.close()


class ClipCase:
    """The `clip` scorer itself (its weights through serve.weights' ModelWeights, so CUDA
    graphs are dropped and re-captured exactly as the service does); ready = one scored batch."""

    def __init__(self, name: str, dtype: str, device: str, batch: int) -> None:
        import io

        from PIL import Image

        from rewardplane.serve.protocol import ScoreItem
        from rewardplane.serve.scorers.clip import ClipScorer
        from rewardplane.serve.weights import ModelWeights

        shape, _, variant = name.partition("+")
        options = {"cuda_graphs": True, "decode": "host"} if variant == "graphs" else {"decode": "host"}
        self.scorer = ClipScorer(
            name, shape=shape, dtype=dtype, device=device, options=options, max_batch_size=batch
        )
        self.scorer.load()
        self.weights = ModelWeights(self.scorer)
        items = []
        for k in range(batch):
            buf = io.BytesIO()
            Image.new("RGB", (256, 256), (k * 3 % 255, 40, 200 - k)).save(buf, format="PNG")
            items.append(ScoreItem(f"i{k}", f"a photo number {k % 5}", "", buf.getvalue()))
        self.items = items
        self.last_onload = None

    def score(self) -> torch.Tensor:
        out = self.scorer.score_batch(self.items)
        sync()
        return torch.tensor(out, dtype=torch.float64)

    def offload(self):
        return self.weights.offload()

    def onload(self):
        return self.weights.onload()  # includes re-capturing the CUDA graphs

    def after_onload(self) -> None:
        pass

    @property
    def nbytes(self) -> int:
        return self.weights.bytes_total()

    def close(self) -> None:
        self.weights._weights().close()


def _as_dict(t: Any) -> dict[str, Any]:
    return t if isinstance(t, dict) else t.as_dict()


def run_model(name: str, args, device: str) -> dict[str, Any]:
    started = time.perf_counter()
    if name.partition("+")[0] in CLIP_SHAPES:
        case: Any = ClipCase(name, args.dtype, device, args.clip_batch)
    else:
        case = LlmCase(name, DTYPES[args.dtype], device)
    build_s = time.perf_counter() - started
    first = case.score()
    resident = gpu_used()
    params = sum(
        p.numel() for p in (case.model if hasattr(case, "model") else case.scorer.model).parameters()
    )
    cycles = []
    for k in range(args.cycles):
        t0 = time.perf_counter()
        off = _as_dict(case.offload())
        offload_s = time.perf_counter() - t0
        after_offload = gpu_used()
        t0 = time.perf_counter()
        on = _as_dict(case.onload())
        onload_s = time.perf_counter() - t0
        scores = case.score()
        ready_s = time.perf_counter() - t0
        cycles.append(
            {
                "cycle": k,
                "offload_seconds": offload_s,
                "offload_copy_gbps": off.get("gbps"),
                "offload_pin_seconds": off.get("pin_seconds"),
                "memory_after_offload": after_offload,
                "onload_seconds": onload_s,
                "onload_copy_seconds": on.get("copy_seconds"),
                "onload_copy_gbps": on.get("gbps"),
                "onload_to_ready_seconds": ready_s,
                "bit_exact": bool(torch.equal(scores, first)),
            }
        )
        print(
            f"{name} cycle {k}: offload {offload_s * 1e3:.1f} ms, onload {onload_s * 1e3:.1f} ms "
            f"({on.get('gbps', 0):.1f} GB/s copy), ready {ready_s * 1e3:.1f} ms, "
            f"after offload {after_offload.get('nvml_used_bytes', 0) / GiB:.2f} GiB, "
            f"bit-exact {cycles[-1]['bit_exact']}",
            flush=True,
        )
    ceiling = pinned_copy_gbps(case.nbytes, args.copy_reps)
    steady = cycles[1:] or cycles  # the first offload also allocates and pins the host buffers
    onload_gbps = statistics.median(c["onload_copy_gbps"] or 0.0 for c in steady)
    result = {
        "model": name,
        "dtype": args.dtype,
        "parameters": params,
        "bytes": case.nbytes,
        "build_seconds": build_s,
        "memory_resident": resident,
        "cycles": cycles,
        "pinned_copy": ceiling,
        "summary": {
            "first_offload_seconds": cycles[0]["offload_seconds"],
            "first_offload_pin_seconds": cycles[0]["offload_pin_seconds"],
            "offload_seconds_median": statistics.median(c["offload_seconds"] for c in steady),
            "onload_seconds_median": statistics.median(c["onload_seconds"] for c in steady),
            "onload_to_ready_seconds_median": statistics.median(c["onload_to_ready_seconds"] for c in steady),
            "onload_copy_gbps_median": onload_gbps,
            "pinned_copy_gbps_median": ceiling.get("median_gbps"),
            "onload_vs_pinned_copy": onload_gbps / ceiling["median_gbps"] if ceiling else None,
            "nvml_after_offload_bytes_max": max(
                (c["memory_after_offload"].get("nvml_used_bytes") or 0 for c in cycles), default=None
            ),
            "bit_exact_all_cycles": all(c["bit_exact"] for c in cycles),
        },
    }
    case.close()
    del case
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "device": device,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_bytes=props.total_memory, cuda=torch.version.cuda)
        torch.zeros(1, device="cuda")  # the context, before the baseline
        env["memory_context_only"] = gpu_used()
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    results = []
    for name in args.models:
        results.append(run_model(name, args, device))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"environment": env, "models": results}, indent=2))
    print(
        "\n| model | GiB | offload s | onload s | onload GB/s | pinned copy GB/s | ratio | ready s | GiB after offload | bit-exact |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["summary"]
        ratio = f"{s['onload_vs_pinned_copy']:.2f}" if s["onload_vs_pinned_copy"] else "-"
        pinned = f"{s['pinned_copy_gbps_median']:.1f}" if s["pinned_copy_gbps_median"] else "-"
        after = s["nvml_after_offload_bytes_max"]
        print(
            f"| {r['model']} | {r['bytes'] / GiB:.2f} | {s['offload_seconds_median']:.3f} "
            f"| {s['onload_seconds_median']:.3f} | {s['onload_copy_gbps_median']:.1f} | {pinned} | {ratio} "
            f"| {s['onload_to_ready_seconds_median']:.3f} | {after / GiB if after else 0:.2f} "
            f"| {s['bit_exact_all_cycles']} |"
        )
    print(f"\nwrote {args.out}")
    return 0 if all(r["summary"]["bit_exact_all_cycles"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
