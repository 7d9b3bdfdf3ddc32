"""Run an iterator a few steps ahead on its own thread.

Why: host work that feeds a device (tokenising an evaluation's texts for packed forwards) can
run while the device works on what was already handed over, instead of all of it first. The
consumer sees the same items in the same order; an exception in the producer is raised in the
consumer where the item would have been; a consumer that stops early stops the producer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def ahead(items: Iterable[T], depth: int = 2, *, name: str = "rewardplane-ahead") -> Iterator[T]:
    """`items`, produced on a daemon thread at most `depth` items ahead of the consumer."""
    if depth < 1:
        raise ValueError("depth must be at least 1")
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[object, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                handoff.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put((_DONE, exc))
            return
        put((_DONE, None))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, error = handoff.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()
