"""`ahead`: the same items in the same order, produced while the consumer works, errors raised
where they happen, and a consumer that stops early stops the producer."""

from __future__ import annotations

import threading

import pytest

from rewardplane.core.background import ahead


def test_items_come_in_order_and_the_producer_runs_ahead_of_the_consumer():
    produced: list[int] = []
    second_made = threading.Event()

    def items():
        for i in range(5):
            produced.append(i)
            if i == 1:
                second_made.set()
            yield i

    stream = ahead(items(), depth=2)
    assert next(stream) == 0
    # while the consumer holds item 0, the thread has already made the next one
    assert second_made.wait(timeout=5)
    assert list(stream) == [1, 2, 3, 4] and produced == [0, 1, 2, 3, 4]


def test_a_producer_error_is_raised_in_the_consumer_after_the_items_before_it():
    def items():
        yield 1
        raise ValueError("bad row 2")

    got = []
    with pytest.raises(ValueError, match="bad row 2"):
        for item in ahead(items()):
            got.append(item)
    assert got == [1]


def test_a_consumer_that_stops_early_stops_the_producer():
    made: list[int] = []

    def items():
        for i in range(1000):
            made.append(i)
            yield i

    stream = ahead(items(), depth=1)
    assert next(stream) == 0
    stream.close()  # runs the finally: stop, join
    assert len(made) <= 3
    assert not any(t.name == "rewardplane-ahead" and t.is_alive() for t in threading.enumerate())


def test_depth_must_be_positive():
    with pytest.raises(ValueError):
        list(ahead([1], depth=0))
