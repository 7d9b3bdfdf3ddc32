"""The UniRL reward protocol "1" (`POST /score`, `GET /health`, `GET /rewards`) driven the way
UniRL's `RemoteRewardBackend` drives it (tests/support/unirl_client.py mirrors that client)."""

from __future__ import annotations

import base64
import uuid

import httpx
import pytest
import requests
from PIL import Image

from support.serve import DoubleScorer, LiveServer, RecordingScorer, make_config
from support.unirl_client import UniRLClient, jpeg_b64


def scorer_identity(url: str, name: str) -> str:
    return {s["name"]: s["identity"] for s in httpx.get(url + "/v1/scorers").json()["scorers"]}[name]


def image(seed: int) -> Image.Image:
    return Image.new("RGB", (32, 24), (40 * seed % 255, 90, 200 - 30 * seed % 200))


def test_image_requests_equal_v1_score_and_echo_identities(server, direct_scores):
    client = UniRLClient(server.url, ["clip"], request_batch_size=2, source_rank=3)
    assert client.is_available()
    captions = ["a red square", "a blue square", "a cat", "a dog", "noise"]
    wire = [
        client.wire_request(
            [{"text": c, "image_b64": jpeg_b64(image(i))}],
            sample_id=f"s{i}",
            group_id="g0",
            metadata={"policy_version": 7},
        )
        for i, c in enumerate(captions)
    ]
    merged = client.post(wire)  # raises unless every identity came back exactly
    values, problems = client.rewards(merged)
    assert problems == [None] * 5
    items = [
        {"id": str(i), "prompt": c, "image": {"b64": w["history"][-1]["image_b64"]}}
        for i, (c, w) in enumerate(zip(captions, wire, strict=True))
    ]
    assert values == pytest.approx(direct_scores(server.url, "clip", items), abs=1e-5)
    assert all(set(r) == {"clip"} and set(r["clip"]) == {"score"} for r in merged["results"])
    assert client.posts == 3  # chunks of 2


def test_an_image_to_image_request_scores_the_last_turn(server, direct_scores):
    client = UniRLClient(server.url, ["clip"])
    last = jpeg_b64(image(1))
    wire = [
        client.wire_request(
            [{"text": "edit", "image_b64": jpeg_b64(image(2))}, {"text": "edit", "image_b64": last}]
        )
    ]
    values, _ = client.rewards(client.post(wire))
    assert values == pytest.approx(
        direct_scores(server.url, "clip", [{"id": "0", "prompt": "edit", "image": {"b64": last}}])
    )


def test_text_turns_for_text_scorers(server, direct_scores):
    client = UniRLClient(server.url, ["rm", "len"])
    wire = [client.wire_request([{"text": "Say hello."}, {"text": "Hello there!"}], sample_id=11)]
    merged = client.post(wire)
    want_rm = direct_scores(
        server.url,
        "rm",
        [{"id": "0", "prompt": [{"role": "user", "content": "Say hello."}], "response": "Hello there!"}],
    )
    assert merged["results"][0]["rm"]["score"] == pytest.approx(want_rm[0], abs=1e-5)
    assert merged["results"][0]["len"]["score"] == 12.0
    exact = UniRLClient(server.url, ["exact"])
    out = exact.post([exact.wire_request([{"text": "2+2?"}, {"text": "4"}], metadata={"answer": "4"})])
    assert out["results"][0]["exact"]["score"] == 1.0


def test_per_reward_errors_are_isolated_and_non_finite_is_never_sent(server):
    client = UniRLClient(server.url, ["len", "double"])
    merged = client.post([client.wire_request([{"text": "q"}, {"text": t}]) for t in ("ok", "INF", "NAN")])
    assert merged["results"][0] == {"len": {"score": 2.0}, "double": {"score": 2.0}}
    for row in (1, 2):
        assert merged["results"][row] == {"len": {"score": 3.0}}
        assert merged["errors"][row]["double"].startswith("non_finite")
    values, problems = client.rewards(merged)
    assert values == [2.0, None, None] and "double" in problems[1]
    clip = UniRLClient(server.url, ["clip"])
    merged = clip.post([clip.wire_request([{"text": "no image"}])])
    assert merged["errors"][0]["clip"].startswith("missing_image")


def test_idempotency_keys_replay_or_conflict(server):
    client = UniRLClient(server.url, ["double"])
    wire = [client.wire_request([{"text": "q"}, {"text": "replay me"}], sample_id="k1")]
    first = client.post(wire)
    calls = len(DoubleScorer.batches)
    assert client.post(wire) == first and len(DoubleScorer.batches) == calls  # replayed, not rescored
    changed = dict(wire[0], history=[{"text": "q"}, {"text": "something else"}])
    r = httpx.post(server.url + "/score", json={"protocol_version": "1", "requests": [changed]})
    assert r.status_code == 409 and r.json()["code"] == "idempotency_conflict"
    twice = httpx.post(server.url + "/score", json={"protocol_version": "1", "requests": [wire[0], changed]})
    assert twice.status_code == 409


def test_a_batch_mixing_keyed_duplicate_and_unkeyed_requests(server):
    """Unkeyed requests are scored every time; a key's in-batch duplicate shares its answer; a keyed
    request is stored only when every reward scored it (so a retry rescores the failed one)."""
    k1, k2 = f"k1-{uuid.uuid4()}", f"k2-{uuid.uuid4()}"
    keyed = {"history": [{"text": "q"}, {"text": "keyed"}], "required_rewards": ["double"], "sample_id": 1}
    reqs = [
        {
            "history": [{"text": "q"}, {"text": "ok"}],
            "required_rewards": ["len", "double"],
            "request_id": "a",
        },
        {**keyed, "idempotency_key": k1},
        {**keyed, "idempotency_key": k1},
        {"history": [{"text": "NAN"}], "required_rewards": ["len", "double"], "idempotency_key": k2},
    ]
    body = {"protocol_version": "1", "requests": reqs}
    scored = []
    for _ in range(2):
        calls = len(DoubleScorer.batches)
        out = httpx.post(server.url + "/score", json=body, timeout=30).json()
        scored.append(sum(DoubleScorer.batches[calls:]))
        values = [{n: v["score"] for n, v in r.items()} for r in out["results"]]
        assert values == [{"len": 2.0, "double": 2.0}, {"double": 5.0}, {"double": 5.0}, {"len": 3.0}]
        assert out["errors"][3]["double"].startswith("non_finite")
        assert out["errors"][:3] == [{}, {}, {}]
        assert [i["idempotency_key"] for i in out["identities"]] == [None, k1, k1, k2]
        assert [i["sample_id"] for i in out["identities"]] == [None, 1, 1, None]
        assert out["identities"][0]["request_id"] == "a"
    assert scored == [3, 2]  # the second time: k1 replayed, "a" and the failed k2 scored again


def test_what_a_scorer_sees_for_each_history_shape():
    """The last turn is the response; the earlier text turns are user messages (a conversation,
    never a plain string, which `plain_text: text_eos` scorers read as text), empty ones are skipped; `metadata.reference`, else `.answer`, is
    the reference; `group_id` arrives as a string. Two text rewards get the same items."""
    histories = [
        ([{"text": "Say hi."}, {"text": "hi"}], ["Say hi."]),
        ([{"text": "Q1"}, {"text": ""}, {"text": "Q2"}, {"text": "a"}], ["Q1", "Q2"]),
        ([{"text": ""}, {"text": "Q"}, {"text": "a"}], ["Q"]),
        ([{"text": ""}, {"text": "a"}], ""),
        ([{"text": "a"}], ""),
    ]
    metadata = [{"answer": "4"}, {"reference": {"x": 1}, "answer": "no"}, None, {"note": [1]}, None]
    reqs = [
        {"history": h, "required_rewards": ["rec", "len"], "group_id": k, "metadata": m}
        for k, ((h, _), m) in enumerate(zip(histories, metadata, strict=True))
    ]
    RecordingScorer.seen.clear()
    cfg = make_config([{"name": "rec", "kind": "recording"}, {"name": "len", "kind": "length"}])
    with LiveServer(cfg) as live:
        out = httpx.post(live.url + "/score", json={"protocol_version": "1", "requests": reqs}, timeout=30)
    assert out.status_code == 200 and not any(out.json()["errors"])
    seen = sorted(RecordingScorer.seen, key=lambda item: int(item.id))
    assert [item.id for item in seen] == ["0", "1", "2", "3", "4"]
    for k, (item, (_, prompt), meta) in enumerate(zip(seen, histories, metadata, strict=True)):
        if isinstance(prompt, list):
            prompt = [{"role": "user", "content": text} for text in prompt]
        response = "a" if k else "hi"
        assert (item.prompt, item.response, item.group_id, item.metadata) == (prompt, response, str(k), meta)
    assert [item.reference for item in seen] == ["4", {"x": 1}, None, None, None]
    assert [r["len"]["score"] for r in out.json()["results"]] == [2.0, 1.0, 1.0, 1.0, 1.0]


def test_version_pins_and_request_errors(server):
    identity = scorer_identity(server.url, "len")
    pinned = UniRLClient(server.url, ["len"], expected_scorer_version=identity)
    assert pinned.rewards(pinned.post([pinned.wire_request([{"text": "q"}, {"text": "abc"}])]))[0] == [3.0]
    served = {"len": identity, "rm": scorer_identity(server.url, "rm")}
    for client, pin, rewards in (
        (UniRLClient(server.url, ["len"], expected_scorer_version="stale"), "stale", {"len": identity}),
        (UniRLClient(server.url, ["len", "rm"], expected_scorer_version=identity), identity, served),
    ):
        with pytest.raises(requests.HTTPError) as info:
            client.post([client.wire_request([{"text": "q"}, {"text": "abc"}])])
        assert info.value.response.status_code == 400 and client.posts == 1  # a 400 is not retried
        assert info.value.response.json() == {
            "code": "scorer_version_mismatch",
            "message": f"requests[0] pins scorer_version {pin!r}; {rewards} is served"
            " (a pin needs exactly one required reward)",
        }
    unknown = UniRLClient(server.url, ["nope"])
    with pytest.raises(requests.HTTPError) as info:
        unknown.post([unknown.wire_request([{"text": "x"}])])
    assert info.value.response.status_code == 400
    refused = info.value.response.json()
    assert refused["code"] == "unknown_scorer" and refused["message"].startswith(
        "unknown reward: ['nope']. available: ["
    )
    with pytest.raises(ValueError, match="not served"):
        unknown.is_available()
    r = httpx.post(server.url + "/score", json={"protocol_version": "2", "requests": []})
    assert r.status_code == 400 and r.json()["code"] == "unsupported_protocol"
    video = {
        "history": [{"text": "v", "video_b64": base64.b64encode(b"x").decode()}],
        "required_rewards": ["len"],
    }
    r = httpx.post(server.url + "/score", json={"protocol_version": "1", "requests": [video]})
    assert r.status_code == 200 and r.json()["errors"][0]["len"].startswith("bad_input")


def test_health_and_rewards(server):
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["rewards"]["rm"] == ["ready"]
    assert set(httpx.get(server.url + "/rewards").json()["rewards"]) == {
        *("rm", "len", "exact", "double", "clip"),
        *("reward", "guarded", "lenient"),  # the composites
    }


def test_a_composites_components_follow_its_total(server, direct_scores, direct_components):
    """Issue 38 item 4: protocol "1" answers `{reward: {metric: value}}`; a composite's total is
    the first metric (the one UniRL's client reads), its components follow under their names."""
    client = UniRLClient(server.url, ["reward", "lenient"])
    wire = [client.wire_request([{"text": "Say hello."}, {"text": t}]) for t in ("Hello there!", "NAN")]
    merged = client.post(wire)
    items = [{"id": str(i), "prompt": [{"role": "user", "content": "Say hello."}], "response": t}
             for i, t in enumerate(("Hello there!", "NAN"))]  # fmt: skip
    totals, parts = direct_scores(server.url, "reward", items), direct_components(server.url, "reward", items)
    for result, total, want in zip(merged["results"], totals, parts, strict=True):
        assert list(result["reward"]) == ["score", "model", "length"]
        assert result["reward"]["score"] == pytest.approx(total, abs=1e-5)
        assert {k: result["reward"][k] for k in want} == pytest.approx(want, abs=1e-5)
    values, problems = UniRLClient(server.url, ["reward"]).rewards(merged)  # its first metric
    assert problems == [None, None] and values == pytest.approx(totals, abs=1e-5)
    assert merged["results"][1]["lenient"] == {"score": 9.0, "len": 3.0}  # `dbl` left out: no key


def test_each_error_says_whose_failure_it_is(server):
    """`error_kinds`, beside the protocol's `errors` (which UniRL's client reads unchanged)."""
    client = UniRLClient(server.url, ["len", "double"])
    reqs = [client.wire_request([{"text": "q"}, {"text": t}]) for t in ("ok", "ERR", "NAN")]
    raw = httpx.post(
        f"{server.url}/score", json={"protocol_version": "1", "requests": reqs}, timeout=60
    ).json()
    assert raw["error_kinds"] == [{}, {"double": "item"}, {"double": "service"}]
    assert raw["errors"][1]["double"].startswith("bad_image: ")
