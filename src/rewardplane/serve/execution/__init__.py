"""Process execution for the verifiers: running code and checks in processes the server can kill.

- `sandbox.py` (+ `zygote.py`, `rootfs.py`, `limits.py`, `harness.py`): the local sandbox the
  `code` scorer runs untrusted programs in;
- `procpool.py`: pre-warmed worker processes with a per-item deadline (the `math` scorer's pool).

The scorers decide what a result means; this package only runs things and reports what happened.
"""
