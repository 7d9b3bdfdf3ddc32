"""Decode each image once per process, when its request arrives, for every image scorer there.

Why: a CLIP scorer decoded its images inside its own batch, on the batch's critical path,
serially with the forward; and a request scored by several image scorers (the gateway sends
its items once per scorer; a service's multi-scorer request fans out the same way) decoded
every image once per scorer. A consolidated worker (one process, both towers) therefore
decoded every image twice, serially with the forwards; the fp16 H200 run measured it at 58 %
GPU utilisation, host-bound. Here `InProcessBackend` (the service and every deploy worker)
decodes a request's images as soon as the request arrives (off the event loop, while the GPU
runs earlier batches), keeps the tensors while any request that holds them is in flight, and
the scorers' batches read them instead of decoding.

Scores do not change: the scorer's own decoder runs on the same bytes, and everything after
decoding (resize, crop, normalise, forward) is the scorer's unchanged code. A miss (the
warm-up, a request already released) decodes in the batch exactly as before.

On CUDA the prefetch runs on a side stream: nvJPEG's output and the pinned-memory copies of
what Pillow decoded (PNG, JPEGs nvJPEG refuses) are ordered there and complete before anyone
reads them, so they never wait behind a forward queued on a scorer's stream (a copy from
pageable memory synchronises its whole stream). Each reader records its own stream on the
tensor, so the caching allocator cannot reuse the memory while that reader's kernels run.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rewardplane.serve.images import ImageDecoder

log = logging.getLogger(__name__)


class _Entry:
    __slots__ = ("done", "holders")

    def __init__(self) -> None:
        self.done: Future[object] = Future()  # the decoded tensor, or the exception decoding raised
        self.holders = 0


class SharedDecoder:
    """Drop-in for a scorer's `ImageDecoder` (`decode`, `device`, `on_device`), plus prefetching.

    `hold(blobs)` takes one reference per blob, queues the ones nobody holds yet for decoding (a
    drainer decodes everything queued in one call) and returns the blobs it holds;
    `ready(held)` waits until they are decoded; `release(held)` drops the references.
    `decode(blobs)` (the scorer's call) reads held entries, waiting for one still being
    decoded, and decodes the rest itself. At most `max_held` distinct images are held:
    decoded pixels are far larger than their JPEG, and a long queue must not hold them all; past
    the cap a request's new images are decoded in its batch, as without prefetching.
    """

    def __init__(self, inner: ImageDecoder, *, max_held: int = 256) -> None:
        self.inner = inner
        self.device = inner.device
        self.max_held = max_held
        self._lock = threading.Lock()
        self._entries: dict[bytes, _Entry] = {}
        # At most `_max_drainers` decode calls run at once, and requests that arrive while they
        # are all busy are decoded together in the next call. On CUDA that is one call at a
        # time: one nvJPEG batch and one stream sync for everything waiting (one call per
        # request made small concurrent requests wait on each other's GPU round trips,
        # docs/benchmarks/serve.md). Pillow on the CPU gains from two calls in parallel.
        self._max_drainers = 1 if str(self.device).startswith("cuda") else 2
        self._pool = ThreadPoolExecutor(max_workers=self._max_drainers, thread_name_prefix="image-prefetch")
        self._pending: list[tuple[bytes, _Entry]] = []
        self._drainers = 0
        self._stream: Any = None
        self.decoded = 0  # images this object decoded, in prefetch or on a miss
        self.hits = 0  # images a scorer read from a held entry
        self.prefetch_calls = 0  # decode calls the drainer made (each covers every waiting request)

    @property
    def on_device(self) -> bool:
        return self.inner.on_device

    @property
    def held(self) -> int:
        return len(self._entries)

    def hold(self, blobs: list[bytes]) -> list[bytes]:
        """Take a reference on each blob (new ones only while under `max_held`); returns those
        held, which the caller must `release` whatever happens next."""
        todo: list[tuple[bytes, _Entry]] = []
        held: list[bytes] = []
        with self._lock:
            for blob in blobs:
                entry = self._entries.get(blob)
                if entry is None:
                    if len(self._entries) >= self.max_held:
                        continue
                    entry = self._entries[blob] = _Entry()
                    todo.append((blob, entry))
                entry.holders += 1
                held.append(blob)
            self._pending += todo
            start = bool(todo) and self._drainers < self._max_drainers
            if start:
                self._drainers += 1
        if start:
            self._pool.submit(self._drain)
        return held

    async def ready(self, held: list[bytes]) -> None:
        """Return once every held blob is decoded (by this request's `hold` or another's)."""
        with self._lock:
            entries = {id(e): e for e in (self._entries[blob] for blob in held)}
        await asyncio.gather(*(asyncio.wrap_future(e.done) for e in entries.values()))

    def holds(self, blob: bytes) -> bool:
        """True while some request holds `blob` (its decode is, or will be, in an entry)."""
        with self._lock:
            return blob in self._entries

    def release(self, blobs: Iterable[bytes]) -> None:
        with self._lock:
            for blob in blobs:
                entry = self._entries.get(blob)
                if entry is None:
                    continue
                entry.holders -= 1
                if entry.holders <= 0:
                    del self._entries[blob]

    def decode(self, blobs: list[bytes]) -> list[object]:
        results: list[object] = [None] * len(blobs)
        misses = []
        for k, blob in enumerate(blobs):
            with self._lock:
                entry = self._entries.get(blob)
            if entry is None:
                misses.append(k)
                continue
            value = entry.done.result()  # a decode error is the value, never raised
            if getattr(value, "is_cuda", False):
                import torch

                # made on the side stream: keep the allocator from reusing it under the reader
                value.record_stream(torch.cuda.current_stream(value.device))
            results[k] = value
            with self._lock:
                self.hits += 1
        if misses:
            with self._lock:
                self.decoded += len(misses)
            for k, value in zip(misses, self.inner.decode([blobs[k] for k in misses]), strict=True):
                results[k] = value
        return results

    def _drain(self) -> None:
        """Decode what is waiting, in one call, until nothing is (requests arriving while every
        drainer is busy join the next call: batching with no added wait)."""
        while True:
            with self._lock:
                todo, self._pending = self._pending, []
                if not todo:
                    self._drainers -= 1
                    return
                self.prefetch_calls += 1
            self._fill(todo)

    def _fill(self, todo: list[tuple[bytes, _Entry]]) -> None:
        try:
            values = self._decode_ready([blob for blob, _ in todo])
        except BaseException as exc:  # every waiter must wake, whatever happened
            log.exception("image prefetch failed for %d images", len(todo))
            values = [exc] * len(todo)
        with self._lock:
            self.decoded += len(todo)
        for (_, entry), value in zip(todo, values, strict=True):
            entry.done.set_result(value)

    def _decode_ready(self, blobs: list[bytes]) -> list[object]:
        """Decode; on CUDA, on a side stream, with every tensor on the device and complete on return."""
        if not str(self.device).startswith("cuda"):
            return self.inner.decode(blobs)
        import torch

        with self._lock:
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            stream = self._stream
        with torch.cuda.stream(stream):  # nvJPEG's output and our copies are ordered on `stream`
            values = self.inner.decode(blobs)
            on_host = [
                k for k, v in enumerate(values) if isinstance(v, torch.Tensor) and v.device.type == "cpu"
            ]
            pinned = [values[k].pin_memory() for k in on_host]  # type: ignore[union-attr]
            for k, src in zip(on_host, pinned, strict=True):
                values[k] = src.to(self.device, non_blocking=True)
        stream.synchronize()  # complete for any consumer stream; `decode` records the consumer's
        return values

    def close(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for _, entry in pending:  # nobody will decode these now: wake whoever waits for them
            entry.done.set_result(RuntimeError("image decoder closed"))
        self._pool.shutdown(wait=False, cancel_futures=True)


def share_image_decoding(scorers: Iterable[Any]) -> dict[str, SharedDecoder]:
    """Give every loaded scorer that decodes with an `ImageDecoder` one `SharedDecoder` per device.

    Returns scorer name → its shared decoder, so the backend knows whose requests to prefetch.
    Decoded pixels do not depend on a scorer's preprocessing (size, mean, std) or dtype, so
    every image scorer on a device can read the same tensors. A wrapper that holds its scorer
    as `inner` (`deploy.streams.OwnStream`) shares the wrapped scorer's decoder.
    """
    image_scorers = []  # (scorer, the object holding its decoder)
    for scorer in scorers:
        target = getattr(scorer, "inner", scorer)
        if isinstance(getattr(target, "decoder", None), ImageDecoder):
            image_scorers.append((scorer, target))
    # four of the largest image batch ahead of the GPU is enough to overlap decoding with forwards
    max_held = 4 * max((scorer.max_batch_size for scorer, _ in image_scorers), default=32)
    by_device: dict[str, SharedDecoder] = {}
    out: dict[str, SharedDecoder] = {}
    for scorer, target in image_scorers:
        decoder = target.decoder
        shared = by_device.get(str(decoder.device))
        if shared is None:
            shared = by_device[str(decoder.device)] = SharedDecoder(decoder, max_held=max_held)
        target.decoder = shared
        out[scorer.name] = shared
    return out
