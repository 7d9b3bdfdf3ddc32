import pytest

from rewardplane.bench.windows import Window, WindowPolicy, is_stable, make_window

POLICY = WindowPolicy(window_s=1.0, stable_windows=3, tolerance=0.10, max_windows=10)


def w(i, items, p95, requests=10):
    return Window(float(i), float(i + 1), requests, items, p95)


def test_stable_when_last_three_agree_within_tolerance():
    windows = [w(0, 50, 90.0), w(1, 100, 20.0), w(2, 105, 21.0), w(3, 109, 21.9)]
    assert is_stable(windows, POLICY)


@pytest.mark.parametrize(
    "windows",
    [
        [w(0, 100, 20.0), w(1, 100, 20.0)],  # fewer than three
        [w(0, 100, 20.0), w(1, 100, 20.0), w(2, 112, 20.0)],  # throughput spread 12%
        [w(0, 100, 20.0), w(1, 100, 23.0), w(2, 100, 20.0)],  # p95 spread 15%
        [w(0, 100, 20.0), w(1, 100, 20.0), w(2, 0, None, requests=0)],  # an empty window
    ],
)
def test_unstable(windows):
    assert not is_stable(windows, POLICY)


def test_make_window_counts_items_and_p95():
    window = make_window(0.0, 2.0, [(4, 10.0)] * 19 + [(4, 100.0)])
    assert window.requests == 20 and window.items == 80
    assert window.items_per_s == 40.0
    assert 10.0 < window.p95_ms <= 100.0


@pytest.mark.parametrize(
    "kwargs",
    [{"window_s": 0}, {"stable_windows": 0}, {"stable_windows": 4, "max_windows": 3}, {"tolerance": -1}],
)
def test_policy_validation(kwargs):
    with pytest.raises(ValueError):
        WindowPolicy(**kwargs)
