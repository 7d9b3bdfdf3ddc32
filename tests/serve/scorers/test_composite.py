"""The `composite` scorer: aggregation modes, failure propagation (fail / renormalize, required
components), GRPO group normalisation with its degenerate cases, and one pass through HTTP."""

from __future__ import annotations

import math
import statistics

import httpx
import pytest

from rewardkit.core.errors import ConfigError
from rewardkit.serve.scorers.base import ItemError, ScoreItem
from rewardkit.serve.scorers.composite import CompositeScore, CompositeScorer, group_normalize
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


def test_renormalize_leaves_out_and_says_so():
    s = build(on_failure="renormalize", components=[{**LEN, "weight": 1.0}, {**DOUBLE, "weight": 3.0}])
    ok, err = s.score_batch([item("abcd"), item("ERR")])
    assert ok == 16.0 and not isinstance(ok, CompositeScore)
    # only `len` is left: 3 * (1 + 3) / 1 -- the weights of the rest are rescaled to the total
    assert err == 12.0 and isinstance(err, CompositeScore) and err.left_out == ("dbl",)
    assert s.info().extra["left_out_counts"] == {"len": 0, "dbl": 1}
    mean = build(aggregation="mean", on_failure="renormalize", components=[LEN, DOUBLE])
    (m,) = mean.score_batch([item("ERR")])
    assert m == 3.0 and m.left_out == ("dbl",)


def test_renormalize_still_fails_for_required_or_all_failed():
    s = build(on_failure="renormalize", components=[LEN, {**DOUBLE, "required": True}])
    (got,) = s.score_batch([item("ERR")])
    assert isinstance(got, ItemError) and got.code == "bad_image"
    both = build(on_failure="renormalize", components=[DOUBLE, {**DOUBLE, "name": "dbl2"}])
    (got,) = both.score_batch([item("ERR")])
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


def test_config_is_checked():
    with pytest.raises(ConfigError, match="aggregation"):
        CompositeScorer("c", options={"components": [LEN], "aggregation": "median"})
    with pytest.raises(ConfigError, match="group_size"):
        CompositeScorer("c", options={"components": [LEN], "group_normalize": True})
    with pytest.raises(ConfigError, match="weights have no meaning"):
        CompositeScorer("c", options={"components": [{**LEN, "weight": 2}], "aggregation": "min"})
    with pytest.raises(ConfigError, match="unique"):
        CompositeScorer("c", options={"components": [LEN, LEN]})
    with pytest.raises(ConfigError, match="components"):
        CompositeScorer("c", options={})
    with pytest.raises(ConfigError, match="unknown component kind"):
        build(components=[{"name": "x", "kind": "nope"}])


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
        assert info["extra"]["group_normalize"]["group_size"] == 2


def test_left_out_reaches_the_http_response_and_the_python_client():
    """`details[<composite>].left_out` through a real server: present only for the items that
    were renormalised, absent from every other item (old clients see the bodies they knew)."""
    from rewardkit.serve.client import RewardClient

    comp = {
        "name": "reward",
        "kind": "composite",
        "options": {"components": [LEN, {**DOUBLE, "weight": 3.0}], "on_failure": "renormalize"},
    }
    with LiveServer(make_config([comp, {"name": "len", "kind": "length"}])) as server:
        items = [{"id": "ok", "response": "abcd"}, {"id": "left", "response": "ERR"}]
        r = httpx.post(
            server.url + "/v1/score", json={"scorers": ["reward", "len"], "items": items}, timeout=30
        )
        assert r.status_code == 200, r.text
        ok, left = r.json()["results"]
        assert "details" not in ok and ok["scores"]["reward"] == 16.0
        assert left["scores"]["reward"] == 12.0 and left["details"] == {"reward": {"left_out": ["dbl"]}}
        with RewardClient(server.url) as client:
            got = client.score(items, ["reward"])
        assert got[0].details == {} and got[1].details == {"reward": {"left_out": ["dbl"]}}
        assert got[1].scores == {"reward": 12.0}
