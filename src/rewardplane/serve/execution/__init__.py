"""Process execution for the verifiers: running code and checks in processes the server can kill.

- `sandbox.py` (+ `zygote.py`, `rootfs.py`, `limits.py`, `harness.py`, `channel.py`): the local
  sandbox the `code` scorer runs untrusted programs in;
- `evaluator.py` (+ `plain.py`): the trusted evaluator that runs assert-style tests outside the
  program's process and reaches the program only by calls carrying plain data;
- `procpool.py`: pre-warmed worker processes with a per-item deadline (the `math` scorer's pool).

The scorers decide what a result means; this package only runs things and reports what happened.
"""
