"""Pre-warmed worker processes that run one function per item under a wall-clock limit enforced
from outside: the `math` scorer's pool (docs/verifiers.md, docs/benchmarks/verifiers.md).

Why processes: the checked code (sympy via math-verify) can run for minutes, exhaust memory or
crash on adversarial text, and a Python thread cannot be stopped; a signal-based timeout only
fires in a main thread. A process can always be SIGKILLed. So each item runs in one of `workers`
fresh interpreters, and when an item's deadline passes the parent SIGKILLs that worker, a warm
spare takes its place at once and a new spare starts in the background. A worker says ready only
after running the caller's `warmup` items: sympy imports and builds much of itself lazily, on the
first item of each kind (a first polynomial identity took 1.4 s in a fresh process, the next one
40 ms), and a worker that paid that on a real item would time out on a right answer.

Why this shape (measured on the issue #25 benchmark, docs/benchmarks/verifiers.md):

- **One dispatcher thread, not one thread per worker.** A thread per worker blocking on its pipe
  cost the server ≈200 µs of CPU per item (a `concurrent.futures` hand-off, a selector built per
  `poll`, a pickler per message, and the GIL passed between N threads); at 16 cores × ≈450
  items/s that is more than the server process has. Here one thread owns every socket through one
  selector; per item it does a slice of a `recv`, an unpickle and a list write.
- **Several items per worker, results streamed back one by one.** A worker holds up to `depth`
  items (the running one plus `depth - 1` waiting in its socket), sent as one message, so it
  starts the next item without waiting for the server to wake (a server busy parsing JSON holds
  the GIL for milliseconds). Because results come back in order, the parent always knows which
  item is running: the first one without a result.
- **The deadline is per item.** The running item started no earlier than when it was sent and
  when the worker finished the previous one (stamped with the worker's `time.monotonic()`, the
  same clock on Linux and macOS). When `timeout_s` has passed since then the worker is killed:
  the running item gets `timeout`, the items waiting behind it never started and go back to the
  front of the queue, so they still get their real results from another worker. A worker that
  dies (a crash, the OOM killer) fails its running item as `scorer_failed` the same way.
- **The parent never blocks on a worker.** Its sockets are non-blocking, with an out-buffer per
  worker flushed as the worker reads: a hung worker that stops reading cannot stall the one
  thread that enforces every deadline. Frames are a 4-byte length and a pickle.

Results are `("ok", value)` or `("error", code, message)`: a failure is never a value.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import pickle
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
READY_TIMEOUT_S = 120.0
"""A new worker must have imported its target and run the warm-up item within this."""
NO_WORKER_S = 120.0
"""An item waiting this long (beyond `timeout_s`) with no live worker fails: respawns are failing."""
RESPAWN_BACKOFF_S = 5.0
"""After a worker failed to start, the next start waits this long (a broken install must not spin)."""
_RECV_BYTES = 1 << 18


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _load_target(target: str) -> Any:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


# ----------------------------------------------------------------------------- worker side


def worker_main() -> None:
    """Entry point of a worker: `python -c ... <spec json> <socket fd>`. Runs the warm-up, then
    `target(*args, options)` for each item it is sent, answering `(result, time.monotonic())` per
    item, in order, until EOF."""
    import json
    import resource
    import signal
    import warnings

    spec = json.loads(sys.argv[1])
    sock = socket.socket(fileno=int(sys.argv[2]))
    # Ctrl-C reaches the whole process group: the server shuts down and closes the socket (EOF
    # ends this loop); an item in flight is not cut short by the terminal's SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)  # stdout/stderr go nowhere; formatting records costs time
    max_memory_mb, label, options = int(spec["max_memory_mb"]), spec["label"], spec["options"]
    if max_memory_mb:
        limit = max_memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:  # warm: import the target's libraries and run an item of each kind before saying ready
        fn = _load_target(spec["target"])
        for args in spec["warmup"]:
            fn(*args, options)
        sock.sendall(_frame(("ready",)))
    except Exception as exc:  # reported to start()
        sock.sendall(_frame(("error", "scorer_failed", f"worker warm-up failed: {exc!r}"[:500])))
        return
    rfile = sock.makefile("rb")
    while True:
        head = rfile.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return
        body = rfile.read(_HEADER.unpack(head)[0])
        for args in pickle.loads(body):
            try:
                out: tuple[Any, ...] = fn(*args, options)
            except MemoryError:
                out = ("error", "scorer_failed", f"{label} ran out of memory ({max_memory_mb} MiB)")
            except RecursionError:
                out = ("error", "scorer_failed", f"{label} hit the recursion limit (deeply nested input)")
            except Exception as exc:
                out = ("error", "scorer_failed", f"{label} raised {type(exc).__name__}: {str(exc)[:200]}")
            try:
                sock.sendall(_frame((out, time.monotonic())))
            except OSError:
                return


# ----------------------------------------------------------------------------- parent side


@dataclass
class _Job:
    """One `map` call: its results fill in as items finish; `done` is set with the last."""

    results: list[Any]
    left: int
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Item:
    job: _Job
    index: int
    args: tuple[Any, ...]
    queued: float
    sent: float = 0.0


class _Proc:
    """A fresh interpreter (not multiprocessing: its spawn/forkserver re-import the server's
    `__main__`) on one end of a socketpair."""

    def __init__(self, spec_json: str) -> None:
        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from rewardplane.serve.execution.procpool import worker_main; worker_main()",
                spec_json,
                str(theirs.fileno()),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        theirs.close()
        mine.setblocking(False)
        self.sock = mine
        self.born = time.monotonic()
        self.ready = False
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.outstanding: collections.deque[_Item] = collections.deque()
        self.started = 0.0  # when the running item (outstanding[0]) started, at the latest
        self.writing = False  # registered for EVENT_WRITE
        self.retired = False

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(OSError):
            self.sock.close()

    def reap(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


class DeadlinePool:
    """`workers` warm processes plus `spares` warm stand-bys running `target(*args, options)`
    (`"module:function"`). `map(args_list)` returns one result per item, each within `timeout_s`
    of its start (+ IPC), always. Thread-safe: concurrent `map` calls share the workers, first
    come first served."""

    def __init__(
        self,
        target: str,
        options: dict[str, Any],
        *,
        warmup: list[tuple[Any, ...]],
        label: str,
        workers: int,
        spares: int,
        timeout_s: float,
        max_memory_mb: int,
        depth: int = 2,
    ) -> None:
        import json

        self._spec = json.dumps(
            {
                "target": target,
                "options": options,
                "warmup": [list(args) for args in warmup],
                "label": label,
                "max_memory_mb": max_memory_mb,
            }
        )
        self.label, self.timeout_s = label, timeout_s
        self.n_workers, self.n_spares, self.depth = workers, spares, max(1, depth)
        self.killed = 0  # workers killed at an item's deadline
        self.replaced = 0  # workers replaced (killed or died)
        self.requeued = 0  # items sent to a worker that was killed before it started them
        self._lock = threading.Lock()
        self._ready_cv = threading.Condition(self._lock)
        self._pending: collections.deque[_Item] = collections.deque()  # under _lock
        self._incoming: list[_Proc | None] = []  # from the spawner (None: failed); under _lock
        self._closed = False  # under _lock
        self._start_error: str | None = None  # under _lock
        self._n_ready = 0  # under _lock: active + spares, for start()
        self._active: list[_Proc] = []  # the rest: dispatcher thread only
        self._spares: list[_Proc] = []
        self._starting: list[_Proc] = []
        self._spawning = 0
        self._respawn_at = 0.0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{label}-spawn")
        self._thread = threading.Thread(target=self._dispatch, name=f"{label}-pool", daemon=True)

    # -- the API ----------------------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Start every worker and spare and wait until all are warm; a failed warm-up raises."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        with self._ready_cv:
            while self._start_error is None and self._n_ready < self.n_workers + self.n_spares:
                if self._closed:
                    raise RuntimeError(f"the {self.label} pool stopped while starting")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.label} workers not ready after {timeout:.0f} s")
                self._ready_cv.wait(left)
            if self._start_error is not None:
                raise RuntimeError(self._start_error)

    def map(self, args_list: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        if not args_list:
            return []
        job = _Job([None] * len(args_list), len(args_list))
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return [("error", "scorer_failed", f"the {self.label} pool is closed")] * len(args_list)
            self._pending.extend(_Item(job, i, args, now) for i, args in enumerate(args_list))
        self._wake()
        job.done.wait()
        return job.results

    def alive(self) -> int:
        """Active workers whose process is running (spares not counted)."""
        return sum(1 for p in list(self._active) if p.proc.poll() is None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join()
        self._spawner.shutdown(wait=True)
        with self._lock:
            procs = [*self._active, *self._spares, *self._starting, *filter(None, self._incoming)]
            self._incoming.clear()
        self._active, self._spares, self._starting = [], [], []
        for p in procs:
            p.kill()
        for p in procs:
            p.reap()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the dispatcher thread -----------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    def _dispatch(self) -> None:
        try:
            for _ in range(self.n_workers + self.n_spares):
                self._spawn()
            while True:
                with self._lock:
                    if self._closed:
                        break
                    incoming, self._incoming = self._incoming, []
                for p in incoming:
                    self._spawning -= 1
                    if p is None:
                        self._respawn_at = time.monotonic() + RESPAWN_BACKOFF_S
                        continue
                    self._starting.append(p)
                    self._sel.register(p.sock, selectors.EVENT_READ, p)
                self._assign()
                for key, mask in self._sel.select(self._wait_s()):
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError, OSError):
                            while self._wake_r.recv(4096):
                                pass
                        continue
                    p = key.data
                    if mask & selectors.EVENT_WRITE:
                        self._flush(p)
                    if mask & selectors.EVENT_READ:
                        self._read(p)
                self._expire()
        except Exception:  # pragma: no cover - a bug here must not leave callers waiting
            log.exception("%s pool: the dispatcher failed", self.label)
        finally:
            self._fail_all(f"the {self.label} pool stopped")

    def _spawn(self) -> None:
        self._spawning += 1
        self._spawner.submit(self._spawn_one)

    def _spawn_one(self) -> None:
        """Spawner thread: start a process (a fork of a large server takes milliseconds, not to
        be spent on the thread that enforces deadlines) and hand it to the dispatcher."""
        try:
            p = _Proc(self._spec)
        except Exception:
            log.exception("%s pool: starting a worker failed", self.label)
            p = None
        with self._lock:
            if p is not None and self._closed:
                p.kill()
                return
            self._incoming.append(p)
        self._wake()

    def _wait_s(self) -> float:
        """Until the next deadline (an item's, a starting worker's), at most a second."""
        now, wait = time.monotonic(), 1.0
        for p in self._active:
            if p.outstanding:
                wait = min(wait, p.started + self.timeout_s - now)
        return max(0.0, wait)

    def _assign(self) -> None:
        """Hand pending items to active workers, one level at a time: every worker gets a first
        item before any gets a second, so a small batch spreads over all of them."""
        if not self._pending:  # unlocked peek: map() appends, then wakes this thread
            return
        sends: dict[_Proc, list[_Item]] = {}
        with self._lock:
            if not self._pending or not self._active:
                return
            for level in range(1, self.depth + 1):
                for p in self._active:
                    if not self._pending:
                        break
                    queued = len(p.outstanding) + len(sends.get(p, ()))
                    if queued < level:
                        sends.setdefault(p, []).append(self._pending.popleft())
        now = time.monotonic()
        for p, items in sends.items():
            if not p.outstanding:
                p.started = now
            for it in items:
                it.sent = now
            p.outstanding.extend(items)
            p.outbuf += _frame([it.args for it in items])
            self._flush(p)

    def _flush(self, p: _Proc) -> None:
        try:
            while p.outbuf:
                sent = p.sock.send(p.outbuf)
                del p.outbuf[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the worker is gone; its EOF is read next
            p.outbuf.clear()
        want = bool(p.outbuf)
        if want != p.writing and p.sock.fileno() >= 0:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            self._sel.modify(p.sock, events, p)
            p.writing = want

    def _read(self, p: _Proc) -> None:
        eof = False
        try:
            while True:
                chunk = p.sock.recv(_RECV_BYTES)
                if not chunk:
                    eof = True
                    break
                p.inbuf += chunk
                if len(chunk) < _RECV_BYTES:  # drained for now (spares a raising recv per wake)
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            eof = True
        view, pos = memoryview(p.inbuf), 0
        try:
            while len(view) - pos >= _HEADER.size and not p.retired:
                (n,) = _HEADER.unpack_from(view, pos)
                if len(view) - pos - _HEADER.size < n:
                    break
                msg = pickle.loads(view[pos + _HEADER.size : pos + _HEADER.size + n])
                pos += _HEADER.size + n
                self._message(p, msg)
        finally:
            view.release()
            del p.inbuf[:pos]
        if eof and not p.retired:
            code = p.proc.poll()
            self._retire(p, ("error", "scorer_failed", f"{self.label} worker died (exit {code})"))

    def _message(self, p: _Proc, msg: tuple[Any, ...]) -> None:
        if not p.ready:  # the warm-up's answer
            if msg[0] != "ready":
                log.error("%s pool: %s", self.label, msg[-1])
                self._retire(p, msg)
                self._respawn_at = time.monotonic() + RESPAWN_BACKOFF_S
                with self._ready_cv:
                    self._start_error = self._start_error or str(msg[-1])
                    self._ready_cv.notify_all()
                return
            self._starting.remove(p)
            p.ready = True
            (self._active if len(self._active) < self.n_workers else self._spares).append(p)
            with self._ready_cv:
                self._n_ready += 1
                self._ready_cv.notify_all()
            return
        out, finished = msg
        item = p.outstanding.popleft()
        self._deliver(item, out)
        if p.outstanding:  # the next one started when both it had arrived and the last was done
            p.started = min(time.monotonic(), max(p.outstanding[0].sent, finished))

    def _deliver(self, item: _Item, out: tuple[Any, ...]) -> None:
        job = item.job
        job.results[item.index] = out
        job.left -= 1
        if job.left == 0:
            job.done.set()

    def _retire(self, p: _Proc, running: tuple[Any, ...]) -> None:
        """Kill `p` (timed out or dead): its running item gets `running`, the items behind it go
        back to the front of the queue, a spare takes its place."""
        if p.retired:
            return
        p.retired = True
        self._sel.unregister(p.sock)
        p.kill()
        self._spawner.submit(p.reap)
        self.replaced += p.ready
        if p in self._active:
            self._active.remove(p)
            with self._lock:
                self._n_ready -= 1
        elif p in self._spares:
            self._spares.remove(p)
            with self._lock:
                self._n_ready -= 1
        elif p in self._starting:
            self._starting.remove(p)
        if p.outstanding:
            self._deliver(p.outstanding.popleft(), running)
            with self._lock:
                self._pending.extendleft(reversed(p.outstanding))
            self.requeued += len(p.outstanding)
            p.outstanding.clear()
        if self._spares and len(self._active) < self.n_workers:
            self._active.append(self._spares.pop())

    def _expire(self) -> None:
        now = time.monotonic()
        for p in list(self._active):
            if p.outstanding and now >= p.started + self.timeout_s:
                self.killed += 1
                self._retire(
                    p,
                    (
                        "error",
                        "timeout",
                        f"{self.label} exceeded {self.timeout_s:g} s on this item; the worker was killed",
                    ),
                )
        for p in list(self._starting):
            if now - p.born > READY_TIMEOUT_S:
                log.error("%s pool: a worker was not ready after %.0f s", self.label, READY_TIMEOUT_S)
                self._retire(p, ("error", "scorer_failed", "unused"))
                self._respawn_at = now + RESPAWN_BACKOFF_S
        have = len(self._active) + len(self._spares) + len(self._starting) + self._spawning
        if have < self.n_workers + self.n_spares and now >= self._respawn_at:
            for _ in range(self.n_workers + self.n_spares - have):
                self._spawn()
        if not self._active:  # nothing can run the queue: fail what waited too long
            with self._lock:
                stale = []
                while self._pending and now - self._pending[0].queued > self.timeout_s + NO_WORKER_S:
                    stale.append(self._pending.popleft())
            for it in stale:
                self._deliver(
                    it,
                    (
                        "error",
                        "scorer_failed",
                        f"no {self.label} worker became available (respawns failing?)",
                    ),
                )

    def _fail_all(self, message: str) -> None:
        with self._lock:
            self._closed = True
            items = list(self._pending)
            self._pending.clear()
            self._ready_cv.notify_all()
        for p in self._active:
            items += p.outstanding
            p.outstanding.clear()
        for it in items:
            if not it.job.done.is_set():
                self._deliver(it, ("error", "scorer_failed", message))
