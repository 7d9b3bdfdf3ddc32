"""The trusted evaluator: the tests run here, the program is reached only by calls.

    evaluator (the sandbox unit, outside the program's PID namespace)       program's process
      tests: setup, asserts, check(candidate), helpers, their imports         the program, and
      `f` = Stub("f")  ── {"op":"call","f":"f","a":[plain...]} ──────────▶    `harness.serve_calls`
      the value, rebuilt as real classes ◀── {"v": plain, "m": mutated args} ─  (plain.encode)
      verdict: which cases passed ──▶ zygote (unit socket) ──▶ server (framed with the run's secret)

Every name the tests use but do not bind (and that is not a builtin: the tests' `abs`, `all` and
`isclose` are always the evaluator's own) is asked of the program once: a function or class
becomes a `Stub`, a module is imported here (the evaluator's own copy), a constant is fetched
once as plain data, any other object stays in the sandbox behind a `Remote` reference. A call
sends the arguments as plain data (`plain.py`); the program's process calls the function and
answers with the value — or the exception's builtin type and message — as plain data, with the
arguments it mutated. Everything the tests then do with the value (`==`, `abs`, `.istitle()`,
`np.allclose`, `check`'s asserts) runs here, on exact builtin values, in a process the program
cannot reach: nothing it sends is executed, and the verdict never passes through it.

What cannot cross: a value that is not plain data comes back as a `Remote`, which can only be
passed back to the program, called, or have an attribute set; anything else done with it
(comparing, truth, iterating, reading an attribute) fails the case. A test that passes the
program something that is not plain data (its own lambda or object) makes the item
`unverifiable`: the item's defect, not the program's.

Stdlib only: loaded by file path into the zygote; the server imports `prepared` (the tests
compiled once, sent to the evaluator) and `split_cases`.
"""

from __future__ import annotations

import ast
import builtins
import functools
import marshal
import os
import socket
import struct
from typing import Any

MAX_FRAME = 1 << 23
MAX_CASES = 10000
_plain: Any = None  # plain.py, set by the zygote (loaded by path) or on first use through the package


def plain_module() -> Any:
    global _plain
    if _plain is None:
        from rewardplane.serve.execution import plain

        _plain = plain
    return _plain


# ----------------------------------------------------------------------------- the tests' shape


def split_cases(tests: str) -> list[tuple[str, int, ast.stmt | ast.Module]]:
    """The tests' top-level statements in order: ("setup", -1, node) for imports, defs, classes,
    assignments, `pass` and docstrings; ("case", k, node) for every other statement (an assert, a
    call to `check(...)`, a loop). A script without a case is one case (the whole module).
    SyntaxError/ValueError when the tests do not compile."""
    tree = ast.parse(tests)
    compile(tree, "<tests>", "exec")
    steps: list[tuple[str, int, ast.stmt | ast.Module]] = []
    k = 0
    for node in tree.body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if isinstance(node, _SETUP) or docstring:
            steps.append(("setup", -1, node))
        else:
            steps.append(("case", k, node))
            k += 1
    return steps if k else [("case", 0, tree)]


def inside_steps(tests: str) -> tuple[list[list[Any]], int]:
    """The same statements as source, for a run inside the program's process (the option
    `unsafe_run_inside`): (["setup", src] | ["run", k, src], the number of cases)."""
    steps = split_cases(tests)
    out = [
        ["setup", ast.unparse(n)] if kind == "setup" else ["run", k, ast.unparse(n)] for kind, k, n in steps
    ]
    return out, sum(kind == "case" for kind, _, _ in steps)


@functools.lru_cache(maxsize=4096)
def prepared(tests: str) -> bytes:
    """What the server sends the evaluator for these tests (cached: a group of responses to one
    prompt shares them): the statements compiled, and the names to ask the program for, as
    `marshal` data — from the trusted server, on a pipe the program never holds, so the
    evaluator parses nothing per run."""
    steps = [(kind, _code(node)) for kind, _, node in split_cases(tests)]
    return marshal.dumps({"steps": steps, "names": wanted_names(tests)})


def _code(node: ast.stmt | ast.Module) -> Any:
    module = node if isinstance(node, ast.Module) else ast.Module(body=[node], type_ignores=[])
    return compile(module, "<tests>", "exec")


_SETUP = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
    ast.AugAssign,
    ast.Pass,
)


def wanted_names(tests: str) -> list[str]:
    """Names the tests read but never bind at top level and that are not builtins: the ones the
    program may define (its function, a constant, a module it imported)."""
    tree = ast.parse(tests)
    bound: set[str] = set()
    for node in tree.body:
        for sub in ast.walk(node) if not isinstance(node, _SCOPES) else [node]:
            if isinstance(sub, _SCOPES):
                bound.add(sub.name)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                bound.add(sub.id)
            elif isinstance(sub, ast.Import | ast.ImportFrom):
                bound.update((a.asname or a.name).split(".")[0] for a in sub.names)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(n for n in used - bound if not hasattr(builtins, n) and not n.startswith("__"))


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

# ----------------------------------------------------------------------------- the boundary


class ProgramEnded(BaseException):
    """The program's process is gone or broke the protocol: this call, and the case, fail."""


class Crossing(BaseException):
    """A value that is not plain data was used for more than passing it back: the case fails."""


class Unverifiable(BaseException):
    """The tests handed the program something that cannot cross: the item is unverifiable."""


class Conn:
    """Length-prefixed JSON frames on the call socket. `bad` is set by whatever made the
    current case unable to pass, however the tests catch the exception."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.dead, self.bad, self.unverifiable = sock, False, "", ""

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.dead:
            raise self.fail(ProgramEnded("the program's process has ended"))
        try:
            data = _plain.dumps(msg)
            self.sock.sendall(struct.pack(">I", len(data)) + data)
            (n,) = struct.unpack(">I", self._read(4))
            if n > MAX_FRAME:
                raise ValueError("oversized answer")
            reply = __import__("json").loads(self._read(n))
            if type(reply) is not dict:
                raise ValueError("not an object")
            return reply
        except (OSError, ValueError, EOFError, struct.error, RecursionError):
            self.dead = True
            raise self.fail(ProgramEnded("the program's process ended or broke the protocol")) from None

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def fail(self, exc: BaseException) -> BaseException:
        self.bad = self.bad or str(exc)
        if isinstance(exc, Unverifiable):
            self.unverifiable = self.unverifiable or str(exc)
        return exc

    def value(self, data: Any) -> Any:
        try:
            return _plain.decode(data, self._ref)
        except _plain.Malformed as exc:
            raise self.fail(ProgramEnded(f"malformed value: {exc}")) from None

    def _ref(self, tag: str, body: Any) -> Any:
        if tag != "ref" or type(body) is not int:
            raise _plain.Malformed("a reference the evaluator did not ask for")
        return Remote(self, body)

    def args(self, value: Any) -> Any:
        def other(v: Any) -> Any:
            if type(v) is Stub and v._conn is self:
                return {"fn": v._name}
            if type(v) is Remote and v._conn is self:
                return {"ref": v._wire()}
            t = type(v)
            raise self.fail(Unverifiable(f"the tests pass a {t.__module__}.{t.__qualname__} to the program"))

        try:
            return _plain.encode(value, other)
        except _plain.Unencodable as exc:
            raise self.fail(Unverifiable(f"an argument does not cross: {exc}")) from None

    def call(self, target: dict[str, Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        msg = {"op": "call", **target, "a": [self.args(a) for a in args]}
        msg["k"] = {k: self.args(v) for k, v in kwargs.items()}
        reply = self.ask(msg)
        if "x" in reply:
            raise self.raised(reply)
        for i, data in reply.get("m") or ():
            if type(i) is int and 0 <= i < len(args):
                _update(args[i], self.value(data))
        return self.value(reply.get("v"))

    def raised(self, reply: dict[str, Any]) -> BaseException:
        cls = getattr(builtins, str(reply["x"]), None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            return self.fail(ProgramEnded(f"the program raised {str(reply['x'])[:60]}"))
        try:
            return cls(str(reply.get("msg", ""))[:2000])
        except Exception:
            return Exception(str(reply.get("msg", ""))[:2000])


def _update(orig: Any, new: Any) -> None:
    """An argument the program mutated, updated in place (an in-place sort is seen)."""
    t = type(orig)
    if t is not type(new):
        return
    if t in (list, bytearray):
        orig[:] = new
    elif t in (dict, set) or hasattr(orig, "clear") and hasattr(orig, "update"):
        orig.clear()
        orig.update(new)
    elif hasattr(orig, "clear") and hasattr(orig, "extend"):  # deque
        orig.clear()
        orig.extend(new)


class Stub:
    """A name the program defines: calling it calls the program's function in the sandbox."""

    __slots__ = ("_conn", "_name", "__name__")

    def __init__(self, conn: Conn, name: str) -> None:
        self._conn, self._name, self.__name__ = conn, name, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.call({"f": self._name}, args, kwargs)

    def __repr__(self) -> str:
        return f"<program function {self._name}>"


def _crossing(self: Remote, *_: Any) -> Any:
    raise self._conn.fail(Crossing("a value of the program's own type was used (it is not plain data)"))


class Remote:
    """An object that stays in the sandbox (not plain data), or an attribute path on one
    (`root.left`). It can be passed back to the program, have an attribute set, or — a whole
    object, not an attribute — be called; anything else (comparing, truth, iterating, calling a
    method: `s.istitle()` would ask the program to judge its own value) fails the case."""

    __slots__ = ("_conn", "_ref", "_path")

    def __init__(self, conn: Conn, ref: int, path: tuple[str, ...] = ()) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_path", path)

    def _wire(self) -> Any:
        return [self._ref, *self._path] if self._path else self._ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._path:
            return _crossing(self)
        return self._conn.call({"r": self._ref}, args, kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        msg = {"op": "setattr", "r": self._wire(), "n": name, "v": self._conn.args(value)}
        reply = self._conn.ask(msg)
        if "x" in reply:
            raise self._conn.raised(reply)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return _crossing(self)
        return Remote(self._conn, self._ref, (*self._path, name))

    def __repr__(self) -> str:
        return "<program object>"

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _crossing
    __bool__ = __len__ = __iter__ = __contains__ = __getitem__ = __hash__ = _crossing
    __int__ = __float__ = __index__ = __str__ = __format__ = __abs__ = __neg__ = _crossing
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _crossing
    __mod__ = __round__ = __reversed__ = __next__ = __enter__ = __array__ = _crossing


# ----------------------------------------------------------------------------- a run


def bind_names(conn: Conn, names: list[str]) -> tuple[dict[str, Any], str | None]:
    """The program's names in the tests' namespace (see the module docstring), and the
    exception name when the program itself failed to run."""
    reply = conn.ask({"op": "names", "names": names})
    if reply.get("error"):
        return {}, str(reply["error"])[:80]
    out: dict[str, Any] = {}
    got = reply.get("names")
    for name in names:
        desc = got.get(name) if type(got) is dict else None
        if type(desc) is not dict:
            continue
        kind = desc.get("k")
        if kind == "fn":
            out[name] = Stub(conn, name)
        elif kind == "mod" and type(desc.get("m")) is str:
            module = _import(desc["m"])
            if module is not None:
                out[name] = module
        elif kind == "val":
            out[name] = conn.value(desc.get("v"))
        elif kind == "ref" and type(desc.get("r")) is int:
            out[name] = Remote(conn, desc["r"])
    return out, None


_NOT_IMPORTED = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc"})


def _import(name: str) -> Any:
    """A module the program imported and the tests use without importing it: the evaluator's own
    copy (a standard-library module or one already loaded here: an allowed package)."""
    import importlib
    import sys

    top = name.split(".")[0]
    if top in _NOT_IMPORTED or not all(p.isidentifier() for p in name.split(".")):
        return None
    if top not in sys.stdlib_module_names and top not in sys.modules:
        return None
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def run_tests(conn: Conn, tests: dict[str, Any], before: Any = None) -> dict[str, Any]:
    """Run the tests (`prepared`'s data) against the program behind `conn`; the verdict: one
    "1"/"0" per case. `before()` runs once the program has run and before the tests do."""
    steps = tests["steps"]
    n = sum(kind == "case" for kind, _ in steps)
    try:
        names, program_error = bind_names(conn, tests["names"])
    except ProgramEnded:
        names, program_error = {}, "exit"
    verdict: dict[str, Any] = {"n": n, "passed": "0" * n, "program_error": program_error}
    if program_error is not None:
        return verdict
    if before is not None:
        before()
    ns: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins, **names}
    passed = []
    for kind, code in steps:
        conn.bad = ""
        try:
            exec(code, ns)
            ok = True
        except BaseException as exc:  # a case fails however it ends; the tests cannot exit us
            ok = False
            if kind == "setup":
                verdict["tests_error"] = type(exc).__name__
        if conn.unverifiable:
            return {"n": n, "unverifiable": conn.unverifiable[:300]}
        if kind == "setup" and not ok:
            break
        if kind == "case":
            passed.append("1" if ok and not conn.bad else "0")
    verdict["passed"] = "".join(passed).ljust(n, "0")
    return verdict


def evaluate(cfg: dict[str, Any], eval_fd: int, call_sock: socket.socket, before: Any) -> dict[str, Any]:
    """In the unit, for one job: read the tests, wait for the program to have run (its answer
    to the names), give this process its own /tmp and limits, run the tests."""
    chunks = []
    while chunk := os.read(eval_fd, 1 << 20):
        chunks.append(chunk)
    os.close(eval_fd)
    tests = marshal.loads(b"".join(chunks))
    conn = Conn(call_sock)
    try:
        return run_tests(conn, tests, before)
    except MemoryError:
        return {"n": 0, "event": "memory"}
