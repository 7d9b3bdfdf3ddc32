"""`math` scorer: is the final answer of the response equal to the item's `reference`?

Built on `math-verify` (`pip install 'rewardkit[verifiers]'`): the answer is extracted from the
response (`\\boxed{}`, LaTeX, or the last number/expression), parsed to sympy and compared with the
parsed reference. 1.0 right, 0.0 wrong (or `format_bonus` for a wrong but boxed answer).

Parsing and sympy comparison can take unbounded time or crash on adversarial text (a tower of
exponents, thousands of nested `\\frac`). Peers run math-verify in threads with signal-based
timeouts that do not fire off the main thread, and turn a crash or timeout into a reward of 0 —
a broken checker then looks like a wrong answer. Here every item is verified in one of a pool of
pre-started worker *processes*; the per-item wall-clock limit is enforced from the outside: the
parent waits on the worker's pipe with a deadline, and on expiry SIGKILLs the worker, swaps in a
warm spare and starts a new spare in the background. No signal is ever used inside a thread.

Per-item errors (never numbers): `bad_input` (no reference, or a reference that does not parse),
`timeout` (parse + verify exceeded `timeout_s`), `scorer_failed` (math-verify raised, the worker
died, or ran out of `max_memory_mb`).
"""

from __future__ import annotations

import logging
import os
import queue
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from rewardkit.core.errors import ConfigError
from rewardkit.serve.scorers.base import ItemError, ScoreItem, ScorerInfo
from rewardkit.serve.scorers.common import VERSION, OptionsScorer, as_text, identity

log = logging.getLogger(__name__)

EXTRACTION_MODES = ("auto", "boxed", "latex", "last_number")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


# ----------------------------------------------------------------------------- worker side


def _extraction(mode: str) -> tuple[list[Any], list[Any]]:
    """(prediction configs, gold configs) for an extraction mode."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    if mode == "latex":
        pred = [LatexExtractionConfig(boxed_match_priority=0)]
    elif mode == "last_number":
        pred = [ExprExtractionConfig()]
    else:  # auto / boxed: \boxed first, then any LaTeX, then a plain expression
        pred = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return pred, gold


def _gold_text(reference: str) -> str:
    """A bare reference (`1/2`, `\\frac{1}{2}`, `[1, 2)`) is read as a boxed answer."""
    if "$" in reference or _BOXED.search(reference) or "\\(" in reference or "\\[" in reference:
        return reference
    return "\\boxed{" + reference + "}"


def _numeric_close(gold: list[Any], pred: list[Any], rel_tol: float) -> bool:
    import sympy

    for g in gold:
        for p in pred:
            if isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr) and g.is_number and p.is_number:
                try:
                    a, b = complex(g.evalf()), complex(p.evalf())
                except (TypeError, ValueError):
                    continue
                if abs(a - b) <= rel_tol * max(1.0, abs(a)):
                    return True
    return False


def check_answer(response: str, reference: str, options: dict[str, Any]) -> tuple[str, Any]:
    """("ok", score) or ("error", code, message). Runs inside a worker process (or in-thread in the
    benchmark's reference measurement); never called with a timeout of its own."""
    from math_verify import parse, verify

    mode = options.get("extraction", "auto")
    pred_cfg, gold_cfg = _extraction(mode)
    gold = parse(
        _gold_text(reference),
        gold_cfg,
        fallback_mode="no_fallback",
        parsing_timeout=None,
        raise_on_error=True,
    )
    if not gold:
        return ("error", "bad_input", f"reference {reference[:80]!r} does not parse as math")
    boxed = _BOXED.search(response) is not None
    text = response
    if mode == "boxed" and not boxed:
        return ("ok", 0.0)
    if mode == "last_number":
        numbers = _NUMBER.findall(response)
        if not numbers:
            return ("ok", 0.0)
        text = numbers[-1].replace(",", "")
    pred = parse(text, pred_cfg, parsing_timeout=None, raise_on_error=True)
    right = bool(pred) and verify(
        gold,
        pred,
        float_rounding=int(options.get("float_rounding", 6)),
        timeout_seconds=None,
        raise_on_error=True,
    )
    if not right and pred and options.get("rel_tol"):
        right = _numeric_close(gold, pred, float(options["rel_tol"]))
    if right:
        return ("ok", 1.0)
    return ("ok", float(options.get("format_bonus", 0.0)) if boxed else 0.0)


def _worker_main(conn: Any, options: dict[str, Any], max_memory_mb: int) -> None:
    """One pool worker: answers (response, reference) pairs on its pipe until EOF."""
    import resource
    import signal
    import warnings

    # Ctrl-C reaches the whole process group: the server shuts down and closes the socket
    # (EOF ends this loop); an item in flight is not cut short by the terminal's SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.filterwarnings("ignore")
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)
    if max_memory_mb:
        limit = max_memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:  # warm: import sympy/antlr and run one item before saying ready
        check_answer("\\boxed{1/2}", "0.5", options)
        conn.send(("ready",))
    except Exception as exc:  # pragma: no cover - reported to load()
        conn.send(("error", "scorer_failed", f"worker warm-up failed: {exc!r}"))
        return
    while True:
        try:
            response, reference = conn.recv()
        except (EOFError, OSError):
            return
        try:
            out: tuple[Any, ...] = check_answer(response, reference, options)
        except MemoryError:
            out = ("error", "scorer_failed", f"math-verify ran out of memory ({max_memory_mb} MiB)")
        except RecursionError:
            out = ("error", "scorer_failed", "math-verify hit the recursion limit (deeply nested input)")
        except Exception as exc:
            out = ("error", "scorer_failed", f"math-verify raised {type(exc).__name__}: {str(exc)[:200]}")
        try:
            conn.send(out)
        except (OSError, ValueError):
            return


# ----------------------------------------------------------------------------- parent side


def _stdio_main() -> None:
    """Entry point of a worker subprocess: `python -c ... <options json> <max_memory_mb> <fd>`."""
    import json
    import sys
    from multiprocessing.connection import Connection

    _worker_main(Connection(int(sys.argv[3])), json.loads(sys.argv[1]), int(sys.argv[2]))


class _Worker:
    """A fresh interpreter (not multiprocessing: its spawn/forkserver re-import the server's
    `__main__`), talking pickled tuples over a socketpair."""

    def __init__(self, options: dict[str, Any], max_memory_mb: int) -> None:
        import json
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from rewardkit.serve.scorers.math import _stdio_main; _stdio_main()",
                json.dumps(options),
                str(max_memory_mb),
                str(theirs.fileno()),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(mine.detach())

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            self.kill()
            raise RuntimeError(f"math worker not ready after {timeout:.0f} s")
        msg = self.conn.recv()
        if msg[0] != "ready":
            self.kill()
            raise RuntimeError(msg[-1])

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, ValueError, subprocess_timeout()):
            pass
        self.conn.close()


def subprocess_timeout() -> type[Exception]:
    import subprocess

    return subprocess.TimeoutExpired


class MathWorkerPool:
    """`workers` warm processes plus `spares` warm stand-bys. `run(response, reference)` gives
    ("ok", score) or ("error", code, message) within `timeout_s` (+ IPC), always."""

    def __init__(
        self, options: dict[str, Any], *, workers: int, spares: int, timeout_s: float, max_memory_mb: int
    ) -> None:
        self.options, self.timeout_s, self.max_memory_mb = options, timeout_s, max_memory_mb
        self.n_workers, self.n_spares = workers, spares
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._spares: queue.Queue[_Worker] = queue.Queue()
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="math-pool")
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="math-spawn")
        self._closed = False
        self.killed = 0
        self.replaced = 0

    def start(self) -> None:
        fresh = [_Worker(self.options, self.max_memory_mb) for _ in range(self.n_workers + self.n_spares)]
        for w in fresh:
            w.wait_ready(120)
        for w in fresh[: self.n_workers]:
            self._idle.put(w)
        for w in fresh[self.n_workers :]:
            self._spares.put(w)

    def _new_spare(self) -> None:
        if self._closed:
            return
        try:
            w = _Worker(self.options, self.max_memory_mb)
            w.wait_ready(120)
        except Exception:  # pragma: no cover - retried on the next replacement
            log.exception("math pool: starting a spare worker failed")
            return
        self._spares.put(w)

    def _replace(self, dead: _Worker) -> None:
        dead.kill()
        self.replaced += 1
        self._spawner.submit(self._new_spare)
        if self.n_spares == 0:
            self._spawner.submit(lambda: self._idle.put(self._spares.get()))
            return
        try:
            self._idle.put(self._spares.get(timeout=120))
        except queue.Empty:  # pragma: no cover
            log.error("math pool: no spare worker became ready in 120 s")

    def run(self, response: str, reference: str) -> tuple[Any, ...]:
        try:  # all workers busy or being replaced; bounded, so a failed respawn cannot hang a request
            worker = self._idle.get(timeout=self.timeout_s + 120)
        except queue.Empty:
            return ("error", "scorer_failed", "no math worker became available (respawns failing?)")
        try:
            worker.conn.send((response, reference))
            if worker.conn.poll(self.timeout_s):
                out = worker.conn.recv()
                self._idle.put(worker)
                return out
            self.killed += 1
            self._replace(worker)
            return (
                "error",
                "timeout",
                f"parse + verify exceeded {self.timeout_s:g} s; the worker was killed",
            )
        except (EOFError, OSError, BrokenPipeError) as exc:
            code = worker.proc.poll()
            self._replace(worker)
            return ("error", "scorer_failed", f"math worker died (exit {code}): {type(exc).__name__}")

    def map(self, pairs: list[tuple[str, str]]) -> list[tuple[Any, ...]]:
        return list(self._threads.map(lambda p: self.run(*p), pairs))

    def alive(self) -> int:
        return sum(1 for w in list(self._idle.queue) if w.proc.poll() is None)

    def close(self) -> None:
        self._closed = True
        self._spawner.shutdown(wait=True)
        for q in (self._idle, self._spares):
            while not q.empty():
                q.get().kill()
        self._threads.shutdown(wait=False)


class MathScorer(OptionsScorer):
    """See the module docstring. Options: `extraction` (auto|boxed|latex|last_number),
    `format_bonus` (0.0), `rel_tol` (null: math-verify's own comparison), `float_rounding` (6),
    `timeout_s` (per item, 5.0), `workers` (os.cpu_count()), `spares` (1), `max_memory_mb` (2048)."""

    kind: ClassVar[str] = "math"
    modality: ClassVar = "rule"
    allowed_options: ClassVar[frozenset[str]] = frozenset(
        {
            "extraction",
            "format_bonus",
            "rel_tol",
            "float_rounding",
            "timeout_s",
            "workers",
            "spares",
            "max_memory_mb",
        }
    )

    def __init__(
        self,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        max_batch_size: int = 64,
        max_wait_ms: float = 2.0,
    ) -> None:
        super().__init__(name, options=options, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        o, where = self.options, f"scorer {name!r} (math)"
        if o.get("extraction", "auto") not in EXTRACTION_MODES:
            raise ConfigError(f"{where}: options.extraction must be one of {EXTRACTION_MODES}")
        for key, lo in (("format_bonus", 0.0), ("timeout_s", 1e-3), ("rel_tol", 0.0)):
            v = o.get(key)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v < lo):
                raise ConfigError(f"{where}: options.{key} must be a number >= {lo}")
        if not 0.0 <= float(o.get("format_bonus", 0.0)) < 1.0:
            raise ConfigError(f"{where}: options.format_bonus must be in [0, 1)")
        for key in ("workers", "spares", "max_memory_mb", "float_rounding"):
            v = o.get(key)
            if v is not None and (
                not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "workers" else 0)
            ):
                raise ConfigError(f"{where}: options.{key} must be a non-negative integer")
        self.timeout_s = float(o.get("timeout_s", 5.0))
        self.workers = int(o.get("workers") or os.cpu_count() or 1)
        self.spares = int(o.get("spares", 1))
        self.max_memory_mb = int(o.get("max_memory_mb", 2048))
        self._check_options = {
            k: o[k] for k in ("extraction", "format_bonus", "rel_tol", "float_rounding") if k in o
        }
        self.pool: MathWorkerPool | None = None

    def load(self) -> None:
        try:
            import math_verify  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"scorer {self.name!r} (math) needs math-verify: pip install 'rewardkit[verifiers]'"
            ) from None
        self.pool = MathWorkerPool(
            self._check_options,
            workers=self.workers,
            spares=self.spares,
            timeout_s=self.timeout_s,
            max_memory_mb=self.max_memory_mb,
        )
        self.pool.start()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        assert self.pool is not None, "load() first"
        out: list[float | ItemError | None] = [None] * len(items)
        todo: list[tuple[int, tuple[str, str]]] = []
        for i, item in enumerate(items):
            ref = item.reference
            if isinstance(ref, int | float) and not isinstance(ref, bool):
                ref = str(ref)
            if not isinstance(ref, str) or not ref.strip():
                out[i] = ItemError(
                    "bad_input", "math needs the item's 'reference' (the final answer, a string)"
                )
            else:
                todo.append((i, (as_text(item.response), ref)))
        for (i, _), res in zip(todo, self.pool.map([p for _, p in todo]), strict=True):
            out[i] = float(res[1]) if res[0] == "ok" else ItemError(res[1], res[2])
        return out  # type: ignore[return-value]

    def warmup_item(self) -> ScoreItem:
        return ScoreItem(id="warmup", prompt="1/2 = ?", response="\\boxed{\\frac{1}{2}}", reference="0.5")

    def info(self) -> ScorerInfo:
        import importlib.metadata as md

        try:
            mv = md.version("math-verify")
        except md.PackageNotFoundError:
            mv = "missing"
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype="none",
            device="cpu",
            version=VERSION,
            identity=identity(
                kind=self.kind,
                weights="",
                config={"math_verify": mv},
                dtype="none",
                options=self._check_options,
            ),
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            extra={
                "backend": f"math-verify {mv}, worker processes",
                "limits": {
                    "timeout_s": self.timeout_s,
                    "workers": self.workers,
                    "spares": self.spares,
                    "max_memory_mb": self.max_memory_mb,
                },
                "extraction": self.options.get("extraction", "auto"),
                "workers_killed": self.pool.killed if self.pool else 0,
            },
        )
