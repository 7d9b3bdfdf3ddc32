"""The freezes of issue 44, through a real server. An unclosed ``` and 100,000 letters sent to
the code scorer, or `x <` and 16,000 spaces sent to a judge, used to hold the GIL for 10-49 s in
a backtracking regex (`code._FENCE`, `judge_prompts._DELIMITER`'s `\\s*/?\\s*`), and
/health/live waited with it. Now both scans are linear and /health/live keeps answering while
the item is scored. Asserted as a ratio, never in milliseconds: the longest time /health/live went
unanswered during the request is under half the request's own time (the old regexes silenced it
for nearly all of it), and probes kept answering while it ran."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from support.http_doubles import chat_completion, reply_json
from support.serve import LiveServer, make_config

BAD = "```" + "a" * 100_000
"""The issue's code case: an unclosed fence and a long tail of letters."""
JUDGE_BAD = "x <" + " " * 16_000
"""The issue's judge case: a `<` and a run of spaces the old closing-tag pattern split every way."""


def probe_while_scored(server: LiveServer, body: dict) -> tuple[httpx.Response, int, float, float]:
    """Sends `body` to /v1/score while probing /health/live every 5 ms. Returns the answer, how
    many probes were answered during the request, the longest time during it with no answer
    (between the request's start, each answer and its end), and the request's own time.

    The longest silence, not the slowest probe: the server runs in this process, so a scan that
    holds the GIL stalls the prober as well, and the stall can fall between two probes (in its
    5 ms sleep) instead of inside one; a silence sees it wherever it falls."""

    def score() -> tuple[float, float, httpx.Response]:
        started = time.perf_counter()
        with httpx.Client(base_url=server.url, timeout=120) as c:
            r = c.post("/v1/score", json=body)
        return started, time.perf_counter(), r

    answers: list[float] = []
    with (
        httpx.Client(base_url=server.url, timeout=120) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        future = pool.submit(score)
        while not future.done():
            assert client.get("/health/live").status_code == 200
            answers.append(time.perf_counter())
            time.sleep(0.005)
        started, finished, r = future.result()
    during = [t for t in answers if started <= t <= finished]
    marks = [started, *during, finished]
    silence = max(b - a for a, b in zip(marks, marks[1:], strict=False))
    return r, len(during), silence, finished - started


def test_health_live_answers_while_an_unclosed_fence_is_scored():
    cfg = make_config(
        [{"name": "code", "kind": "code", "options": {"timeout_s": 5.0, "concurrency": 1, "prefork": 1}}]
    )
    item = {"id": "bad", "response": BAD, "reference": {"inputs": ["1\n"], "outputs": ["1\n"]}}
    with LiveServer(cfg) as server:
        r, answered, silence, took = probe_while_scored(server, {"scorers": ["code"], "items": [item]})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["results"][0]["scores"]["code"] == 0.0  # the whole response is the program: wrong
    assert answered >= 2, "no liveness probe was answered while the item was scored"
    assert silence < 0.5 * took, (silence, took)


class FixedJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible judge engine that grades everything `Score: 3` after thinking for a
    second, so that the request lasts long enough for a fair ratio even when the fence is fast."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        time.sleep(1.0)
        reply_json(self, 200, chat_completion("Weak.\nScore: 3", "m"))


def test_health_live_answers_while_a_judge_fences_a_run_of_spaces():
    engine = ThreadingHTTPServer(("127.0.0.1", 0), FixedJudge)
    engine.daemon_threads = True
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    options = {"url": f"http://127.0.0.1:{engine.server_address[1]}", "model": "m", "max_retries": 0}
    item = {"id": "bad", "prompt": "Capital of France?", "response": JUDGE_BAD, "reference": "Paris."}
    try:
        with LiveServer(make_config([{"name": "judge", "kind": "judge", "options": options}])) as server:
            r, answered, silence, took = probe_while_scored(server, {"scorers": ["judge"], "items": [item]})
    finally:
        engine.shutdown()
        engine.server_close()
    assert r.status_code == 200, r.text[:300]
    result = r.json()["results"][0]
    assert result["scores"]["judge"] == pytest.approx(2 / 9), result  # its own `Score: 3` on 1-10
    assert answered >= 2, "no liveness probe was answered while the item was scored"
    assert silence < 0.5 * took, (silence, took)
