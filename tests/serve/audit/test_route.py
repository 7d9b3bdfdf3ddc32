"""`GET /v1/audit`, the Prometheus gauges, the UniRL route's `policy_version` and OpenRLHF's
`extra_logs`, through a real server; and the `audit:` section's config checks."""

from __future__ import annotations

import time

import httpx
import pytest

from rewardplane.core.errors import ConfigError
from support.serve import LiveServer, make_config

SCORERS = [
    {"name": "len", "kind": "length"},
    {"name": "words", "kind": "length", "options": {"unit": "words"}},
]
AUDIT = {
    "proxy": "len",
    "auditors": ["words"],
    "sample": 1.0,
    "min_items": 10,
    "batch_wait_s": 0,
    "settle_versions": 1,
}


def items(version: int, n: int = 30) -> list[dict]:
    return [{"id": str(i), "prompt": "p", "response": "word " * (i % 5 + 1), "metadata": {"policy_version": version}}
            for i in range(n)]  # fmt: skip


def wait_audited(url: str, n: int, headers: dict | None = None) -> dict:
    deadline = time.monotonic() + 120
    while (body := httpx.get(f"{url}/v1/audit", headers=headers).json())["counts"]["audited"] < n:
        assert time.monotonic() < deadline, body["counts"]
        time.sleep(0.05)
    return body


@pytest.fixture(scope="module")
def server():
    with LiveServer(make_config(SCORERS, audit=AUDIT, token="s3cret")) as live:
        auth = {"authorization": "Bearer s3cret"}
        for v in range(4):
            r = httpx.post(f"{live.url}/v1/score", json={"scorers": ["len"], "items": items(v)}, headers=auth)
            assert r.status_code == 200
        wait_audited(live.url, 120, auth)
        yield live, auth


def test_audit_needs_the_token_and_answers_versions_bins_and_alarms(server):
    live, auth = server
    assert httpx.get(f"{live.url}/v1/audit").status_code == 401
    body = httpx.get(f"{live.url}/v1/audit", headers=auth).json()
    assert (
        body["schema"] == "rewardplane.audit/1" and body["proxy"] == "len" and body["auditors"] == ["words"]
    )
    assert [v["version"] for v in body["versions"]] == [0, 1, 2, 3]
    assert [b["versions"] for b in body["bins"]] == [[0, 0], [1, 1], [2, 2]]  # 3 is not final yet
    assert set(body["alarms"]) == {"decorrelation", "signature"}  # overoptimization needs 2 windows
    assert body["alarms"]["decorrelation"]["words"]["firing"] is False
    summary = httpx.get(f"{live.url}/v1/audit", headers=auth, params={"summary": "true"}).json()
    assert "versions" not in summary and [b["bin"] for b in summary["bins"]] == [2]
    since = httpx.get(f"{live.url}/v1/audit", headers=auth, params={"since": 2}).json()
    assert [v["version"] for v in since["versions"]] == [2, 3] and [b["bin"] for b in since["bins"]] == [2]


def test_metrics_carry_the_audit_gauges(server):
    live, auth = server
    text = httpx.get(f"{live.url}/metrics", headers=auth).text
    assert 'rewardplane_audit_items_total{outcome="audited"} 120.0' in text
    assert 'rewardplane_audit_tau{auditor="words"}' in text and "rewardplane_audit_version 2.0" in text
    assert 'rewardplane_audit_alarm{alarm="decorrelation",subject="words"} 0.0' in text
    # read from the stream when scraped: every outcome and every auditor, 0 until it happens
    assert 'rewardplane_audit_items_total{outcome="dropped_queue_full"} 0.0' in text
    assert 'rewardplane_audit_auditor_errors_total{auditor="words"} 0.0' in text
    assert "rewardplane_audit_queue_depth 0.0" in text and "rewardplane_audit_sample_rate " in text


def test_the_route_is_documented_in_openapi(server):
    live, _ = server
    assert "/v1/audit" in httpx.get(f"{live.url}/openapi.json").json()["paths"]


def test_unirl_policy_version_and_openrlhf_extra_logs_reach_the_audit():
    with LiveServer(make_config(SCORERS, audit={**AUDIT, "arrival_window": 10})) as live:
        for v in range(5):
            reqs = [{"history": [{"text": "q"}, {"text": "word " * (i % 4 + 1)}], "required_rewards": ["len"],
                     "policy_version": 10 + v} for i in range(12)]  # fmt: skip
            r = httpx.post(f"{live.url}/score", json={"protocol_version": "1", "requests": reqs})
            assert r.status_code == 200 and r.json()["identities"][0]["policy_version"] == 10 + v
        body = wait_audited(live.url, 60)
        assert [v["version"] for v in body["versions"]] == [10, 11, 12, 13, 14]
        # OpenRLHF sends no step: with arrival_window its items form versions in arrival order
        r = httpx.post(f"{live.url}/get_reward", params={"scorer": "len"}, json={"query": ["word word"]})
        logs = r.json()["extra_logs"]
        assert logs["len"] == [9.0] and logs["audit/words/tau"] == [pytest.approx(1.0)]
        assert logs["audit/alarm/decorrelation"] == [0.0]


def test_without_an_audit_section_the_route_says_so():
    with LiveServer(make_config(SCORERS)) as live:
        r = httpx.get(f"{live.url}/v1/audit")
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        assert "no `audit:` section" in r.json()["message"]
        r = httpx.post(f"{live.url}/get_reward", params={"scorer": "len"}, json={"query": ["a b"]})
        assert r.json()["extra_logs"] == {"len": [3.0]}


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        ({**AUDIT, "proxy": "nope"}, "audit names scorers this service does not host: ['nope']"),
        ({**AUDIT, "auditors": ["len"]}, "cannot audit itself"),
        ({**AUDIT, "sample": 0}, "audit.sample"),
        ({**AUDIT, "auditors": [{"url": "ftp://x", "scorer": "s"}]}, "http(s) URL"),
        ({**AUDIT, "alarms": {"overoptimization": {"kappa": 2}}}, "audit.alarms.overoptimization.kappa"),
        ({**AUDIT, "smaple": 0.1}, "smaple"),
    ],
)
def test_config_errors_are_one_line_and_name_the_key(audit, message):
    with pytest.raises(ConfigError) as err:
        make_config(SCORERS, audit=audit)
    assert message in str(err.value) and "\n" not in str(err.value)
