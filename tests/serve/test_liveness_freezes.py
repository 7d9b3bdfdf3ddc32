"""The code-fence freeze of issue 44, through a real server: an unclosed ``` and 100,000
letters sent to the code scorer used to hold the GIL for 10-49 s in a backtracking regex, and
/health/live waited with it. Now the fence scan is linear and /health/live keeps answering while
the item is scored. Asserted as a ratio, never in milliseconds: the slowest liveness answer
during the request took under half the request's own time (the old regex held every probe for
nearly all of it), and probes kept answering while it ran."""

from __future__ import annotations

import concurrent.futures
import time

import httpx

from support.serve import LiveServer, make_config

BAD = "```" + "a" * 100_000
"""The issue's case: an unclosed fence and a long tail of letters."""


def test_health_live_answers_while_an_unclosed_fence_is_scored():
    cfg = make_config(
        [{"name": "code", "kind": "code", "options": {"timeout_s": 5.0, "concurrency": 1, "prefork": 1}}]
    )
    item = {"id": "bad", "response": BAD, "reference": {"inputs": ["1\n"], "outputs": ["1\n"]}}
    with LiveServer(cfg) as server, httpx.Client(base_url=server.url, timeout=120) as client:

        def score() -> tuple[float, float, httpx.Response]:
            started = time.perf_counter()
            with httpx.Client(base_url=server.url, timeout=120) as c:
                r = c.post("/v1/score", json={"scorers": ["code"], "items": [item]})
            return started, time.perf_counter(), r

        probes: list[tuple[float, float]] = []
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(score)
            while not future.done():
                sent = time.perf_counter()
                assert client.get("/health/live").status_code == 200
                probes.append((sent, time.perf_counter()))
                time.sleep(0.005)
            started, finished, r = future.result()
    assert r.status_code == 200, r.text[:300]
    assert r.json()["results"][0]["scores"]["code"] == 0.0  # the whole response is the program: wrong
    during = [end - sent for sent, end in probes if end >= started and sent <= finished]
    assert len(during) >= 2, "no liveness probe was answered while the item was scored"
    assert max(during) < 0.5 * (finished - started), (max(during), finished - started)
