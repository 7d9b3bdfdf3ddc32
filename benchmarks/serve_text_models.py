"""benchmarks/serve_text.py's in-process variants (a, b, c, c+, cb, cb+): the model at a named shape,
padded and packed passes over the corpus, timed."""

from __future__ import annotations

import math
import time

PEAK_FLOPS = 790e12
SHAPES = {
    "qwen2-0.5b": "qwen2-0.5b",
    "llama-3.2-1b": "llama-3.2-1b",
    "llama-3.1-8b": "llama-3.1-8b",
    "tiny": "tiny-llama",
    "smollm2": None,  # a checkpoint directory (--smollm2), parity only
}


def build_model(shape: str, vocab: int, pad: int, device: str, attn: str):
    import torch
    from transformers import AutoModelForSequenceClassification

    from rewardplane.models.tiny import tiny_config

    config = tiny_config(SHAPES[shape], num_labels=1, pad_token_id=pad)
    config.vocab_size = max(config.vocab_size, vocab)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForSequenceClassification.from_config(config, dtype=dtype, attn_implementation=attn)
    return model.eval()


def non_embedding_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)


def timed(fn, warm, device: str, repeats: int) -> float:
    """Best of `repeats` timed passes (CUDA events on a GPU) after one warm-up on a slice."""
    import torch

    warm()
    best = math.inf
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
    return best


def padded_logits(model, chunk, pad: int, device: str):
    """One right-padded forward of the sequences in `chunk`: each row's score (HF's own pooling)."""
    import torch

    width = max(map(len, chunk))
    ids = torch.full((len(chunk), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(chunk):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
    return model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, 0].float().cpu()


def padded_pass(model, seqs, pad: int, device: str, batch: int = 32):
    import torch

    def run():
        with torch.inference_mode():
            for start in range(0, len(seqs), batch):
                padded_logits(model, seqs[start : start + batch], pad, device)

    return run


def packed_pass(model, seqs, budget: int, share: bool):
    import torch

    from rewardplane.models.packed_scoring import packed_scores, plan_packed

    chunks, current, used = [], [], 0
    for s in seqs:  # arrival order; groups stay together
        if current and used + len(s) > budget:
            chunks.append(current)
            current, used = [], 0
        current.append(s)
        used += len(s)
    chunks.append(current)
    plans = [plan_packed(c, share_prefixes=share, min_prefix=16) for c in chunks]

    def run():
        with torch.inference_mode():
            for plan in plans:
                packed_scores(model.base_model, model.score, plan).float().cpu()

    return run, sum(p.saved_tokens for p in plans)
