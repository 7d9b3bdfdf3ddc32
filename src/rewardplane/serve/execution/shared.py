"""One started `DeadlinePool` per configuration in a process, shared by every scorer that asks
for the same one.

A composite's inline `math` component and a hosted `math` scorer with the same options would
otherwise each start `workers + spares` verifier processes on the same cores, doubling the
memory and halving each pool's share of the machine. Pools are shared only when everything that
decides a score or a limit is equal (the worker function, its options, the warm-up, the limits,
the worker count): a pool shared across different options would score one scorer's items by the
other's rules. The pool closes when its last user releases it.
"""

from __future__ import annotations

import threading

from rewardplane.serve.execution.procpool import DeadlinePool

_LOCK = threading.Lock()
_POOLS: dict[str, list] = {}  # key -> [pool, users]


def _key(pool: DeadlinePool) -> str:
    return repr((pool._spec, pool.n_workers, pool.n_spares, pool.timeout_s, pool.depth))


def acquire(pool: DeadlinePool) -> DeadlinePool:
    """The started pool configured as `pool` is: an existing one (and `pool`, never started, is
    dropped) or `pool` itself, started here. Pair each call with `release`."""
    key = _key(pool)
    with _LOCK:  # held through start(): a second user of the key waits for the first's warm-up
        entry = _POOLS.get(key)
        if entry is not None:
            entry[1] += 1
            pool.close()
            return entry[0]
        try:
            pool.start()
        except BaseException:
            pool.close()
            raise
        _POOLS[key] = [pool, 1]
        return pool


def release(pool: DeadlinePool) -> None:
    """One user fewer; the last one closes the pool."""
    with _LOCK:
        key = _key(pool)
        entry = _POOLS.get(key)
        if entry is None or entry[0] is not pool:
            pool.close()  # not shared (acquired before a restart of the table): close it as before
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _POOLS[key]
    pool.close()


def users(pool: DeadlinePool) -> int:
    """How many scorers hold `pool` (0 when it is not a shared pool)."""
    with _LOCK:
        entry = _POOLS.get(_key(pool))
        return entry[1] if entry is not None and entry[0] is pool else 0
