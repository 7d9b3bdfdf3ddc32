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
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

PEAK_FLOPS = 790e12
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "what",
    "out",
    "up",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
    "should",
    "because",
    "each",
    "just",
    "those",
    "people",
    "how",
    "too",
    "little",
    "state",
    "good",
    "very",
    "make",
    "world",
    "still",
    "own",
    "see",
    "men",
    "work",
    "long",
    "get",
    "here",
    "between",
    "both",
    "life",
    "being",
    "under",
    "never",
    "day",
    "same",
    "another",
    "know",
    "while",
    "last",
    "might",
    "us",
    "great",
    "old",
    "year",
    "off",
    "come",
    "since",
    "against",
    "go",
    "came",
    "right",
    "used",
    "take",
    "three",
    "reward",
    "model",
    "policy",
    "answer",
    "question",
    "explain",
    "because",
    "therefore",
    "number",
    "result",
    "step",
    "proof",
    "value",
    "function",
    "code",
    "test",
    "data",
]

SHAPES = {
    "qwen2-0.5b": "qwen2-0.5b",
    "llama-3.2-1b": "llama-3.2-1b",
    "llama-3.1-8b": "llama-3.1-8b",
    "tiny": "tiny-llama",
    "smollm2": None,  # a checkpoint directory (--smollm2), parity only
}


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


def build_tokenizer():
    """The built-in byte-level BPE (rewardplane.data.builtin_tokenizer) trained on the word list."""
    from rewardplane.data.builtin_tokenizer import build_tokenizer as train

    rng = random.Random(1)
    lines = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(2000)]
    return train(lines, vocab_size=2048)


def words_for(tokenizer, n_tokens: int, rng: random.Random) -> str:
    """English-like text of about `n_tokens` tokens."""
    text = " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n_tokens]
    return tokenizer.decode(ids).strip() or "ok"


def build_corpus(tokenizer, n_groups: int, group_size: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups):
        prompt = words_for(tokenizer, int(min(4000, rng.lognormvariate(math.log(150), 0.7))), rng)
        for r in range(group_size):
            target = int(min(4000, rng.lognormvariate(math.log(330), 0.9)))
            response = words_for(tokenizer, target, rng)
            ids = render(tokenizer, prompt, response)
            while len(ids) > 2048:  # clip the whole rendering to the corpus's bound
                response = response[: int(len(response) * 0.8)]
                ids = render(tokenizer, prompt, response)
            while len(ids) < 64:
                response += " " + words_for(tokenizer, 32, rng)
                ids = render(tokenizer, prompt, response)
            rows.append({"group": g, "id": f"g{g}-r{r}", "prompt": prompt, "response": response, "ids": ids})
    return rows


def render(tokenizer, prompt: str, response: str) -> list[int]:
    from rewardplane.data.tokenize import tokenize_branch

    messages = [{"role": "user", "content": prompt}], [{"role": "assistant", "content": response}]
    return list(tokenize_branch(tokenizer, *messages).input_ids)


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


def request_body(group: list[dict]) -> dict:
    """One group of responses as a /v1/score body, through the one wire schema."""
    from rewardplane.serve.protocol import encode_score_request

    items = [{"id": r["id"], "prompt": r["prompt"], "response": r["response"]} for r in group]
    return encode_score_request(items, ["rm"])[0]


def standin_env(tmp: Path) -> dict[str, str]:
    """PYTHONPATH for a server that can build the `host_standin` scorer kind: benchmarks/ (the
    class) and a dist-info directory whose entry point registers it (serve/config.py reads the
    `rewardplane.scorers` group)."""
    from serve_text_standin import KIND

    dist = tmp / "plugins" / "rewardplane_bench_standin-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rewardplane-bench-standin\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        f"[rewardplane.scorers]\n{KIND} = serve_text_standin:StandInScorer\n"
    )
    here = str(Path(__file__).resolve().parent)
    path = [str(tmp / "plugins"), here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(path)}


def safe_label(label: str) -> str:
    return label.replace(":", "-").replace("+", "plus")


def server_env(tmp: Path, args, standin: bool, label: str) -> dict[str, str] | None:
    """The served process's extra environment: the stand-in scorer's plugin path (`standin`)
    and, with --trace or --switch-interval, a sitecustomize that records its forwards' GPU
    timeline or sets its GIL switch interval."""
    env = standin_env(tmp) if standin else {}
    if args.trace is not None or args.switch_interval is not None:
        from serve_text_trace import ENV, SWITCH_ENV, sitecustomize_dir

        site = sitecustomize_dir(tmp / "trace_site")
        here = str(Path(__file__).resolve().parent)
        rest = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), here, rest]))
        if args.trace is not None:
            args.trace.mkdir(parents=True, exist_ok=True)
            env[ENV] = str(args.trace.resolve() / safe_label(label))
        if args.switch_interval is not None:
            env[SWITCH_ENV] = str(args.switch_interval)
    return env or None


def http_variant(
    model_shape: str,
    tok_dir: Path,
    rows: list[dict],
    args,
    share: bool,
    device: str,
    mode: str,
    *,
    standin: bool = False,
    label: str = "d",
    pipeline_depth: int | None = None,
) -> dict:
    """rewardplane serve over HTTP (`--config`, or `--deploy` with one dedicated worker): 16 clients,
    each request one group of 8 (closed loop). `standin`: the scorer's model forward is replaced
    by benchmarks/serve_text_standin.py's, so the figure is the host side's capacity."""
    import httpx
    import yaml

    from rewardplane.bench.server import running_server

    spec = {
        "name": "rm",
        "kind": "host_standin" if standin else "hf_seqcls",
        "shape": model_shape,
        "dtype": "bf16" if device == "cuda" else "fp32",
        "max_batch_size": 4096,
        "max_wait_ms": 2.0,
        # a batch of at most this many tokens: several batches in flight, so admission (tokenising
        # the next requests) overlaps the forward of the current batch
        "token_budget": args.batcher_tokens,
        "options": {
            "tokenizer": str(tok_dir),
            "max_batch_tokens": args.max_batch_tokens,
            "prefix_sharing": share,
            # None: the scorer's default (two batches in flight on the packed CUDA path)
            **({"pipeline_depth": pipeline_depth} if pipeline_depth is not None else {}),
            **(
                {
                    "simulate_us_per_token": args.simulate_us_per_token,
                    "simulate_batch_ms": args.simulate_batch_ms,
                }
                if standin and args.simulate_us_per_token
                else {}
            ),
        },
    }
    groups: dict[int, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "service.yaml"
        doc: dict = {"scorers": [spec]}
        if mode == "deploy":
            doc.update(mode="dedicated", gpus=[0] if device == "cuda" else [])
        cfg.write_text(yaml.safe_dump(doc))
        serve_args = [f"--{mode}", str(cfg)]
        with running_server(
            serve_args,
            Path(tmp),
            env=server_env(Path(tmp), args, standin, label),
            ready_timeout_s=600,
        ) as url:

            async def main() -> tuple[float, list[float], float | None]:
                # bodies encoded before the clock starts: the clients' own JSON work is not the server's
                pending = [json.dumps(request_body(g)).encode() for g in groups.values()]
                latencies: list[float] = []
                headers = {"content-type": "application/json"}
                async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as client:

                    async def worker():
                        while pending:
                            body = pending.pop()
                            t = time.perf_counter()
                            resp = await client.post("/v1/score", content=body)
                            resp.raise_for_status()
                            latencies.append(time.perf_counter() - t)

                    warm = pending[: args.clients]
                    del pending[: args.clients]
                    await asyncio.gather(*(client.post("/v1/score", content=b) for b in warm))
                    before = server_processes(str(cfg))
                    batches_before = await batch_metrics(client)
                    with profiled(args, f"{model_shape}-{label}", before):
                        window[0] = t0 = time.perf_counter()
                        await asyncio.gather(*(worker() for _ in range(args.clients)))
                        seconds = time.perf_counter() - t0
                        window[1] = time.perf_counter()
                    after = server_processes(str(cfg))
                    batches_after = await batch_metrics(client)
                    cpu = sum(after.get(p, 0.0) - c for p, c in before.items()) if before else None
                    batches = {k: batches_after[k] - batches_before.get(k, 0.0) for k in batches_after}
                    return seconds, latencies, cpu, batches

            window = [0.0, 0.0]
            seconds, latencies, cpu_s, batches = asyncio.run(main())
    trace = {}
    if args.trace is not None:
        from serve_text_trace import load, summarise

        trace = {f"trace_{k}": v for k, v in summarise(load(args.trace / safe_label(label)), *window).items()}
    measured = len(latencies) * args.group_size
    tokens = sum(len(r["ids"]) for r in rows) * measured / len(rows)
    return {
        "seconds": seconds,
        "seq_per_s": measured / seconds,
        "tokens_per_s": tokens / seconds,
        "p50_ms": 1e3 * statistics.median(latencies),
        "p99_ms": 1e3 * sorted(latencies)[int(0.99 * (len(latencies) - 1))],
        # CPU time of the server's processes (gateway and workers) per sequence: what the host
        # spends, independent of how many other processes share its cores
        **({"server_cpu_ms_per_seq": 1e3 * cpu_s / measured} if cpu_s is not None else {}),
        # what the batcher formed during the timed phase (/metrics): fragmentation shows here
        **batch_summary(batches),
        **trace,
    }


METRIC_LINE = re.compile(
    r"^(rewardplane_(?:batch_size|batch_tokens|inference_seconds)_(?:sum|count))\{[^}]*\}\s+(\S+)$"
)


async def batch_metrics(client) -> dict[str, float]:
    """The batcher's histograms' sums and counts from /metrics (all scorers added up)."""
    out: dict[str, float] = {}
    resp = await client.get("/metrics")
    for line in resp.text.splitlines():
        m = METRIC_LINE.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def batch_summary(batches: dict[str, float]) -> dict[str, float]:
    """Batches formed, their mean items and tokens, and the mean time the scorer held each."""
    count = batches.get("rewardplane_batch_size_count", 0.0)
    if not count:
        return {}
    return {
        "batches": count,
        "items_per_batch": batches.get("rewardplane_batch_size_sum", 0.0) / count,
        "tokens_per_batch": batches.get("rewardplane_batch_tokens_sum", 0.0)
        / max(1.0, batches.get("rewardplane_batch_tokens_count", 0.0)),
        "ms_per_batch": 1e3
        * batches.get("rewardplane_inference_seconds_sum", 0.0)
        / max(1.0, batches.get("rewardplane_inference_seconds_count", 0.0)),
    }


def server_processes(marker: str) -> dict[int, float]:
    """{pid: user + system CPU seconds} of the server whose command line contains `marker` and
    of all its descendants (the deploy gateway's workers); empty where /proc cannot tell."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tree: set[int] = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        pid = int(entry.name)
        parent[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        if marker.encode() in cmdline:
            tree.add(pid)
    grew = bool(tree)
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: cpu[pid] for pid in tree}


@contextlib.contextmanager
def profiled(args, label: str, pids: Iterable[int]) -> Iterator[None]:
    """With --profile: `py-spy record` attached to the server (and its workers) for the block,
    raw collapsed stacks into `--profile/<label>.txt`."""
    if args.profile is None:
        yield
        return
    args.profile.mkdir(parents=True, exist_ok=True)
    out = args.profile / f"{safe_label(label)}.txt"
    root = min(pids)
    cmd = ["py-spy", "record", "--pid", str(root), "--subprocesses", "--threads", "--format", "raw"]
    cmd += ["--rate", "200", "--nonblocking"]  # not paused while sampled: the throughput stays honest
    flags = [*(["--gil"] if args.profile_gil else []), *(["--idle"] if args.profile_idle else [])]
    spy = subprocess.Popen([*cmd, *flags, "-o", str(out)])
    time.sleep(2.0)  # attached before the clock starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        spy.wait(timeout=120)


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
