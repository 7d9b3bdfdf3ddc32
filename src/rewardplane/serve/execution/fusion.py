"""The SandboxFusion backend of the `code` scorer: the local sandbox's stdin/stdout jobs, run by a
SandboxFusion server (`POST {url}/run_code`, the API verl's sandbox_fusion reward uses).

SandboxFusion runs one script and returns its stdout: there is no second process to hold the
tests, so the trusted evaluator (`evaluator.py`) cannot run there. Assert-style tests run on it
only with the option `unsafe_run_inside`: the script is the harness (`harness.py`) with the
program and the tests' statements, run in the program's own process, and the records come back
on stdout behind a fresh nonce that the program can find (it is in the script it runs in) —
FORGEABLE, as the option's name says (docs/verifiers.md, "Reward hacking").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rewardplane.serve.execution import harness
from rewardplane.serve.execution.sandbox import RunResult

HARNESS_SOURCE = Path(harness.__file__).read_text()


class SandboxFusionClient:
    """The SandboxFusion `POST {url}/run_code` API (what verl's sandbox_fusion reward uses).

    Request: `{"code", "language", "stdin", "run_timeout", "compile_timeout", "memory_limit_MB"}`.
    Response: `{"status": "Success"|"Failed"|"SandboxError", "message", "compile_result",
    "run_result": {"status": "Finished"|"Error"|"TimeLimitExceeded", "return_code", "stdout",
    "stderr", "execution_time"}}`. Mapped to the local sandbox's `RunResult` statuses."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        memory_mb: int,
        language: str,
        request_timeout_s: float,
        max_output_bytes: int,
    ) -> None:
        import httpx

        self.url = url.rstrip("/") + "/run_code"
        self.timeout_s, self.memory_mb, self.language = timeout_s, memory_mb, language
        self.max_output_bytes = max_output_bytes
        self._http = httpx.Client(timeout=request_timeout_s)

    def close(self) -> None:
        self._http.close()

    def run(self, job: dict[str, Any]) -> RunResult:
        """One job in the local sandbox's shapes; an `inside` job is sent as the harness's
        source with the job and a fresh nonce (`script`)."""
        nonce = os.urandom(16).hex()
        if job["mode"] == "inside":
            code, stdin = script(job, nonce), ""
        else:
            code, stdin = job["code"], job.get("stdin", "")
        body = {
            "code": code,
            "language": self.language,
            "stdin": stdin,
            "run_timeout": self.timeout_s,
            "compile_timeout": self.timeout_s,
            "memory_limit_MB": self.memory_mb,
        }
        try:
            r = self._http.post(self.url, json=body)
        except Exception as exc:  # connection refused, read timeout, ...
            return RunResult(
                "sandbox_error", message=f"SandboxFusion request failed: {type(exc).__name__}: {exc}"
            )
        if r.status_code != 200:
            return RunResult("sandbox_error", message=f"SandboxFusion answered HTTP {r.status_code}")
        try:
            data = r.json()
            status = data["status"]
        except (ValueError, KeyError, TypeError):
            return RunResult("sandbox_error", message="SandboxFusion answered without a status")
        run = data.get("run_result") or {}
        compile_ = data.get("compile_result") or {}
        if status == "SandboxError":
            return RunResult("sandbox_error", message=f"SandboxFusion: {data.get('message', '')[:200]}")
        if "TimeLimitExceeded" in (run.get("status"), compile_.get("status")):
            return RunResult("timeout", message=f"SandboxFusion run_timeout {self.timeout_s:g} s")
        stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
        rc = run.get("return_code")
        if rc in (137, -9) or "MemoryError" in stderr[-2000:]:
            return RunResult(
                "memory_limit", exit_code=rc, message=f"SandboxFusion memory_limit_MB {self.memory_mb}"
            )
        if len(stdout.encode()) > self.max_output_bytes:
            return RunResult(
                "output_limit", exit_code=rc, message=f"stdout over {self.max_output_bytes} bytes"
            )
        report = {"exit": rc, "signal": None}
        if job["mode"] == "inside":
            program_out, records = read_records(stdout, nonce)
            events = {r.get("event") for r in records}
            if "memory" in events:
                return RunResult("memory_limit", exit_code=rc, message="MemoryError in the program")
            if "file_limit" in events:
                return RunResult("output_limit", exit_code=rc, message="file size limit or disk full")
            return RunResult("ok", program_out.encode(), report, records, exit_code=rc)
        return RunResult("ok", stdout.encode(), report, exit_code=rc)


def script(job: dict[str, Any], nonce: str) -> str:
    """The program SandboxFusion runs for an `inside` job: the harness's own source (the same
    code the local sandbox runs) and a call with the job."""
    return f"{HARNESS_SOURCE}\n\nfusion_main(__import__('json').loads({json.dumps(job)!r}), {nonce!r})\n"


def read_records(stdout: str, nonce: str) -> tuple[str, list[dict[str, Any]]]:
    """(the program's own output, the harness's records): a record is a whole line that starts
    with the nonce; any other line is the program's."""
    prefix = nonce + " "
    program, records = [], []
    for line in stdout.split("\n"):
        if line.startswith(prefix):
            try:
                rec = json.loads(line[len(prefix) :])
            except (ValueError, RecursionError):
                continue
            if isinstance(rec, dict):
                records.append(rec)
        else:
            program.append(line)
    return "\n".join(program), records
