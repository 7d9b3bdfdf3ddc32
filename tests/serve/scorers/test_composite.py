"""The `composite` scorer: aggregation modes, failure propagation (fail / renormalize, required
components), GRPO group normalisation with its degenerate cases, and one pass through HTTP."""

from __future__ import annotations

import math
import re
import statistics
import time

import httpx
import pytest

from rewardplane.core.errors import ConfigError
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.composite import CompositeScore, CompositeScorer, group_normalize
from support.serve import LiveServer, make_config  # also registers the `double` test kind

LEN = {"name": "len", "kind": "length"}
HAS_X = {"name": "has_x", "kind": "regex", "options": {"pattern": "x"}}
DOUBLE = {"name": "dbl", "kind": "double"}  # len(response); "ERR" -> ItemError, "NAN" -> NaN, "RAISE" raises


def build(**options) -> CompositeScorer:
    s = CompositeScorer("comp", options=options)
    s.load()
    return s


def item(response: str, i: str = "x", group: str | None = None) -> ScoreItem:
    return ScoreItem(id=i, prompt="", response=response, group_id=group)


@pytest.mark.parametrize(
    ("aggregation", "weights", "want"),
    [
        ("weighted_sum", (2.0, 10.0), [2 * 3 + 10 * 1, 2 * 3 + 0]),
        ("mean", (1.0, 3.0), [(3 + 3 * 1) / 4, 3 / 4]),
        ("min", (1.0, 1.0), [1.0, 0.0]),
        ("max", (1.0, 1.0), [3.0, 3.0]),
    ],
)
def test_aggregations(aggregation, weights, want):
    s = build(
        aggregation=aggregation, components=[{**LEN, "weight": weights[0]}, {**HAS_X, "weight": weights[1]}]
    )
    assert s.score_batch([item("axb"), item("abc")]) == pytest.approx(want)


def test_a_failed_component_fails_the_item_by_default():
    s = build(components=[LEN, DOUBLE])
    got = s.score_batch([item("fine"), item("ERR"), item("NAN"), item("ok")])
    assert got[0] == 8.0 and got[3] == 4.0
    assert isinstance(got[1], ItemError) and got[1].code == "bad_image" and "'dbl'" in got[1].message
    assert isinstance(got[2], ItemError) and got[2].code == "non_finite" and "'dbl'" in got[2].message
    (raised,) = s.score_batch([item("RAISE")])  # a component raising fails its items, not the batch
    assert isinstance(raised, ItemError) and raised.code == "scorer_failed"


def test_renormalize_leaves_out_a_service_failure_and_says_so():
    s = build(on_failure="renormalize", components=[{**LEN, "weight": 1.0}, {**DOUBLE, "weight": 3.0}])
    ok, err = s.score_batch([item("abcd"), item("DOWN")])
    assert ok == 16.0 and ok.left_out == () and ok.detail == {"components": {"len": 4.0, "dbl": 4.0}}
    # only `len` is left: 4 * (1 + 3) / 1 -- the weights of the rest are rescaled to the total
    assert err == 16.0 and isinstance(err, CompositeScore) and err.left_out == ("dbl",)
    assert err.detail["components"] == {"len": 4.0}  # the left-out one has no number
    assert err.detail["component_errors"]["dbl"] == {
        "code": "sandbox_error",
        "message": "double service error",
        "kind": "service",
    }
    assert s.info().extra["left_out_counts"] == {"len": 0, "dbl": 1}
    mean = build(aggregation="mean", on_failure="renormalize", components=[LEN, DOUBLE])
    (m,) = mean.score_batch([item("DOWN")])
    assert m == 4.0 and m.left_out == ("dbl",)


def test_renormalize_never_leaves_out_the_items_own_failure():
    """An item-kind failure (the policy's doing) counts as the component's lowest score, or
    fails the item where the kind has none; it is never renormalised over."""
    no_floor = build(on_failure="renormalize", components=[LEN, DOUBLE])  # `double` has no lowest score
    (got,) = no_floor.score_batch([item("ERR")])
    assert isinstance(got, ItemError) and got.code == "bad_image" and "'dbl'" in got.message
    floored = build(on_failure="renormalize", components=[LEN, {**DOUBLE, "weight": 3.0, "floor": -1.0}])
    (got,) = floored.score_batch([item("ERR")])
    assert got == 3.0 + 3 * -1.0 and got.left_out == ()
    assert got.detail["components"] == {"len": 3.0, "dbl": -1.0} and got.detail["floored"] == ["dbl"]
    assert got.detail["component_errors"]["dbl"]["kind"] == "item"


def test_renormalize_still_fails_for_required_or_all_failed():
    s = build(on_failure="renormalize", components=[LEN, {**DOUBLE, "required": True}])
    (got,) = s.score_batch([item("DOWN")])
    assert isinstance(got, ItemError) and got.code == "sandbox_error"
    both = build(on_failure="renormalize", components=[DOUBLE, {**DOUBLE, "name": "dbl2"}])
    (got,) = both.score_batch([item("DOWN")])
    assert isinstance(got, ItemError)


def test_group_normalize_matches_grpo():
    s = build(components=[LEN], group_normalize=True, group_size=4)
    a = ["a", "aaa", "aa", "aaaaaa"]
    b = ["bb", "bb", "bb", "bb"]  # std == 0
    items = [item(t, f"a{k}", "A") for k, t in enumerate(a)] + [
        item(t, f"b{k}", "B") for k, t in enumerate(b)
    ]
    items = items[::2] + items[1::2]  # groups interleaved in the batch
    got = {it.id: v for it, v in zip(items, s.score_batch(items), strict=True)}
    raw = [float(len(t)) for t in a]
    mean, std = statistics.mean(raw), statistics.stdev(raw)  # ddof=1, as torch.std
    assert [got[f"a{k}"] for k in range(4)] == pytest.approx([(r - mean) / std for r in raw])
    assert [got[f"b{k}"] for k in range(4)] == [0.0] * 4  # degenerate std=0: exactly 0, no NaN


def test_group_normalize_degenerate_and_incomplete_groups():
    assert group_normalize([5.0]) == [0.0]  # one item, ddof=1: std undefined -> 0
    assert group_normalize([5.0], ddof=0) == [0.0]
    assert group_normalize([1.0, 3.0], scale="none") == [-1.0, 1.0]
    assert group_normalize([1.0, 3.0], ddof=0) == [-1.0, 1.0]
    s = build(components=[DOUBLE], group_normalize=True, group_size=2)
    got = s.score_batch(
        [
            item("aa", "g1a", "G1"),
            item("a", "g1b", "G1"),
            item("alone", "g2a", "G2"),  # its partner is not in this batch
            item("ok", "g3a", "G3"),
            item("ERR", "g3b", "G3"),  # a failed member fails its group
            item("nogroup", "n"),
        ]
    )
    assert got[0] == pytest.approx(1 / math.sqrt(2)) and got[1] == pytest.approx(-1 / math.sqrt(2))
    assert got[2].code == "group_incomplete"
    assert got[3].code == "group_incomplete" and "g3b" in got[3].message
    assert got[4].code == "bad_image"
    assert got[5].code == "bad_input"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"components": [LEN], "aggregation": "median"}, "options.aggregation: 'median' is not one of"),
        (
            {"components": [LEN], "group_normalize": True},
            "options.group_size must be set with group_normalize",
        ),
        (
            {"components": [{**LEN, "weight": 2}], "aggregation": "min"},
            "options.components[0].weight: weights have no meaning with aggregation min",
        ),
        ({"components": [LEN, LEN]}, "options.components: component names must be unique"),
        ({}, "options.components: required key is missing"),
        ({"components": [{"name": "x", "kind": "nope"}]}, "options.components[0].kind: unknown kind 'nope'"),
        (
            {"components": [{"name": "x", "kind": "composite"}]},
            "options.components[0].kind must name a non-composite",
        ),
        ({"components": [{"name": "x"}]}, "options.components[0].kind must be set"),
        (
            {"components": [{"name": "x", "kind": "math", "options": {"timeout_s": 0}}]},
            "options.components[0].options.timeout_s must be >= 0.001, got 0",
        ),
        (
            {"components": [{"name": "x", "kind": "regex", "options": {"patern": "a"}}]},
            "unknown config key options.components[0].options.patern (did you mean "
            "options.components[0].options.pattern?)",
        ),
    ],
)
def test_config_is_checked_and_names_the_dotted_key(options, message):
    with pytest.raises(ConfigError) as info:
        CompositeScorer("c", options=options)
    assert str(info.value).startswith(f"scorer 'c' (composite): {message}"), str(info.value)


def test_through_http_with_groups():
    comp = {
        "name": "reward",
        "kind": "composite",
        "options": {
            "components": [
                {"name": "exact", "kind": "exact_match", "weight": 1.0},
                {"name": "short", "kind": "length", "weight": -0.01},
            ],
            "group_normalize": True,
            "group_size": 2,
        },
    }
    with LiveServer(make_config([comp])) as server:
        items = [
            {"id": "p1-a", "response": "42", "reference": "42", "group_id": "p1"},
            {"id": "p1-b", "response": "41", "reference": "42", "group_id": "p1"},
            {"id": "p2-a", "response": "x", "reference": "y", "group_id": "p2"},
            {"id": "p2-b", "response": "x", "reference": "y", "group_id": "p2"},
            {"id": "lonely", "response": "x", "reference": "y", "group_id": "p3"},
        ]
        r = httpx.post(server.url + "/v1/score", json={"scorers": ["reward"], "items": items}, timeout=30)
        assert r.status_code == 200, r.text
        res = {x["id"]: x for x in r.json()["results"]}
        assert res["p1-a"]["scores"]["reward"] == pytest.approx(1 / math.sqrt(2))
        assert res["p1-b"]["scores"]["reward"] == pytest.approx(-1 / math.sqrt(2))
        assert res["p2-a"]["scores"]["reward"] == 0.0 and res["p2-b"]["scores"]["reward"] == 0.0
        assert res["lonely"]["errors"]["reward"]["code"] == "group_incomplete"
        info = next(
            s for s in httpx.get(server.url + "/v1/scorers").json()["scorers"] if s["name"] == "reward"
        )
        assert [c["name"] for c in info["extra"]["components"]] == ["exact", "short"]
        assert info["options"]["group_normalize"] is True and info["options"]["group_size"] == 2


def test_components_and_left_out_reach_the_http_response_and_the_python_client():
    """`details[<composite>]` through a real server: every item's components beside the total;
    `left_out` (with each left-out component's error) only for the items that were renormalised."""
    from rewardplane.serve.client import RewardClient

    comp = {
        "name": "reward",
        "kind": "composite",
        "options": {"components": [LEN, {**DOUBLE, "weight": 3.0}], "on_failure": "renormalize"},
    }
    with LiveServer(make_config([comp, {"name": "len", "kind": "length"}])) as server:
        items = [{"id": "ok", "response": "abcd"}, {"id": "left", "response": "DOWN"}]
        r = httpx.post(
            server.url + "/v1/score", json={"scorers": ["reward", "len"], "items": items}, timeout=30
        )
        assert r.status_code == 200, r.text
        ok, left = r.json()["results"]
        assert ok["details"] == {"reward": {"components": {"len": 4.0, "dbl": 4.0}}}
        assert ok["scores"]["reward"] == 16.0 and "len" not in ok["details"]  # a plain scorer has none
        assert left["scores"]["reward"] == 16.0
        assert left["details"]["reward"]["components"] == {"len": 4.0}
        assert left["details"]["reward"]["left_out"] == ["dbl"]
        assert left["details"]["reward"]["component_errors"]["dbl"]["code"] == "sandbox_error"
        with RewardClient(server.url) as client:
            got = client.score(items, ["reward"])
        assert got[0].details == {"reward": {"components": {"len": 4.0, "dbl": 4.0}}}
        assert got[1].details["reward"]["left_out"] == ["dbl"] and got[1].scores == {"reward": 16.0}
        assert (got[0].component("reward", "dbl"), got[1].component("reward", "len")) == (4.0, 4.0)
        assert got[1].component("reward", "dbl")["code"] == "sandbox_error"  # an error, never a number


HOSTED = [
    {"name": "rm", "kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu", "max_wait_ms": 1},
    {"name": "len", "kind": "length"},
    {  # listed before the scorer it names: the backend loads that one first
        "name": "reward",
        "kind": "composite",
        "options": {
            "components": [
                {"name": "model", "scorer": "rm", "weight": 0.5},
                {"name": "short", "kind": "length", "weight": 1.0},
            ]
        },
    },
    {
        "name": "inline",
        "kind": "composite",
        "options": {
            "components": [{"name": "m", "kind": "hf_seqcls", "shape": "tiny-text-rm", "device": "cpu"}]
        },
    },
]
ITEMS = [{"id": str(i), "prompt": "Say hi.", "response": "hi " * (i + 1)} for i in range(4)]


def post(server, scorers):
    return httpx.post(server.url + "/v1/score", json={"scorers": scorers, "items": ITEMS}, timeout=60)


def lifecycle(server, action=None, scorer=None):
    if action is None:
        r = httpx.get(server.url + "/v1/lifecycle", timeout=30)
    else:
        r = httpx.post(server.url + f"/v1/lifecycle/{action}", params={"scorer": scorer}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def hosted():
    with LiveServer(make_config(HOSTED)) as server:
        yield server


def test_a_hosted_component_is_the_hosted_scorer_loaded_once(hosted):
    from rewardplane.serve.backend import HostedScorer

    r = post(hosted, ["reward", "rm", "len"])
    assert r.status_code == 200, r.text
    for x in r.json()["results"]:
        assert x["scores"]["reward"] == pytest.approx(0.5 * x["scores"]["rm"] + x["scores"]["len"], abs=1e-6)
    composite = hosted.backend._scorers["reward"]
    assert isinstance(composite.scorers[0], HostedScorer)  # the server's `rm`, not a second copy
    state = lifecycle(hosted)["scorers"]
    assert state["reward"]["bytes_total"] == 0 and state["rm"]["bytes_total"] > 0
    info = next(s for s in httpx.get(hosted.url + "/v1/scorers").json()["scorers"] if s["name"] == "reward")
    model = info["extra"]["components"][0]
    assert model["scorer"] == "rm" and model["identity"] == hosted.backend.scorer_infos()["rm"].identity


def test_an_offloaded_hosted_component_refuses_the_composite_like_a_direct_request(hosted):
    before = post(hosted, ["reward"]).json()
    lifecycle(hosted, "offload", "rm")
    for names in (["rm"], ["reward"]):
        refused = post(hosted, names)
        assert refused.status_code == 503 and refused.json()["code"] == "offloaded", refused.text
        assert "'rm'" in refused.json()["message"] and refused.headers["retry-after"] == "1"
    assert post(hosted, ["len"]).status_code == 200
    lifecycle(hosted, "onload", "rm")
    assert post(hosted, ["reward"]).json() == before


def test_offloading_the_composite_moves_its_inline_models_only(hosted):
    first = post(hosted, ["inline"]).json()
    body = lifecycle(hosted, "offload", "inline")
    assert body["results"]["inline"]["transfer"]["bytes"] > 0
    state = body["lifecycle"]["scorers"]
    assert state["inline"]["bytes_on_device"] == 0 and state["inline"]["bytes_total"] > 0
    assert state["rm"]["state"] == "resident" and state["rm"]["bytes_on_device"] > 0
    assert post(hosted, ["inline"]).json()["code"] == "offloaded"
    assert lifecycle(hosted, "onload", "inline")["lifecycle"]["scorers"]["inline"]["bytes_on_device"] > 0
    assert post(hosted, ["inline"]).json() == first  # bit for bit after the round trip


def test_a_hosted_component_with_auto_onload_is_onloaded_by_the_composites_request():
    cfg = [{**HOSTED[0], "auto_onload": True}, HOSTED[2]]
    with LiveServer(make_config(cfg)) as server:
        first = post(server, ["reward"]).json()
        lifecycle(server, "offload", "rm")
        again = post(server, ["reward"])
        assert again.status_code == 200 and again.json() == first
        assert lifecycle(server)["scorers"]["rm"]["state"] == "resident"


def test_hosted_references_are_checked():
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "options.components[0]: names hosted scorer 'rm', which is scored as it is configured; drop ['kind']"
        ),
    ):
        CompositeScorer("c", options={"components": [{"name": "a", "scorer": "rm", "kind": "length"}]})
    with pytest.raises(ConfigError, match=re.escape("options.components[0].scorer must name another scorer")):
        CompositeScorer("c", options={"components": [{"name": "a", "scorer": "c"}]})
    with pytest.raises(
        ConfigError, match=re.escape("scorers[0].options.components[0].scorer must name another")
    ):
        make_config(
            [{"name": "c", "kind": "composite", "options": {"components": [{"name": "a", "scorer": "c"}]}}]
        )
    with pytest.raises(ConfigError, match="does not host"):
        build(components=[{"name": "a", "scorer": "rm"}])  # no server to resolve it
    missing = {"name": "c", "kind": "composite", "options": {"components": [{"name": "a", "scorer": "nope"}]}}
    with LiveServer(make_config([missing, {"name": "len", "kind": "length"}]), wait_ready=False) as server:
        deadline = time.monotonic() + 120
        while (status := httpx.get(server.url + "/health/ready").json()["scorers"]["c"]) in (
            "pending",
            "loading",
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert status.startswith("failed") and "nope" in status


def test_a_group_must_fit_one_batch_and_no_component_is_named_score():
    """Issue 37 item 9: a group larger than `max_batch_size` could never be normalised, so the
    config is refused at the dotted key; `score` is the total's key in UniRL's protocol and verl."""
    grouped = {"components": [LEN], "group_normalize": True, "group_size": 6}
    with pytest.raises(ConfigError) as info:
        make_config([{"name": "c", "kind": "composite", "max_batch_size": 4, "options": grouped}])
    assert "scorers[0].options.group_size: 6 items per group cannot fit max_batch_size 4" in str(info.value)
    with pytest.raises(ConfigError, match=re.escape("options.group_size: 6 items per group cannot fit")):
        CompositeScorer("c", options=grouped, max_batch_size=5)
    make_config([{"name": "c", "kind": "composite", "max_batch_size": 6, "options": grouped}])
    with pytest.raises(
        ConfigError, match=re.escape("options.components[1].name: 'score' is the total's key")
    ):
        CompositeScorer("c", options={"components": [LEN, {**HAS_X, "name": "score"}]})


def test_the_batcher_never_splits_a_group_across_batches():
    """Issue 37 item 9: `group_size: 6` under `max_batch_size: 32` with whole groups in one
    request. Batches of 32 in arrival order cut the sixth group (items 30-35) in two, and its
    items failed as `group_incomplete`; the batcher now closes a batch before a group that does
    not fit, so every group is normalised, even behind a stray partial group of another client."""
    comp = {
        "name": "reward",
        "kind": "composite",
        "max_batch_size": 32,
        "max_wait_ms": 50,
        "options": {"components": [LEN], "group_normalize": True, "group_size": 6},
    }
    with LiveServer(make_config([comp])) as server:
        stray = [{"id": f"s{k}", "response": "x" * k, "group_id": "stray"} for k in range(4)]
        whole = [
            {"id": f"g{g}-{k}", "response": "y" * (g + k + 1), "group_id": f"g{g}"}
            for g in range(10)
            for k in range(6)
        ]
        with httpx.Client(base_url=server.url, timeout=60) as client:
            bodies = [{"scorers": ["reward"], "items": items} for items in (stray, whole)]
            import concurrent.futures as cf

            with cf.ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(lambda b: client.post("/v1/score", json=b).json(), bodies))
        stray_out, whole_out = (a["results"] for a in answers)
        assert {r["errors"]["reward"]["code"] for r in stray_out} == {"group_incomplete"}
        assert all(r["errors"] == {} for r in whole_out), [r for r in whole_out if r["errors"]][:2]
        first = [r["scores"]["reward"] for r in whole_out[:6]]
        raw = [float(k + 1) for k in range(6)]
        mean, std = statistics.mean(raw), statistics.stdev(raw)
        assert first == pytest.approx([(v - mean) / std for v in raw])
