"""benchmarks/serve_text.py's HTTP variants (d, d1, e, e1, h, h+): a served scorer under concurrent
clients, its batches and CPU read from the server, optionally profiled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path


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
