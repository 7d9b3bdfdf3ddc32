"""Cost ratios that hold on a loaded machine: a call's best time over a few runs, in this
thread's CPU time (other processes take wall-clock time from a run, not CPU time)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any


def best_cpu_seconds(fn: Callable[..., Any], *args: Any, repeats: int = 5) -> float:
    best = math.inf
    for _ in range(repeats):
        started = time.thread_time()
        fn(*args)
        best = min(best, time.thread_time() - started)
    return best
