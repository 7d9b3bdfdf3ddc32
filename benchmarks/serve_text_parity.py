"""Served = transformers: every item's served score against a plain transformers forward of the
same ids, one sequence at a time, no padding (serve_text.py's `parity` variant).

For one scorer (a named random-init shape through `hf_seqcls`, or a checkpoint directory through
`rm`) and one corpus, bf16 on the GPU:

- `ref`: transformers' `AutoModelForSequenceClassification` forward of each sequence alone (the
  scorer's own model object with SDPA for a shape, `from_pretrained(dir, dtype=bf16)` for a
  directory), at the ids the scorer prepared from the item's text;
- `packed`, `shared`, `padded`: the scorer's `score_prepared` on those ids, padding-free, with
  prefix sharing, and as length-sorted padded buckets;
- `deploy`: the same scorer spec served by `rewardplane serve --deploy` (one worker), the items
  sent as text over HTTP by 16 clients, one group of responses per request;
- `ref_rope_bf16` (shapes) / `packed_rope_bf16` (directories): the cause of issue 38's drift,
  measured: the same forward with RoPE's inverse frequencies rounded to bf16, which is what
  `model.to(torch.bfloat16)` does (and what rewardplane's checkpoint loader did before
  `models.loading.cast_weights`).

Each comparison gives Pearson r, max |diff| and max |diff| / the reference scores' standard
deviation; `ok` is r ≥ 0.998 and max |diff| ≤ 0.2 × std (issue 38's bar).
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

PEARSON_MIN = 0.998
MAX_DIFF_STD = 0.2


def compare(got: list[float], ref: list[float]) -> dict:
    """Pearson r, max |diff|, and both relative to the reference scores' standard deviation."""
    n = len(ref)
    if len(got) != n or n < 3 or any(not isinstance(g, float) or math.isnan(g) for g in got):
        return {"n": n, "ok": False, "error": "missing or non-finite scores"}
    mg, mr = sum(got) / n, sum(ref) / n
    cov = sum((g - mg) * (r - mr) for g, r in zip(got, ref, strict=True))
    sg = math.sqrt(sum((g - mg) ** 2 for g in got))
    sr = math.sqrt(sum((r - mr) ** 2 for r in ref))
    pearson = cov / (sg * sr)
    diff = max(abs(g - r) for g, r in zip(got, ref, strict=True))
    std = statistics.stdev(ref)
    return {
        "n": n,
        "pearson": pearson,
        "max_abs_diff": diff,
        "max_diff_over_std": diff / std,
        "ref_std": std,
        "ok": pearson >= PEARSON_MIN and diff <= MAX_DIFF_STD * std,
    }


def one_at_a_time(model, seqs: list[list[int]], device: str) -> list[float]:
    """A plain transformers forward of each sequence alone: the reference score."""
    import torch

    with torch.inference_mode():
        return [float(model(input_ids=torch.tensor([s], device=device)).logits[0, 0]) for s in seqs]


def rope_to_bf16(model) -> list:
    """Round every RoPE inverse-frequency buffer to bf16 in place (what `.to(bf16)` does); returns
    the originals for `restore_rope`."""
    import torch

    saved = []
    for module in model.modules():
        for name in ("inv_freq", "original_inv_freq"):
            buf = getattr(module, name, None)
            if isinstance(buf, torch.Tensor) and buf.is_floating_point():
                saved.append((module, name, buf))
                module._buffers[name] = buf.to(torch.bfloat16)
    return saved


def restore_rope(saved: list) -> None:
    for module, name, buf in saved:
        module._buffers[name] = buf


def served_in_process(spec, items) -> tuple[dict, dict]:
    """(scores by path, facts) from the scorer in this process, and the reference."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from rewardplane.serve.scorers.registry import build_scorer

    scorer = build_scorer(spec)
    scorer.load()
    device = scorer.device
    ids = scorer.prepare_many(items)
    bad = [i.id for i, x in zip(items, ids, strict=True) if not isinstance(x, list)]
    if bad:
        raise RuntimeError(f"items the scorer refused: {bad[:5]}")
    facts = {"attention": scorer.attention, "tokens": [min(map(len, ids)), max(map(len, ids))], "n": len(ids)}
    out: dict[str, list[float]] = {}
    if spec.path is None:  # a shape: the scorer's own model object is the transformers model
        reference = scorer.model
        reference.set_attn_implementation("sdpa")
    else:
        from rewardplane.models.loading import torch_dtype

        reference = (
            AutoModelForSequenceClassification.from_pretrained(
                spec.path, local_files_only=True, dtype=torch_dtype(spec.dtype)
            )
            .to(device)
            .eval()
        )
    out["ref"] = one_at_a_time(reference, ids, device)
    if spec.path is None:
        saved = rope_to_bf16(reference)
        out["ref_rope_bf16"] = one_at_a_time(reference, ids, device)
        restore_rope(saved)
        if scorer.attention == "varlen":
            scorer.backbone.set_attn_implementation("rk_varlen")
    else:
        del reference
    facts["rope_dtype"] = str(
        next(b for n, b in scorer.model.named_buffers() if n.endswith("inv_freq")).dtype
    )
    start = time.perf_counter()
    scorer.prefix_sharing = False
    out["packed"] = scorer.score_prepared(ids)
    scorer.prefix_sharing = True
    out["shared"] = scorer.score_prepared(ids)
    scorer.prefix_sharing = False
    if spec.path is not None:  # the loader as it was: RoPE frequencies in bf16
        saved = rope_to_bf16(scorer.model)
        out["packed_rope_bf16"] = scorer.score_prepared(ids)
        restore_rope(saved)
    attention = scorer.attention
    scorer.attention = "padded"
    out["padded"] = scorer.score_prepared(ids)
    scorer.attention = attention
    facts["served_seconds"] = time.perf_counter() - start
    del scorer
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out, facts


def served_over_http(
    spec_doc: dict, rows: list[dict], group_of, request_body, clients: int = 16
) -> list[float]:
    """Scores from `rewardplane serve --deploy` (one dedicated worker), in item order."""
    import httpx
    import yaml

    from rewardplane.bench.server import running_server

    groups: dict[int, list[dict]] = {}
    for row in rows:
        groups.setdefault(group_of(row), []).append(row)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "service.yaml"
        gpus = [0] if str(spec_doc.get("device", "")).startswith("cuda") else []
        cfg.write_text(yaml.safe_dump({"mode": "dedicated", "gpus": gpus, "scorers": [spec_doc]}))
        with running_server(["--deploy", str(cfg)], Path(tmp), ready_timeout_s=600) as url:

            async def main() -> dict[str, float]:
                pending = [json.dumps(request_body(g)).encode() for g in groups.values()]
                got: dict[str, float] = {}
                async with httpx.AsyncClient(base_url=url, timeout=600) as client:

                    async def worker():
                        while pending:
                            resp = await client.post(
                                "/v1/score",
                                content=pending.pop(),
                                headers={"content-type": "application/json"},
                            )
                            resp.raise_for_status()
                            for r in resp.json()["results"]:
                                got[r["id"]] = r["scores"].get(spec_doc["name"], float("nan"))

                    await asyncio.gather(*(worker() for _ in range(clients)))
                return got

            got = asyncio.run(main())
    return [float(got.get(r["id"], float("nan"))) for r in rows]


def parity(label: str, spec_doc: dict, rows: list[dict], *, request_body, deploy: bool) -> dict:
    """Every path against the reference for one scorer; `rows` are corpus rows (id, prompt,
    response, group)."""
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec

    items = [ScoreItem(r["id"], r["prompt"], r["response"]) for r in rows]
    scores, facts = served_in_process(ScorerSpec(**spec_doc), items)
    if deploy:
        scores["deploy"] = served_over_http(spec_doc, rows, lambda r: r["group"], request_body)
    ref = scores.pop("ref")
    result = {"model": label, **facts, "paths": {k: compare(v, ref) for k, v in scores.items()}}
    result["ok"] = all(v["ok"] for k, v in result["paths"].items() if "rope_bf16" not in k)
    return result
