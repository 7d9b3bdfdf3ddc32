"""Images decoded once per process on arrival (rewardplane.serve.prefetch): same scores, one decode."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rewardplane.bench.corpus import generate_corpus
from rewardplane.deploy.config import DeviceProbe, parse_deploy_config
from rewardplane.deploy.gateway import GatewayBackend
from rewardplane.deploy.streams import OwnStream
from rewardplane.deploy.supervisor import SupervisorSettings
from rewardplane.deploy.transport import encode_items
from rewardplane.deploy.worker import RelayMetrics, WorkerServer
from rewardplane.serve.backend import InProcessBackend
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.images import ImageDecoder
from rewardplane.serve.prefetch import SharedDecoder, share_image_decoding
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.registry import build_scorer

BAD_JPEG = b"\xff\xd8garbage\xff\xd9"
SERVICE = {
    "scorers": [
        {"name": "l", "kind": "clip", "shape": "tiny-clip", "device": "cpu", "max_batch_size": 64,
         "max_wait_ms": 1, "options": {"seed": 0}},
        {"name": "h", "kind": "clip", "shape": "tiny-clip", "device": "cpu", "max_batch_size": 64,
         "max_wait_ms": 1, "options": {"seed": 1}},
        {"name": "len", "kind": "length", "max_batch_size": 64},
    ]
}  # fmt: skip


class CountingDecoder(ImageDecoder):
    def __init__(self) -> None:
        super().__init__("cpu", threads=2)
        self.seen: list[bytes] = []

    def decode(self, blobs):
        self.seen.extend(blobs)
        return super().decode(blobs)


def requests(n_requests=3, size=6):
    """Corpus items (JPEG and PNG of several sizes) plus a broken JPEG, in requests of `size`."""
    corpus = generate_corpus(n_requests * size - 1, seed=3)
    items = [ScoreItem(c.id, c.prompt, c.response, c.image) for c in corpus]
    items.append(ScoreItem("bad", "a prompt", "", BAD_JPEG))
    return [items[k : k + size] for k in range(0, len(items), size)]


def test_prefetch_decodes_each_image_once_and_release_drops_it():
    inner = CountingDecoder()
    shared = SharedDecoder(inner)
    (batch,) = requests(1, 4)
    blobs = [i.image for i in batch]

    async def go():
        # two scorers' calls for the same request arrive together, as the gateway sends them
        first, second = shared.hold(blobs), shared.hold(blobs)
        assert first == second == blobs
        await asyncio.gather(shared.ready(first), shared.ready(second))
        assert sorted(inner.seen) == sorted(blobs) and shared.held == len(blobs)
        out = shared.decode(blobs + [b"not held"])
        assert shared.hits == len(blobs) and inner.seen[-1] == b"not held"
        direct = ImageDecoder("cpu").decode(blobs)
        for got, want in zip(out[:-2], direct[:-1], strict=True):
            assert got.equal(want)
        assert isinstance(out[-2], Exception) and isinstance(out[-1], Exception)  # the bad JPEG; junk
        shared.release(blobs)
        assert shared.held == len(blobs)  # the second request still holds them
        shared.release(blobs)
        assert shared.held == 0
        shared.release(blobs)  # releasing what is gone is harmless
        shared.decode(blobs[:1])
        assert inner.seen[-1] == blobs[0]  # after release, a batch decodes for itself again

    asyncio.run(go())
    shared.close()


class GatedDecoder(CountingDecoder):
    """Its first two calls wait for `gate` (both CPU drainers busy), so requests pile up as under load."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.calls = threading.Event(), 0

    def decode(self, blobs):
        self.calls += 1
        if self.calls <= 2:
            assert self.gate.wait(60)
        return super().decode(blobs)

    async def until_calls(self, n: int, ceiling_s: float = 30.0) -> None:
        """Until a drainer thread has made its `n`th call (a thread starts late on a loaded
        machine: a fixed sleep let two requests reach one drainer)."""
        deadline = time.monotonic() + ceiling_s
        while self.calls < n:
            assert time.monotonic() < deadline, f"{self.calls} decode calls, waiting for {n}"
            await asyncio.sleep(0.005)


def test_requests_arriving_while_every_drainer_is_busy_are_decoded_together():
    inner = GatedDecoder()
    shared = SharedDecoder(inner)
    blobs = [[i.image for i in b] for b in requests(5, 3)]

    async def go():
        held = []
        for n, b in enumerate(blobs[:2], 1):  # on the CPU two decode calls run at once: one per request
            held.append(shared.hold(b))
            await inner.until_calls(n)  # its drainer is in its call before the next request comes
        held += [shared.hold(b) for b in blobs[2:]]  # both drainers busy: these three queue
        inner.gate.set()
        await asyncio.gather(*(shared.ready(h) for h in held))
        return held

    held = asyncio.run(go())
    assert inner.calls == shared.prefetch_calls == 3  # the three later requests: one call
    assert sorted(inner.seen) == sorted(b for bs in blobs for b in bs)
    out = shared.decode(blobs[3])
    direct = ImageDecoder("cpu").decode(blobs[3])
    assert all(got.equal(want) for got, want in zip(out, direct, strict=True))
    for h in held:
        shared.release(h)
    assert shared.held == 0
    shared.close()


def test_closing_wakes_requests_whose_images_were_never_decoded():
    inner = GatedDecoder()
    shared = SharedDecoder(inner)
    first, second, third = (i.image for i in requests(1, 3)[0])

    async def go():
        for n, blob in enumerate((first, second), 1):  # both drainers block in their calls
            shared.hold([blob])
            await inner.until_calls(n)
        waiting = shared.hold([third])  # queued behind them
        shared.close()
        await asyncio.wait_for(shared.ready(waiting), 5)  # woken, not hung
        inner.gate.set()

    asyncio.run(go())
    (woken,) = shared.decode([third])
    # the close's own error, not a decode failure, and the image never reached the decoder
    assert isinstance(woken, RuntimeError) and str(woken) == "image decoder closed"
    assert third not in inner.seen
    (decoded,) = shared.decode([first])  # what a drainer had started still completes as pixels
    assert decoded.equal(ImageDecoder("cpu").decode([first])[0])


def test_held_images_are_capped_and_the_rest_decode_in_their_batch():
    inner = CountingDecoder()
    shared = SharedDecoder(inner, max_held=3)
    (batch,) = requests(1, 5)
    blobs = [i.image for i in batch]
    held = shared.hold(blobs)
    assert held == blobs[:3] and shared.held == 3  # over the cap: not held, not decoded ahead
    assert shared.hold(blobs[:2]) == blobs[:2]  # already held images can always be shared
    asyncio.run(shared.ready(held))
    assert sorted(inner.seen) == sorted(blobs[:3])
    out = shared.decode(blobs[:4])
    assert shared.hits == 3 and inner.seen[-1] == blobs[3]  # the fourth decodes in the batch
    direct = ImageDecoder("cpu").decode(blobs[:4])
    assert all(got.equal(want) for got, want in zip(out, direct, strict=True))
    shared.release(held)
    shared.release(blobs[:2])
    assert shared.held == 0
    shared.close()


def test_share_image_decoding_gives_image_scorers_one_decoder_per_device():
    cfg = config_from_dict(SERVICE)
    scorers = [build_scorer(s) for s in cfg.scorers]
    for s in scorers:
        s.load()
    shared = share_image_decoding(scorers)
    assert set(shared) == {"l", "h"} and shared["l"] is shared["h"]
    assert scorers[0].decoder is scorers[1].decoder is shared["l"]
    assert shared["l"].max_held == 4 * 64  # four of the largest batch ahead
    scorers[2].max_batch_size = 512  # a text scorer's batch does not size the image cap
    for s in scorers[:2]:
        s.decoder = s.decoder.inner
    assert share_image_decoding(scorers)["l"].max_held == 4 * 64
    assert not hasattr(scorers[2], "decoder")


@pytest.mark.parametrize("share", [True, False])
def test_consolidated_worker_scores_equal_per_scorer_decoding_exactly(share):
    """Requests sent one at a time (each batch = one request, as in the reference), every scorer's
    call for a request concurrently, as the gateway does it. Shared decoding must change nothing."""
    cfg = config_from_dict(SERVICE)
    reference = [build_scorer(s) for s in cfg.scorers[:2]]
    for s in reference:
        s.load()
    batches = requests()
    want = {s.name: [v for b in batches for v in s.score_batch(b)] for s in reference}

    async def go():
        scorers = [build_scorer(s) for s in cfg.scorers]
        metrics = RelayMetrics()
        backend = InProcessBackend(
            cfg.model_copy(update={"prefetch_images": share}),
            metrics=metrics,
            scorers=[OwnStream(s) for s in scorers],
        )
        await backend.start()
        images = backend.images
        assert set(images) == ({"l", "h"} if share else set())
        server = WorkerServer(backend, metrics)
        got: dict[str, list] = {"l": [], "h": [], "len": []}
        try:
            for batch in batches:
                raw, body = encode_items(batch)
                answers = await asyncio.gather(
                    *(server.handle("score", {"scorer": n, "items": raw}, body) for n in got)
                )
                for name, (header, _) in zip(got, answers, strict=True):
                    got[name] += header["results"]
        finally:
            await backend.stop()
        return got, images

    got, images = asyncio.run(go())
    for name in ("l", "h"):
        assert [r.get("score") for r in got[name][:-1]] == want[name][:-1]  # bit-equal
        assert got[name][-1]["error"]["code"] == "bad_input"  # refused at admission (prepare)
        assert isinstance(want[name][-1], ItemError) and want[name][-1].code == "bad_image"
    assert all("score" in r for r in got["len"])
    if share:
        shared = images["l"]
        n_images = sum(len(b) for b in batches)
        assert shared.decoded == n_images  # once per image, not once per image per scorer
        # each scorer reads every good image twice (admission check, batch); the bad one never
        assert shared.hits == 4 * (n_images - 1) and shared.held == 0


def test_service_backend_decodes_a_requests_images_on_arrival_and_scores_exactly():
    """`rewardplane serve` (one InProcessBackend, plain scorers): the batch reads prefetched pixels."""
    cfg = config_from_dict({"scorers": [SERVICE["scorers"][0]]})
    reference = build_scorer(cfg.scorers[0])
    reference.load()
    batches = requests(2, 5)

    async def go():
        backend = InProcessBackend(cfg)
        await backend.start()
        try:
            shared = backend.images["l"]
            results = [await backend.score("l", batch) for batch in batches]
            return results, shared.decoded, shared.hits, shared.held
        finally:
            await backend.stop()

    results, decoded, hits, held = asyncio.run(go())
    n_images = sum(len(b) for b in batches)
    # every image decoded once, on arrival; admission and the batch read each good one from it
    assert (decoded, hits, held) == (n_images, 2 * (n_images - 1), 0)
    for batch, got in zip(batches, results, strict=True):
        want = reference.score_batch(batch)
        assert [r for r in got if not isinstance(r, ItemError)] == [
            w for w in want if not isinstance(w, ItemError)
        ]
    assert results[-1][-1].code == "bad_input"


def test_prefetch_images_false_decodes_in_the_batch_with_the_same_scores():
    cfg = config_from_dict({"scorers": [SERVICE["scorers"][0]], "prefetch_images": False})
    reference = build_scorer(cfg.scorers[0])
    reference.load()
    (batch,) = requests(1, 5)

    async def go():
        backend = InProcessBackend(cfg)
        await backend.start()
        try:
            return backend.images, await backend.score("l", batch)
        finally:
            await backend.stop()

    images, got = asyncio.run(go())
    assert images == {}  # nothing prefetched: the scorer kept its own decoder
    want = reference.score_batch(batch)
    assert got[:-1] == want[:-1] and got[-1].code == "bad_input" and want[-1].code == "bad_image"


def test_consolidated_gateway_over_real_worker_matches_in_process_scores():
    """The worker process wires it up (prebuilt scorers, shared decoder) and scores stay exact."""
    doc = {"mode": "consolidated", "gpus": [], "scorers": [dict(s) for s in SERVICE["scorers"][:2]]}
    probe = DeviceProbe(cuda_available=False, gpu_count=0, control_binary=None)
    gw = GatewayBackend(parse_deploy_config(doc, probe), settings=SupervisorSettings(health_interval_s=0.5))
    cfg = config_from_dict(SERVICE)
    (batch,) = requests(1, 5)
    want = {}
    for spec in cfg.scorers[:2]:
        scorer = build_scorer(spec)
        scorer.load()
        want[spec.name] = scorer.score_batch(batch)

    async def go():
        await gw.start()
        try:
            assert gw.ready()[0], gw.ready()
            scores = await asyncio.gather(gw.score("l", batch), gw.score("h", batch))
            return dict(zip(("l", "h"), scores, strict=True))
        finally:
            await gw.stop()

    got = asyncio.run(go())
    for name in ("l", "h"):
        assert got[name][:-1] == want[name][:-1]
        assert got[name][-1].code == "bad_input"  # refused at admission in the worker


@pytest.mark.gpu
def test_cuda_prefetch_puts_pillow_images_on_the_device_and_keeps_scores_exact():
    from rewardplane.serve.scorers.registry import ScorerSpec

    spec = ScorerSpec(name="c", kind="clip", shape="tiny-clip", device="cuda")
    own, shared_user = build_scorer(spec), build_scorer(spec)
    own.load()
    shared_user.load()
    shared_user.model.load_state_dict(own.model.state_dict())
    (batch,) = requests(1, 8)
    want = own.score_batch(batch)
    shared = share_image_decoding([shared_user])["c"]
    blobs = [i.image for i in batch]
    asyncio.run(shared.ready(shared.hold(blobs)))
    held = shared.decode(blobs)
    assert all(t.device.type == "cuda" for t in held[:-1]), [t.device for t in held[:-1]]
    got = shared_user.score_batch(batch)
    assert got[:-1] == want[:-1]  # bit-equal: the same pixels reach the same kernels
    assert got[-1].code == want[-1].code == "bad_image"
    shared.release(blobs)
    assert shared.held == 0


def test_own_stream_is_a_transparent_wrapper_on_cpu():
    (spec,) = config_from_dict({"scorers": [SERVICE["scorers"][0]]}).scorers
    inner = build_scorer(spec)
    wrapped = OwnStream(inner)
    wrapped.load()
    assert wrapped.stream is None  # CPU: nothing to overlap
    assert (wrapped.name, wrapped.kind, wrapped.modality) == ("l", "clip", "image_text")
    assert wrapped.info() == inner.info() and wrapped.warmup_item() == inner.warmup_item()
    (batch,) = requests(1, 3)
    assert wrapped.score_batch(batch)[:-1] == inner.score_batch(batch)[:-1]


@pytest.mark.gpu
def test_cuda_consolidated_scorers_on_own_streams_with_shared_decode_score_exactly():
    """Two CLIP scorers in one process, each on its own stream, reading one shared decode, from
    two threads at once (as the consolidated worker runs them): bit-equal to scoring alone."""
    from concurrent.futures import ThreadPoolExecutor

    from rewardplane.serve.scorers.registry import ScorerSpec

    specs = [ScorerSpec(name=n, kind="clip", shape="tiny-clip", device="cuda", options={"seed": k})
             for k, n in enumerate("lh")]  # fmt: skip
    alone = [build_scorer(s) for s in specs]
    hosted = [OwnStream(build_scorer(s)) for s in specs]
    for a, h in zip(alone, hosted, strict=True):
        a.load()
        h.load()
        h.inner.model.load_state_dict(a.model.state_dict())
        assert h.stream is not None
    batches = requests(4, 8)
    want = [[a.score_batch(b) for b in batches] for a in alone]
    shared = share_image_decoding([h.inner for h in hosted])["l"]
    blobs = [i.image for b in batches for i in b]
    asyncio.run(shared.ready(shared.hold(blobs)))
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda h: [h.score_batch(b) for b in batches], hosted))
    shared.release(blobs)
    flat = [[getattr(v, "code", v) for b in per_scorer for v in b] for per_scorer in (*want, *got)]
    assert flat[2:] == flat[:2]  # bit-equal scores; the broken JPEG is bad_image either way
    assert flat[0][-1] == "bad_image" and all(isinstance(v, float) for v in flat[0][:-1])
