import asyncio
import json
import time

import pytest

from rewardplane.bench.corpus import generate_corpus
from rewardplane.bench.loadgen import CallResult, LoadGenerator, timed_closed_loop
from rewardplane.bench.sweep import SCHEMA_VERSION, BenchConfig, Sweep, load_schema, run_bench
from rewardplane.bench.windows import WindowPolicy
from rewardplane.core.errors import UsageError
from rewardplane.serve.protocol import item_to_wire
from support.bench_fake_server import fake_score, make_app, serve_in_thread

CORPUS = generate_corpus(12, seed=5)
FAST = WindowPolicy(window_s=0.15, stable_windows=3, tolerance=0.5, max_windows=4)
ONE_WINDOW = WindowPolicy(window_s=0.15, stable_windows=1, max_windows=1)  # failing points never settle


def config(url, scorers, *, policy=FAST, rates=(), duration_s=None, token=None, **sweep):
    window = dict(window_s=policy.window_s, stable_windows=policy.stable_windows,
                  tolerance=policy.tolerance, max_windows=policy.max_windows)  # fmt: skip
    load = Sweep(
        **{"batch": [3], "concurrency": [2], "requests": 2, "warmup": 1, "slo_ms": 10_000, **window, **sweep}
    )
    extra = {"duration_s": duration_s} if duration_s is not None else {}
    return BenchConfig(
        url=url, scorers=scorers, sweep=load, rates=list(rates), token=token, monitor_interval_s=0.05, **extra
    )


def validate_schema(run):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(json.dumps(run)), load_schema())


def test_closed_loop_run_is_valid_and_captures_every_score():
    with serve_in_thread(make_app(["a", "b"], mode="shared")) as url:
        run = run_bench(config(url, ["a", "b"], batch=[1, 3], concurrency=[1, 2]), CORPUS, {"source": "t"})
    validate_schema(run)
    assert run["schema_version"] == SCHEMA_VERSION and run["mode"] == "shared"
    assert [(p["batch"], p["concurrency"]) for p in run["points"]] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    totals = run["totals"]
    assert totals["failed"] == 0 and totals["ok"] == totals["requests"] > 0
    for p in run["points"]:
        assert p["requests"]["ok"] >= p["concurrency"] * 3  # warm-up + 2 measured per client
        assert p["items_per_s"] > 0 and p["scores_per_s"] == pytest.approx(2 * p["items_per_s"])
        assert p["latency_ms"]["p50"] <= p["latency_ms"]["p95"] <= p["latency_ms"]["max"]
        assert p["batch_size_mean"] == {"a": p["batch"], "b": p["batch"]}  # from /metrics deltas
        assert p["server_timing_ms"]["queue_fraction"] == pytest.approx(0.25, abs=0.01)
        assert 1 <= len(p["windows"][0]) <= FAST.max_windows
        assert p["goodput_items_per_s"] == pytest.approx(p["items_per_s"])  # SLO far above latency
    by_id = {item.id: item for item in CORPUS}
    assert set(run["scores"]) == set(by_id)
    for item_id, scores in run["scores"].items():
        for scorer in ("a", "b"):
            assert scores[scorer] == pytest.approx(fake_score(scorer, item_to_wire(by_id[item_id])))
    assert run["score_spread"] == {"a": 0.0, "b": 0.0}
    assert "token" not in run["config"]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("nan", "score_non_finite"),
        ("inf", "score_non_finite"),
        ("bool", "score_bool"),
        ("none", "score_none"),
        ("string", "score_non_numeric"),
        ("missing", "missing_scorer"),
        ("error", "scorer_error"),
        ("drop_id", "missing_id"),
        ("extra_id", "extra_id"),
        ("reorder", "order_mismatch"),
        ("http500", "http_500"),
    ],
)
def test_every_injected_fault_fails_by_reason(fault, reason):
    with serve_in_thread(make_app(["good", "bad"], faults={"bad": fault})) as url:
        cfg = config(url, ["good", "bad"], batch=[2], concurrency=[1], policy=ONE_WINDOW)
        run = run_bench(cfg, CORPUS, {"source": "t"})
    validate_schema(run)
    totals = run["totals"]
    assert totals["ok"] == 0 and totals["failed"] == totals["requests"] > 0
    assert set(totals["failures_by_reason"]) == {reason}
    assert run["points"][0]["requests"]["warmup_failed"] == 1
    bad_scores = [s["bad"] for s in run["scores"].values() if "bad" in s]
    assert all(isinstance(v, float) and v == v for v in bad_scores)  # nothing invalid was kept
    if fault == "error":
        assert totals["item_errors_by_code"]["non_finite"] > 0


def test_bearer_token_is_sent():
    with serve_in_thread(make_app(["a"], token="s3cret")) as url:
        denied = run_bench(config(url, ["a"], concurrency=[1]), CORPUS, {"source": "t"})
        allowed = run_bench(config(url, ["a"], concurrency=[1], token="s3cret"), CORPUS, {"source": "t"})
    assert set(denied["totals"]["failures_by_reason"]) == {"http_401"}
    assert allowed["totals"]["failed"] == 0


def test_open_loop_measures_from_the_scheduled_time():
    """A client that falls behind its timetable must charge the delay to latency. The stall blocks
    the event loop inside the first measured send, so it lies inside the timetable however slow
    the set-up is on a loaded machine; the check is an ordering, no absolute time: every arrival
    due before the stall ended has a latency of at least the time from its due time to that end."""
    stall_s = 0.3
    stall_end: list[float] = []

    async def scenario(url):
        gen = LoadGenerator(url, ["a"], CORPUS, policy=WindowPolicy(window_s=0.25, max_windows=4))
        send = gen.send

        async def stalling_send(client, body, ids, scheduled, phase):
            if phase == "measure" and not stall_end:
                time.sleep(stall_s)  # block the event loop: arrivals due now are sent late
                stall_end.append(time.perf_counter())
            return await send(client, body, ids, scheduled, phase)

        gen.send = stalling_send
        return await gen.open_loop(batch=1, rate=100.0, duration_s=0.5, warmup=0, seed=1)

    with serve_in_thread(make_app(["a"], delay_ms=0.5)) as url:
        m = asyncio.run(scenario(url))
    measured = [r for r in m.records if r.phase == "measure"]
    assert 20 < len(measured) < 100  # ~50 Poisson arrivals
    late = [r for r in measured if r.scheduled < stall_end[0]]
    assert len(late) >= 5  # ~30 arrivals fall due during the stall
    for r in late:
        assert r.end >= stall_end[0] and r.latency_ms >= (stall_end[0] - r.scheduled) * 1000


def test_open_loop_point_and_schema():
    with serve_in_thread(make_app(["a"])) as url:
        run = run_bench(config(url, ["a"], rates=[40.0], duration_s=0.45), CORPUS, {"source": "t"})
    validate_schema(run)
    (point,) = run["points"]
    assert point["loop"] == "open" and point["rate"] == 40.0 and point["concurrency"] is None
    assert point["requests"]["failed"] == 0 and len(point["windows"][0]) == 3


def test_batch_larger_than_corpus_and_unreachable_service_are_usage_errors():
    with serve_in_thread(make_app(["a"])) as url, pytest.raises(UsageError, match="larger than the corpus"):
        run_bench(config(url, ["a"], batch=[13]), CORPUS, {"source": "t"})
    with pytest.raises(UsageError, match="cannot reach"):
        run_bench(config("http://127.0.0.1:9", ["a"]), CORPUS, {"source": "t"})


def test_timed_closed_loop_counts_only_what_completes_in_the_window():
    """The closed loop benchmarks/serve.py and benchmarks/deploy_overhead.py share."""
    calls: list[int] = []

    async def call(k):
        calls.append(k)
        await asyncio.sleep(0.01)
        return CallResult(3, 1, queue_ms=2.0) if k % 2 else CallResult(4, 0)

    cell = asyncio.run(timed_closed_loop(call, concurrency=2, warmup_s=0.05, measure_s=0.2))
    assert {k % 2 for k in calls} == {0, 1} and len(calls) == len(set(calls))  # disjoint k per client
    assert 5 <= cell.requests < len(calls)  # warm-up calls are not counted
    assert cell.items_per_s == pytest.approx((3.5 * cell.requests) / 0.2, rel=0.35)
    assert cell.failed_items > 0 and cell.mean_queue_ms == 2.0 and cell.mean_inference_ms is None
    assert 10 <= cell.p50_ms <= cell.p99_ms
