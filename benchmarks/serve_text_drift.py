"""Where bf16 scores move, against fp32 ground truth (issue 38; docs/benchmarks/serve_text.md).

`drift SHAPE...` (a named text shape, `-4l` for its first 4 layers): transformers' own init at
the real config (std 0.02), weights rounded to bf16 once, then every score of the serve_text
corpus (NG groups of GS, env) in fp32 (TF32 off: the ground truth for those bf16 weights) and
in bf16: transformers one sequence at a time (its head in bf16 and in fp32, with and without
reduced-precision reductions), transformers padded batches, and the served scorer's
`score_prepared` (packed, prefix-shared, padded), with the hidden state after every decoder
layer and the final norm at each sequence's last token (relative error per layer).

`checkpoint DIR`: a rewardplane reward-model checkpoint (e.g. smollm2_weights.py's real
weights) through the `rm` scorer's paths and transformers bf16 under each SDPA kernel, against
`from_pretrained(DIR, dtype=float32)`.

    OUT=out python3 benchmarks/serve_text_drift.py drift llama-3.1-8b-4l qwen2-0.5b llama-3.2-1b llama-3.1-8b
    OUT=out python3 benchmarks/serve_text_drift.py checkpoint /tmp/smollm2
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
OUT = Path(os.environ.get("OUT", "/tmp/diag_out"))
OUT.mkdir(parents=True, exist_ok=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
RESULTS: dict = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu"}


def log(*a):
    print(*a, flush=True)


def compare(x, ref) -> dict:
    x = torch.as_tensor(x, dtype=torch.float64)
    r = torch.as_tensor(ref, dtype=torch.float64)
    d = (x - r).abs()
    std = float(r.std())
    return {
        "pearson": float(torch.corrcoef(torch.stack([x, r]))[0, 1]),
        "max_abs": float(d.max()),
        "max_over_std": float(d.max()) / std,
        "rms_over_std": float(d.pow(2).mean().sqrt()) / std,
        "ref_std": std,
    }


class Taps:
    """Last-token hidden states after each decoder layer and the final norm."""

    def __init__(self, base, positions=None):
        self.base, self.positions, self.rows, self.handles = base, positions, [], []
        mods = list(base.layers) + [base.norm]
        for k, m in enumerate(mods):
            self.handles.append(m.register_forward_hook(self._hook(k)))
        self.n = len(mods)
        self.current: list = [None] * self.n

    def _hook(self, k):
        def f(_m, _i, out):
            h = out[0] if isinstance(out, tuple) else out
            if self.positions is None:
                self.current[k] = h[0, -1].float().cpu()
            else:
                self.current[k] = h[0].index_select(0, self.positions).float().cpu()

        return f

    def take(self):
        got, self.current = self.current, [None] * self.n
        return got

    def close(self):
        for h in self.handles:
            h.remove()


def per_seq(model, seqs, taps=None):
    scores, layers = [], []
    with torch.inference_mode():
        for s in seqs:
            logit = model(input_ids=torch.tensor([s], device=DEV)).logits[0, 0]
            scores.append(float(logit))
            if taps is not None:
                layers.append(torch.stack(taps.take()))  # [L+1, H]
    return scores, (torch.stack(layers) if layers else None)  # [N, L+1, H]


def padded_batches(model, seqs, pad, batch=8):
    import serve_text_models

    with torch.inference_mode():
        return [
            x
            for k in range(0, len(seqs), batch)
            for x in serve_text_models.padded_logits(model, seqs[k : k + batch], pad, DEV).tolist()
        ]


def layer_errors(h, ref):
    """[L+1] median and max over items of |h - ref| / |ref| at the last token."""
    rel = (h - ref).norm(dim=-1) / ref.norm(dim=-1)  # [N, L+1]
    return rel.median(0).values.tolist(), rel.max(0).values.tolist()


def drift(shape: str, n_groups: int, group_size: int) -> dict:
    from transformers import AutoModelForSequenceClassification

    import serve_text_corpus
    from rewardplane.models import tiny
    from rewardplane.models.packed_scoring import packed_scores, plan_packed
    from rewardplane.serve.scorers import text

    base_shape = shape
    if shape.endswith("-4l"):
        base_shape = shape[: -len("-4l")]
        tiny.TINY_CONFIGS[shape] = {**tiny.TINY_CONFIGS[base_shape], "num_hidden_layers": 4}
        text.SeqClsScorer.shapes = (*text.TEXT_SHAPES, shape)
    if DEV == "cpu":  # smoke: a small model of the family
        tiny.TINY_CONFIGS[shape] = {**tiny.TINY_CONFIGS[base_shape], "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "head_dim": 16}  # fmt: skip
        text.SeqClsScorer.shapes = (*text.TEXT_SHAPES, shape)
    tok = serve_text_corpus.build_tokenizer()
    rows = serve_text_corpus.build_corpus(tok, n_groups, group_size, seed=0)
    seqs = [r["ids"] for r in rows]
    pad = tok.pad_token_id
    res: dict = {"shape": shape, "n": len(seqs), "tokens": [min(map(len, seqs)), max(map(len, seqs))]}
    t0 = time.time()
    config = tiny.tiny_config(shape, num_labels=1, pad_token_id=pad)
    config.vocab_size = max(config.vocab_size, len(tok))
    torch.manual_seed(0)
    with torch.device(DEV):
        m32 = AutoModelForSequenceClassification.from_config(
            config, dtype=torch.float32, attn_implementation="sdpa"
        )
    m32.eval()
    base = m32.model
    res["init_std"] = {
        "embed": float(base.embed_tokens.weight.std()),
        "q_proj0": float(base.layers[0].self_attn.q_proj.weight.std()),
        "down_proj0": float(base.layers[0].mlp.down_proj.weight.std()),
        "score": float(m32.score.weight.std()),
        "initializer_range": config.initializer_range,
    }
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res["fp32_orig"], _ = per_seq(m32, seqs)
    with torch.no_grad():
        for p in m32.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    taps = Taps(base)
    res["fp32"], h32 = per_seq(m32, seqs, taps)
    taps.close()
    del taps
    res["inv_freq_dtype_fp32"] = str(base.rotary_emb.inv_freq.dtype)
    sd = {k: v.to(torch.bfloat16) for k, v in m32.state_dict().items()}
    del m32, base
    torch.cuda.empty_cache() if DEV == "cuda" else None
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        scorer = text.SeqClsScorer("rm", shape=shape, dtype="bf16", device=DEV, options={"tokenizer": tmp})
        scorer.load()
    missing = scorer.model.load_state_dict(sd, strict=False)
    res["load_missing"] = [list(missing.missing_keys)[:3], list(missing.unexpected_keys)[:3]]
    del sd
    model = scorer.model
    res["inv_freq_dtype_served"] = str(model.model.rotary_emb.inv_freq.dtype)
    res["attention"] = scorer.attention
    model.set_attn_implementation("sdpa")
    taps = Taps(model.model)
    res["tf_bf16"], h16 = per_seq(model, seqs, taps)
    taps.close()
    # the head in fp32 on the same bf16 final hidden state
    w = model.score.weight.float().cpu()
    res["tf_bf16_fp32head"] = (h16[:, -1] @ w.T).reshape(-1).tolist()
    res["fp32_fp32head_check"] = (h32[:, -1] @ w.T).reshape(-1).tolist()
    if DEV == "cuda":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        res["tf_bf16_norrr"], _ = per_seq(model, seqs)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    res["tf_bf16_padded8"] = padded_batches(model, seqs, pad)
    import rewardplane.models.attention  # noqa: F401

    model.model.set_attn_implementation("rk_varlen")
    res["served_packed"] = scorer.score_prepared([list(s) for s in seqs])
    plan = plan_packed(seqs)
    taps = Taps(model.model, positions=plan.score_at.to(DEV))
    with torch.inference_mode():
        res["inproc_packed"] = packed_scores(model.model, model.score, plan).float().cpu().tolist()
    hp = torch.stack(taps.take()).transpose(0, 1)  # [N, L+1, H]
    taps.close()
    del taps
    scorer.prefix_sharing = True
    res["served_shared"] = scorer.score_prepared([list(s) for s in seqs])
    scorer.prefix_sharing = False
    scorer.attention = "padded"
    res["served_padded"] = scorer.score_prepared([list(s) for s in seqs])
    ref = res["fp32"]
    table = {}
    for key in ("fp32_orig", "tf_bf16", "tf_bf16_fp32head", "tf_bf16_norrr", "tf_bf16_padded8", "served_packed",
                "inproc_packed", "served_shared", "served_padded"):  # fmt: skip
        if key in res:
            table[key] = {"vs_fp32": compare(res[key], ref), "vs_tf_bf16": compare(res[key], res["tf_bf16"])}
    res["table"] = table
    med16, max16 = layer_errors(h16, h32)
    res["layers_tf_bf16_vs_fp32"] = {"median": med16, "max": max16}
    if hp is not None:
        medp, maxp = layer_errors(hp, h32)
        res["layers_packed_vs_fp32"] = {"median": medp, "max": maxp}
        medx, maxx = layer_errors(hp, h16)
        res["layers_packed_vs_tf_bf16"] = {"median": medx, "max": maxx}
    # hidden-state norms per layer (how big the residual stream is)
    res["layer_norm_fp32"] = h32.norm(dim=-1).median(0).values.tolist()
    res["seconds"] = time.time() - t0
    del scorer, model
    if DEV == "cuda":
        torch.cuda.empty_cache()
    log(f"== {shape} ({res['n']} seqs, {res['seconds']:.0f}s) std={res['init_std']}")
    for key, v in table.items():
        a, b = v["vs_fp32"], v["vs_tf_bf16"]
        log(f"  {key:18s} vs fp32: r={a['pearson']:.5f} max={a['max_abs']:.3f} ({a['max_over_std']:.3f} std)"
            f" | vs tf_bf16: r={b['pearson']:.5f} max={b['max_abs']:.3f} ({b['max_over_std']:.3f} std)")  # fmt: skip
    fmt = lambda xs: " ".join(f"{x:.3g}" for x in xs)  # noqa: E731
    log("  layer rel err tf_bf16 vs fp32 (median):", fmt(med16))
    if hp is not None:
        log("  layer rel err packed  vs fp32 (median):", fmt(medp))
        log("  layer rel err packed vs tf_bf16 (median):", fmt(medx))
    log("  |h| fp32:", fmt(res["layer_norm_fp32"]))
    return res


def checkpoint(ck: str) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import serve_text_corpus
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.registry import ScorerSpec, build_scorer
    from serve_text_parity import compare, one_at_a_time
    from smollm2_weights import CORPUS

    tok = AutoTokenizer.from_pretrained(ck)
    rows = serve_text_corpus.build_corpus(tok, CORPUS["n_groups"], CORPUS["group_size"], CORPUS["seed"])
    items = [ScoreItem(r["id"], r["prompt"], r["response"]) for r in rows]
    scorer = build_scorer(ScorerSpec(name="rm", kind="rm", path=ck, dtype="bf16", device=DEV))
    scorer.load()
    ids = scorer.prepare_many(items)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {}
    m32 = AutoModelForSequenceClassification.from_pretrained(ck, dtype=torch.float32).to(DEV).eval()
    res["fp32"] = one_at_a_time(m32, ids, DEV)
    del m32
    m16 = AutoModelForSequenceClassification.from_pretrained(ck, dtype=torch.bfloat16).to(DEV).eval()
    res["tf_bf16"] = one_at_a_time(m16, ids, DEV)
    for name, b in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("math", SDPBackend.MATH),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ):
        try:
            with sdpa_kernel([b]):
                res[f"tf_bf16_{name}"] = one_at_a_time(m16, ids, DEV)
        except Exception as exc:
            print(name, "failed", repr(exc)[:200])
    res["packed"] = scorer.score_prepared(ids)
    scorer.prefix_sharing = True
    res["shared"] = scorer.score_prepared(ids)
    scorer.prefix_sharing = False
    scorer.attention = "padded"
    res["padded"] = scorer.score_prepared(ids)
    out = {}
    for k, v in res.items():
        out[k] = {"vs_fp32": compare(v, res["fp32"]), "vs_tf_bf16": compare(v, res["tf_bf16"])}
        a, b = out[k]["vs_fp32"], out[k]["vs_tf_bf16"]
        print(
            f"{k:16s} vs fp32 r={a.get('pearson', 0):.5f} max={a.get('max_abs_diff', 0):.4f} ({a.get('max_diff_over_std', 0):.3f} std) | vs tf_bf16 r={b.get('pearson', 0):.5f} max={b.get('max_abs_diff', 0):.4f} ({b.get('max_diff_over_std', 0):.3f} std)"
        )
    return {"scores": res, "table": out}


def main(argv):
    what = argv[0]
    if what == "drift":
        n_groups, group_size = int(os.environ.get("NG", "8")), int(os.environ.get("GS", "6"))
        RESULTS["drift"] = []
        for shape in argv[1:]:
            try:
                RESULTS["drift"].append(drift(shape, n_groups, group_size))
            except Exception as exc:
                import traceback

                traceback.print_exc()
                RESULTS["drift"].append({"shape": shape, "error": repr(exc)})
            (OUT / "drift.json").write_text(json.dumps(RESULTS))
    elif what == "checkpoint":
        RESULTS["checkpoint"] = checkpoint(argv[1])
        (OUT / "checkpoint.json").write_text(json.dumps(RESULTS))


if __name__ == "__main__":
    main(sys.argv[1:])
