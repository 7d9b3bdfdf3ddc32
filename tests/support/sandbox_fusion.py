"""A SandboxFusion server double for the code scorer's tests: `POST /run_code` with SandboxFusion's
request and response shapes, running what it receives (the tests send harmless programs, or
hostile ones whose limits it enforces: a wall clock per run)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.http_doubles import reply_json


class FakeSandboxFusion(BaseHTTPRequestHandler):
    """`POST /run_code` with SandboxFusion's request/response shape. Decides by markers in the
    code: TLE -> TimeLimitExceeded, OOM -> return_code 137, BOOM -> SandboxError, 500 -> HTTP 500;
    otherwise runs the code with this interpreter under `run_timeout` (TimeLimitExceeded past it)."""

    requests: list[dict] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        import subprocess
        import sys

        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        FakeSandboxFusion.requests.append(body)
        assert self.path == "/run_code"
        assert {"code", "language", "stdin", "run_timeout", "memory_limit_MB"} <= set(body)
        code = body["code"]
        if "HTTP500" in code:
            self.send_response(500)
            self.end_headers()
            return
        resp = {
            "status": "Success",
            "message": "",
            "compile_result": None,
            "executor_pod_name": None,
            "files": {},
        }
        if "BOOM" in code:
            resp.update(status="SandboxError", message="container failed", run_result=None)
        elif "TLE" in code:
            resp.update(status="Failed", run_result=run_result("TimeLimitExceeded", None))
        elif "OOM" in code:
            resp.update(status="Failed", run_result=run_result("Error", 137, stderr="Killed"))
        else:
            try:
                p = subprocess.run(
                    [sys.executable, "-c", code],
                    input=body["stdin"],
                    capture_output=True,
                    text=True,
                    timeout=float(body["run_timeout"]),
                )
                ok = p.returncode == 0
                resp.update(
                    status="Success" if ok else "Failed",
                    run_result=run_result("Finished" if ok else "Error", p.returncode, p.stdout, p.stderr),
                )
            except subprocess.TimeoutExpired:
                resp.update(status="Failed", run_result=run_result("TimeLimitExceeded", None))
        reply_json(self, 200, resp)


def run_result(status: str, return_code: int | None, stdout: str = "", stderr: str = "") -> dict:
    return {
        "status": status,
        "execution_time": 0.01,
        "return_code": return_code,
        "stdout": stdout,
        "stderr": stderr,
    }


class Backlogged(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog of 5 drops a burst's SYNs (1 s retransmits)
    daemon_threads = True


@contextlib.contextmanager
def fake_sandbox_fusion() -> Iterator[str]:
    """The fake on a free loopback port; yields its base URL."""
    server = Backlogged(("127.0.0.1", 0), FakeSandboxFusion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
