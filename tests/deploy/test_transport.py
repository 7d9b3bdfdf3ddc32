"""The gateway↔worker frame protocol: round trips, concurrency, and clean failures."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import tempfile

import pytest

from rewardplane.core.errors import RewardplaneError
from rewardplane.deploy.gateway import decode_batches, decode_timing
from rewardplane.deploy.transport import (
    RemoteError,
    TransportClient,
    TransportError,
    WorkerLost,
    decode_items,
    decode_results,
    encode_frame,
    encode_items,
    encode_results,
    read_frame,
    serve_unix,
)
from rewardplane.deploy.worker import RelayMetrics, WorkerServer
from rewardplane.serve.backend import InProcessBackend
from rewardplane.serve.metrics import BatchStats
from rewardplane.serve.protocol import DetailedScore, ItemError, ScoreItem
from support.serve import RecordingScorer, make_config

RICH = ScoreItem(
    id="4",
    prompt="2+2?",
    response="4",
    reference={"answer": 4, "alternatives": ["four"]},
    group_id="g1",
    metadata={"task": "math", "n": [1, 2.5, None]},
)


@pytest.fixture
def sock_path():
    d = tempfile.mkdtemp(prefix="rkt-", dir="/tmp")
    yield os.path.join(d, "s.sock")
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)


def test_items_round_trip_with_raw_image_bytes():
    items = [
        ScoreItem(id="1", prompt="p", response="r", image=b"\x89PNG\x00\xff"),
        ScoreItem(id="2", prompt=[{"role": "user", "content": "hi"}], response="x"),
        ScoreItem(id="3", prompt="p", response="r", image=b"", reference="gold"),
        RICH,
    ]
    raw, body = encode_items(items)
    assert body == b"\x89PNG\x00\xff"
    assert decode_items(raw, body) == items


@pytest.mark.parametrize("ref", [[0, 99], [-1, 2], "0:2", [0]])
def test_bad_image_reference_is_a_protocol_error(ref):
    with pytest.raises(TransportError, match="bad image reference"):
        decode_items([{"id": "1", "prompt": "p", "response": "r", "image": ref}], b"ab")


def test_frames_refuse_nan_and_non_json():
    with pytest.raises(ValueError):
        encode_frame({"score": float("nan")})

    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">II", 3, 0) + b"{x}")
        reader.feed_eof()
        with pytest.raises(TransportError, match="not JSON"):
            await read_frame(reader)
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">II", 2**31, 0))
        reader.feed_eof()
        with pytest.raises(TransportError, match="too large"):
            await read_frame(reader)

    asyncio.run(go())


def test_concurrent_requests_are_matched_by_id(sock_path):
    async def handler(op, header, body):
        if op == "fail":
            raise RewardplaneError("nope", code="queue_full")
        if op == "crash":
            raise ValueError("boom")
        await asyncio.sleep(0.05 * (5 - header["n"] % 5) / 5)  # answer out of order
        return {"n": header["n"], "size": len(body)}, body[::-1]

    async def go():
        server = await serve_unix(sock_path, handler)
        assert os.stat(sock_path).st_mode & 0o077 == 0
        client = await TransportClient.connect(sock_path)
        results = await asyncio.gather(*(client.call("echo", {"n": i}, bytes([i]) * i) for i in range(40)))
        assert [(h["n"], h["size"], b) for h, b in results] == [(i, i, bytes([i]) * i) for i in range(40)]
        with pytest.raises(RemoteError) as info:
            await client.call("fail")
        assert info.value.code == "queue_full"
        with pytest.raises(RemoteError) as info:
            await client.call("crash")
        assert info.value.code == "internal"
        assert client.in_flight == 0
        await client.close()
        server.close()
        await server.wait_closed()

    asyncio.run(go())


def test_in_flight_requests_fail_with_worker_lost_when_the_peer_dies(sock_path):
    async def go():
        started = asyncio.Event()
        holder = {}

        async def on_conn(reader, writer):
            holder["w"] = writer
            await read_frame(reader)
            started.set()

        server = await asyncio.start_unix_server(on_conn, path=sock_path)
        client = await TransportClient.connect(sock_path)
        call = asyncio.ensure_future(client.call("score", {"items": []}))
        await started.wait()
        holder["w"].transport.abort()  # the worker vanishes mid-request
        with pytest.raises(WorkerLost):
            await call
        assert client.closed
        with pytest.raises(WorkerLost):
            await client.call("score")
        server.close()

    asyncio.run(go())


def test_relayed_timing_and_batches_are_validated_not_trusted():
    """A confused worker can at worst lose its metrics; it cannot fail a request or add labels."""
    good = {"scorer": "a", "inference_s": 0.5, "queue_delays": [0.1, 0.2], "outcomes": ["ok", "non_finite"]}
    bad = [
        {**good, "scorer": "not-mine"},
        {**good, "inference_s": -1},
        {**good, "queue_delays": [0.1]},
        {**good, "queue_delays": [0.1, True]},
        {**good, "outcomes": ["ok", 3]},
        {**good, "queue_delays": [], "outcomes": []},
        "junk",
    ]
    assert decode_batches([good, *bad], {"a"}) == [BatchStats("a", 0.5, (0.1, 0.2), ("ok", "non_finite"))]
    assert decode_batches("junk", {"a"}) == []
    tokens = {"real": 10, "computed": 12, "padding": 2, "made_up": 5, "shared": -1}
    (relayed,) = decode_batches([{**good, "tokens": tokens}], {"a"})
    assert relayed.tokens == {"real": 10, "computed": 12, "padding": 2}  # no new labels, no negatives
    assert decode_timing({"queue_s": 0.25, "inference_s": 1}) == (0.25, 1.0)
    assert decode_timing({"queue_s": "x", "inference_s": -3}) == (0.0, 0.0) == decode_timing(None)


def test_reference_group_id_and_metadata_reach_a_worker_scorer(sock_path):
    """Gateway side `encode_items` → frame → `WorkerServer` → the worker's batcher → its scorer."""

    async def go():
        metrics = RelayMetrics()
        backend = InProcessBackend(
            make_config([{"name": "rec", "kind": "recording"}]),
            metrics=metrics,
            scorers=[RecordingScorer("rec")],
        )
        await backend.start()
        server = await serve_unix(sock_path, WorkerServer(backend, metrics).handle)
        client = await TransportClient.connect(sock_path)
        items = [RICH, ScoreItem(id="5", prompt="p", response="r", image=b"\xff\xd8", reference="gold")]
        raw, body = encode_items(items)
        header, _ = await client.call("score", {"scorer": "rec", "items": raw}, body)
        await client.close()
        server.close()
        await backend.stop()
        return decode_results(header["results"], len(items)), items

    RecordingScorer.seen.clear()
    results, items = asyncio.run(go())
    assert results == [1.0, 1.0]
    assert RecordingScorer.seen == items


def test_a_score_detail_crosses_the_worker_transport():
    """A composite's `left_out` (a `DetailedScore`) survives encode → JSON → decode; a bare float
    carries no detail key, so workers and gateways of the previous release still agree."""
    detailed = DetailedScore(2.5, {"left_out": ["rm"]})
    wire = json.loads(json.dumps(encode_results([detailed, 1.0, ItemError("timeout", "slow")])))
    assert wire[1] == {"score": 1.0}
    back = decode_results(wire, 3)
    assert back[0] == 2.5 and isinstance(back[0], DetailedScore) and back[0].detail == {"left_out": ["rm"]}
    assert back[1] == 1.0 and not isinstance(back[1], DetailedScore)
    assert back[2] == ItemError("timeout", "slow")
    (nan,) = decode_results([{"score": None, "detail": {"left_out": ["x"]}}], 1)
    assert isinstance(nan, ItemError)  # a detail never turns a non-number into a score
