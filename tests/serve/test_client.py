"""RewardClient / AsyncRewardClient: retries, Retry-After, idempotency keys, ScoreError, and the CLI."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rewardplane.serve.client import AsyncRewardClient, RewardClient, ScoreError, ServiceError
from rewardplane.serve.protocol import ScoreItem, firing, flat_metrics
from support.serve import LiveServer, hold_the_port, make_config

OK = {
    "results": [{"id": "a", "scores": {"s": 1.0}, "errors": {}}],
    "scorers": {"s": {"version": "v", "identity": "i"}},
}


def scripted(responses, seen):
    """A transport answering the scripted responses in order, recording each request."""
    it = iter(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        nxt = next(it)
        if isinstance(nxt, Exception):
            raise nxt
        return nxt

    return handler


def test_retries_429_503_and_connection_errors_with_one_idempotency_key(monkeypatch):
    sleeps = []
    monkeypatch.setattr("rewardplane.serve.client.time.sleep", sleeps.append)
    seen: list[httpx.Request] = []
    responses = [
        httpx.Response(429, json={"code": "queue_full", "message": "m"}, headers={"retry-after": "3"}),
        httpx.ConnectError("refused"),
        httpx.Response(503, json={"code": "not_ready", "message": "m"}),
        httpx.Response(200, json=OK),
    ]
    with RewardClient(
        "http://svc", transport=httpx.MockTransport(scripted(responses, seen)), backoff_s=0.1
    ) as c:
        out = c.score([{"id": "a", "response": "x"}], ["s"])
    assert out[0].scores == {"s": 1.0}
    assert len(seen) == 4
    assert len({r.headers["idempotency-key"] for r in seen}) == 1
    assert 3.0 <= sleeps[0] <= 3.1  # Retry-After wins
    assert 0.05 <= sleeps[1] <= 0.2 and 0.1 <= sleeps[2] <= 0.4  # exponential with jitter


def test_gives_up_after_max_retries_and_does_not_retry_4xx(monkeypatch):
    monkeypatch.setattr("rewardplane.serve.client.time.sleep", lambda s: None)
    seen: list[httpx.Request] = []
    busy = [httpx.Response(429, json={"code": "queue_full", "message": "m"})] * 3
    client = RewardClient("http://svc", transport=httpx.MockTransport(scripted(busy, seen)), max_retries=2)
    with client as c, pytest.raises(ServiceError) as exc:
        c.score([{"id": "a"}], ["s"])
    assert exc.value.status == 429 and exc.value.code == "queue_full" and len(seen) == 3
    seen.clear()
    bad = [httpx.Response(422, json={"code": "unknown_scorer", "message": "m"})]
    with (
        RewardClient("http://svc", transport=httpx.MockTransport(scripted(bad, seen))) as c,
        pytest.raises(ServiceError) as exc,
    ):
        c.score([{"id": "a"}], ["s"])
    assert exc.value.code == "unknown_scorer" and len(seen) == 1


@pytest.mark.parametrize(
    ("results", "found"),
    [
        ([{"id": "a", "scores": {"s": float("nan")}, "errors": {}}], "NaN"),
        ([{"id": "a", "scores": {"s": None}, "errors": {}}], "null"),
        ([{"id": "a", "scores": {"s": True}, "errors": {}}], "true/false"),
        ([{"id": "a", "scores": {}, "errors": {}}], "neither a score nor an error"),
        ([{"id": "b", "scores": {"s": 1.0}, "errors": {}}], "not requested"),
        ([], "absent from results"),
    ],
)
def test_a_200_that_does_not_answer_the_request_raises_and_never_becomes_a_score(results, found):
    """The client decodes with the load generator's decoder: a body from a proxy or a bug that
    does not hold a finite number (or an error) for every item and scorer asked is refused."""
    body = json.dumps({"results": results, "scorers": {}}, allow_nan=True)
    responses = [httpx.Response(200, content=body, headers={"content-type": "application/json"})]
    with (
        RewardClient("http://svc", transport=httpx.MockTransport(scripted(responses, []))) as c,
        pytest.raises(ServiceError) as exc,
    ):
        c.score([{"id": "a", "response": "x"}], ["s"], allow_partial=True)
    assert exc.value.code == "invalid_response" and found in exc.value.message


def test_async_client_retries(monkeypatch):
    async def no_sleep(_):
        return None

    monkeypatch.setattr("rewardplane.serve.client.asyncio.sleep", no_sleep)
    seen: list[httpx.Request] = []
    responses = [httpx.ReadError("reset"), httpx.Response(200, json=OK)]

    async def run():
        async with AsyncRewardClient(
            "http://svc", transport=httpx.MockTransport(scripted(responses, seen))
        ) as c:
            return await c.score([ScoreItem("a", "p", "r", image=b"\x89PNG")], ["s"])

    assert asyncio.run(run())[0].id == "a"
    body = json.loads(seen[0].content)
    assert body["items"][0]["image"] == {"b64": "iVBORw=="}


AUDIT_BODY = {
    "counts": {"audited": 40, "sampled": 50, "dropped_queue_full": 4, "dropped_queue_bytes": 1},
    "bins": [
        {"versions": [0, 1], "proxy": {"mean": 9.0}, "auditors": {}, "signatures": {}},
        {
            "versions": [2, 3],
            "proxy": {"mean": 0.5},
            "auditors": {"gold": {"mean": 0.25, "tau": {"point": -0.5}, "gap": {"mean": 0.125}},
                         "judge": {"mean": 0.75, "tau": None, "gap": None}},
            "signatures": {"empty": {"rate": 0.1}},
        },
    ],
    "alarms": {"decorrelation": {"gold": {"firing": True}, "judge": {"firing": False}},
               "signature": {"empty": {"firing": False}}},
}  # fmt: skip


def test_audit_is_one_get_of_the_audit_route_and_the_protocol_reads_it_as_trainers_log_it():
    seen: list[httpx.Request] = []
    answers = [
        httpx.Response(200, json=AUDIT_BODY),
        httpx.Response(404, json={"code": "not_found", "message": "m"}),
    ]
    with RewardClient("http://svc", token="tok", transport=httpx.MockTransport(scripted(answers, seen))) as c:
        assert c.audit() == AUDIT_BODY
        with pytest.raises(ServiceError) as err:
            c.audit(summary=False)
    assert [(r.method, r.url.path, dict(r.url.params)) for r in seen] == [
        ("GET", "/v1/audit", {"summary": "true"}),
        ("GET", "/v1/audit", {}),
    ]
    assert seen[0].headers["authorization"] == "Bearer tok"
    assert err.value.status == 404 and err.value.code == "not_found"
    # the newest bin's numbers, exactly; what the audit does not have (judge's tau) is left out
    assert flat_metrics(AUDIT_BODY) == {
        "audit/audited": 40.0,
        "audit/dropped_frac": 0.1,
        "audit/version": 3.0,
        "audit/proxy_mean": 0.5,
        "audit/gold/mean": 0.25,
        "audit/gold/tau": -0.5,
        "audit/gold/gap": 0.125,
        "audit/judge/mean": 0.75,
        "audit/signature/empty": 0.1,
        "audit/alarm/decorrelation": 1.0,
        "audit/alarm/decorrelation/gold": 1.0,
        "audit/alarm/decorrelation/judge": 0.0,
        "audit/alarm/signature": 0.0,
        "audit/alarm/signature/empty": 0.0,
    }
    assert firing(AUDIT_BODY) == [("decorrelation", "gold")] and firing(AUDIT_BODY, ("signature",)) == []


def test_async_client_audit():
    seen: list[httpx.Request] = []

    async def run():
        transport = httpx.MockTransport(scripted([httpx.Response(200, json=AUDIT_BODY)], seen))
        async with AsyncRewardClient("http://svc", transport=transport) as c:
            return await c.audit()

    assert asyncio.run(run()) == AUDIT_BODY and seen[0].url.params["summary"] == "true"


def free_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_answer_after_the_retries_is_a_service_error(monkeypatch):
    """A refused connection (a real one) and a timeout reach the caller as `ServiceError`, with a
    stable code and no HTTP status, after the retries; never as httpx's own exception."""
    sleeps = []
    monkeypatch.setattr("rewardplane.serve.client.time.sleep", sleeps.append)
    url = f"http://127.0.0.1:{free_port()}"
    with RewardClient(url, max_retries=2) as c:
        for call in (
            lambda: c.score([{"id": "a", "response": "x"}], ["s"]),
            c.scorers,
            c.lifecycle,
            c.onload,
        ):
            sleeps.clear()
            with pytest.raises(ServiceError) as exc:
                call()
            assert (exc.value.code, exc.value.status) == ("connection_failed", None) and len(sleeps) == 2
            assert url in str(exc.value) and "ConnectError" in str(exc.value)
    seen: list[httpx.Request] = []
    timeouts = [httpx.ConnectTimeout("slow"), httpx.ReadTimeout("slow")]
    with (
        RewardClient(
            "http://svc", transport=httpx.MockTransport(scripted(timeouts, seen)), max_retries=3
        ) as c,
        pytest.raises(ServiceError) as exc,
    ):
        c.score([{"id": "a"}], ["s"])
    # a connect timeout is retried; a read timeout (the request was sent) is final
    assert exc.value.code == "client_timeout" and exc.value.status is None and len(seen) == 2


def test_async_client_no_answer_is_a_service_error(monkeypatch):
    async def no_sleep(_):
        return None

    monkeypatch.setattr("rewardplane.serve.client.asyncio.sleep", no_sleep)
    url = f"http://127.0.0.1:{free_port()}"

    async def run():
        async with AsyncRewardClient(url, max_retries=1, scorers=["s"]) as c:
            for call in (lambda: c.score([{"id": "a"}], ["s"]), c.scorers, c.lifecycle):
                with pytest.raises(ServiceError) as exc:
                    await call()
                assert exc.value.code == "connection_failed" and exc.value.status is None
            with pytest.raises(ServiceError) as exc:
                await c.submit({"id": "a", "response": "x"})
            assert exc.value.code == "connection_failed"

    asyncio.run(run())


@pytest.fixture(scope="module")
def server():
    cfg = make_config([{"name": "d", "kind": "double"}, {"name": "len", "kind": "length"}], token="tok")
    with LiveServer(cfg) as s:
        yield s


def test_score_error_lists_failed_items_unless_allow_partial(server):
    items = [{"id": "a", "response": "fine"}, {"id": "b", "response": "NAN"}, {"id": "c", "response": "INF"}]
    with RewardClient(server.url, token="tok") as c:
        with pytest.raises(ScoreError) as exc:
            c.score(items, ["d", "len"])
        assert [(f.id, f.scorer, f.code) for f in exc.value.failures] == [
            ("b", "d", "non_finite"),
            ("c", "d", "non_finite"),
        ]
        partial = c.score(items, ["d", "len"], allow_partial=True)
        assert [r.id for r in partial] == ["a", "b", "c"] and partial[1].scores == {"len": 3.0}
        with pytest.raises(ServiceError) as unauth:
            RewardClient(server.url).score(items, ["d"])
        assert (unauth.value.status, unauth.value.code) == (401, "unauthorized")
        with pytest.raises(ServiceError) as unknown:
            c.score(items, ["nope"])
        assert (unknown.value.status, unknown.value.code) == (422, "unknown_scorer")


def test_async_client_whole_request_errors_from_the_service(server):
    async def run():
        async with (
            AsyncRewardClient(server.url, token="wrong") as bad,
            AsyncRewardClient(server.url, token="tok") as c,
        ):
            with pytest.raises(ServiceError) as unauth:
                await bad.score([{"id": "a", "response": "x"}], ["d"])
            assert (unauth.value.status, unauth.value.code) == (401, "unauthorized")
            with pytest.raises(ServiceError) as unknown:
                await c.submit({"id": "a", "response": "x"}, ["nope"])
            assert unknown.value.code == "unknown_scorer"

    asyncio.run(run())


def test_multipart_client_matches_json_client(server):
    items = [ScoreItem("a", "p", "four")]
    with (
        RewardClient(server.url, token="tok") as c,
        RewardClient(server.url, token="tok", multipart=True) as m,
    ):
        assert c.score(items, ["d"]) == m.score(items, ["d"])


def test_cli_score_writes_every_item_and_exit_code(server, tmp_path, capsys, monkeypatch):
    from rewardplane.cli import main

    src = tmp_path / "items.jsonl"
    src.write_text(
        "\n".join(
            json.dumps({"id": f"i{k}", "prompt": "p", "response": "NAN" if k == 3 else "r" * k})
            for k in range(7)
        )
        + "\n"
    )
    out = tmp_path / "out.jsonl"
    monkeypatch.setenv("REWARDPLANE_TOKEN", "tok")
    args = [
        "score",
        "--url",
        server.url,
        str(src),
        "--out",
        str(out),
        "--batch-size",
        "3",
        "--scorers",
        "d,len",
    ]
    assert main(args) == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"i{k}" for k in range(7)]
    assert rows[3]["errors"]["d"]["code"] == "non_finite" and rows[2]["scores"] == {"d": 2.0, "len": 2.0}
    assert main([*args, "--allow-partial", "--overwrite"]) == 0  # the first run wrote out.jsonl
    assert main(["score", "--url", server.url, str(tmp_path / "missing.jsonl")]) == 2
    assert main(["score", "--url", server.url, str(src), "--scorers", "nope"]) == 2
    assert "unknown_scorer" in capsys.readouterr().err


def test_serve_without_config_or_demo_model_says_how(tmp_path, monkeypatch, capsys):
    """Answered before the port is tried: as if something held it."""
    from rewardplane.cli import main

    hold_the_port(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["serve"]) == 2
    assert "make demo" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("scorers: [{name: x, kind: nope}]\n")
    assert main(["serve", "--config", "bad.yaml"]) == 2
    assert "unknown kind 'nope'" in capsys.readouterr().err


def test_rewardplane_serve_subprocess_binds_loopback_and_reads_token_from_env(tmp_path):
    from rewardplane.bench.server import running_server

    (tmp_path / "service.yaml").write_text("scorers:\n  - {name: len, kind: length}\n")
    args = ["--config", str(tmp_path / "service.yaml"), "--log-level", "warning"]
    with running_server(args, tmp_path, env={"REWARDPLANE_TOKEN": "envtok"}, ready_timeout_s=300) as url:
        with RewardClient(url, token="envtok") as c:
            assert c.score([{"id": "a", "response": "abc"}], ["len"])[0].scores == {"len": 3.0}
        assert httpx.post(url + "/v1/score", json={"scorers": ["len"], "items": []}).status_code == 401
