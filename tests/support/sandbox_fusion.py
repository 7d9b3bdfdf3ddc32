"""A SandboxFusion server double for the code scorer's tests: `POST /run_code` with SandboxFusion's
request and response shapes, running what it receives (the tests send harmless programs, or
hostile ones whose limits it enforces: a wall clock per run)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
            resp.update(
                status="Failed",
                run_result={
                    "status": "TimeLimitExceeded",
                    "execution_time": 1.0,
                    "return_code": None,
                    "stdout": "",
                    "stderr": "",
                },
            )
        elif "OOM" in code:
            resp.update(
                status="Failed",
                run_result={
                    "status": "Error",
                    "execution_time": 0.1,
                    "return_code": 137,
                    "stdout": "",
                    "stderr": "Killed",
                },
            )
        else:
            try:
                p = subprocess.run(
                    [sys.executable, "-c", code],
                    input=body["stdin"],
                    capture_output=True,
                    text=True,
                    timeout=float(body["run_timeout"]),
                )
                resp.update(
                    status="Success" if p.returncode == 0 else "Failed",
                    run_result={
                        "status": "Finished" if p.returncode == 0 else "Error",
                        "execution_time": 0.01,
                        "return_code": p.returncode,
                        "stdout": p.stdout,
                        "stderr": p.stderr,
                    },
                )
            except subprocess.TimeoutExpired:
                resp.update(status="Failed", run_result={"status": "TimeLimitExceeded", "return_code": None})
        data = json.dumps(resp).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


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
