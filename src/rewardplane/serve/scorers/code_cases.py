"""Assert-style tests split so that expected values never enter the sandbox.

`split_tests(source)` reads the tests with `ast` and turns each top-level statement into a step
for the harness (`serve/execution/harness.py`):

- imports, defs, classes, assignments (and `pass`, docstrings) are *setup*, executed in order;
- `assert EXPR <op> EXPECTED` with EXPECTED a literal the scorer can evaluate itself (`literal`)
  is a *split* case: the sandbox evaluates only EXPR and sends back its canonical value; `Case.check`
  compares it with EXPECTED here. Understood forms: `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`,
  `not in` (either side literal), `is None`, `is not None`, `is True`, `is False`, a bare
  `assert EXPR` and `assert not EXPR` (truthiness), `math.isclose(EXPR, LIT, rel_tol=..,
  abs_tol=..)` and `abs(EXPR - LIT) < TOL` (either order, `<` or `<=`);
- every other statement (a loop, a call to a helper that asserts, a chained comparison, an
  EXPECTED that is not a literal) is an *unsplittable* case: run inside as a whole, passing if it
  completes — exactly what a program in the same process can subvert (counted in /metrics,
  refused with `unsplittable_tests: error`).

The comparison is type-strict on decoded builtin values (`same`): bool equals only bool
(`True == 1` fails), int and float compare by value (`1 == 1.0` passes), NaN equals NaN, list
and tuple differ, dict keys and set elements match under the same rule. A value that was not a
builtin instance never arrives: the harness refuses to encode it and the case fails.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import math
import operator
from dataclasses import dataclass, field
from typing import Any

SETUP_NODES = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Pass,
)
_ORDER = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_MIRROR = {
    ast.Lt: ast.Gt,
    ast.LtE: ast.GtE,
    ast.Gt: ast.Lt,
    ast.GtE: ast.LtE,
    ast.Eq: ast.Eq,
    ast.NotEq: ast.NotEq,
}
_MATH_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf, "nan": math.nan}
_CONSTRUCTORS = {
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "dict": dict,
    "float": float,
}
_NUMBER_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_NOT_LITERAL = object()


def literal(node: ast.AST) -> Any:
    """The value of an EXPECTED the scorer can evaluate itself — Python literals, `-x`,
    arithmetic on numbers, `set()`/`frozenset(...)`/`tuple(...)`/`list(...)`/`dict(...)`/
    `float('inf')` of literals, `math.pi`/`e`/`tau`/`inf`/`nan` — else `_NOT_LITERAL`. Nothing
    here runs code from the tests."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return _evaluate(node)
    except (ValueError, TypeError, ArithmeticError, KeyError, RecursionError, _NotLiteral):
        return _NOT_LITERAL


class _NotLiteral(Exception):
    pass


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _evaluate(node.operand)
        if type(v) not in (int, float):
            raise _NotLiteral
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _NUMBER_OPS:
        a, b = _evaluate(node.left), _evaluate(node.right)
        if type(a) not in (int, float) or type(b) not in (int, float):
            raise _NotLiteral
        if isinstance(node.op, ast.Pow) and (abs(b) > 256 or abs(a) > 1 << 64):
            raise _NotLiteral  # no huge powers evaluated in the server
        return _NUMBER_OPS[type(node.op)](a, b)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items = [_evaluate(e) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _NotLiteral
        return {_evaluate(k): _evaluate(v) for k, v in zip(node.keys, node.values, strict=True)}
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "math"
        and node.attr in _MATH_CONSTANTS
    ):
        return _MATH_CONSTANTS[node.attr]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONSTRUCTORS:
        if node.keywords or len(node.args) > 1:
            raise _NotLiteral
        args = [_evaluate(a) for a in node.args]
        if node.func.id == "float" and not (args and type(args[0]) in (int, float, str)):
            raise _NotLiteral
        return _CONSTRUCTORS[node.func.id](*args)
    raise _NotLiteral


# ----------------------------------------------------------------------------- comparison


def _key(v: Any) -> Any:
    """A hashable form under which `same` values collide (dict keys, set elements)."""
    t = type(v)
    if t is bool:
        return ("bool", v)
    if t is float and v != v:
        return ("nan",)
    if t in (int, float):
        return ("num", v)
    if t is tuple:
        return ("tuple", tuple(_key(x) for x in v))
    if t is frozenset:
        return ("frozenset", frozenset(_key(x) for x in v))
    return (t.__name__, v)


def same(a: Any, b: Any) -> bool:
    """Type-strict equality of two builtin values (the module docstring's rule)."""
    ta, tb = type(a), type(b)
    if ta is bool or tb is bool:
        return ta is tb and a == b
    if ta in (int, float) and tb in (int, float):
        if ta is float and tb is float and a != a and b != b:
            return True
        return a == b
    if ta is not tb:
        return False
    if ta in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if ta is dict:
        ka = {_key(k): v for k, v in a.items()}
        kb = {_key(k): v for k, v in b.items()}
        return ka.keys() == kb.keys() and all(same(v, kb[k]) for k, v in ka.items())
    if ta in (set, frozenset):
        return {_key(x) for x in a} == {_key(x) for x in b}
    return a == b


def _contains(container: Any, item: Any) -> bool:
    t = type(container)
    if t in (str, bytes):
        return type(item) is t and item in container
    if t in (list, tuple):
        return any(same(item, x) for x in container)
    if t in (set, frozenset, dict):
        try:
            return _key(item) in {_key(x) for x in container}
        except TypeError:  # an unhashable item is in no set
            return False
    return False


def _number(v: Any) -> bool:
    return type(v) in (int, float)


def _ordered(op: type, a: Any, b: Any) -> bool:
    if _number(a) and _number(b) or type(a) is type(b) and type(a) in (str, bytes, list, tuple):
        try:
            return bool(_ORDER[op](a, b))
        except TypeError:
            return False
    return False


@dataclass
class Case:
    """One case: `kind` "split" (checked here against `expected`) or "run" (inside)."""

    index: int
    kind: str
    source: str
    op: str = ""
    expected: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    def check(self, value: Any) -> bool:
        """Does EXPR's decoded value pass this case?"""
        op, want = self.op, self.expected
        if op == "==":
            return same(value, want)
        if op == "!=":
            return not same(value, want)
        if op in ("<", "<=", ">", ">="):
            cls = {"<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE}[op]
            return _ordered(cls, value, want)
        if op == "in":
            return _contains(want, value)
        if op == "not in":
            return not _contains(want, value)
        if op == "contains":  # LIT in EXPR
            return _contains(value, want)
        if op == "not contains":
            return not _contains(value, want)
        if op == "is":
            return value is want
        if op == "is not":
            return value is not want
        if op == "truthy":
            return bool(value)
        if op == "falsy":
            return not bool(value)
        if op == "isclose":
            return _number(value) and math.isclose(value, want, **self.options)
        if op in ("abs<", "abs<="):
            if not _number(value):
                return False
            diff = abs(value - want)
            return diff < self.options["tol"] if op == "abs<" else diff <= self.options["tol"]
        raise AssertionError(f"unknown op {op!r}")


# ----------------------------------------------------------------------------- splitting

_OPS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
}


class _Source:
    """Source segments by the nodes' positions (ast's column offsets count UTF-8 bytes), with
    the lines split once instead of once per segment as `ast.get_source_segment` does."""

    def __init__(self, text: str) -> None:
        self.lines = [line.encode() for line in text.splitlines(keepends=True)]

    def __call__(self, node: ast.AST) -> str:
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return self.lines[first][node.col_offset : node.end_col_offset].decode()
        parts = [self.lines[first][node.col_offset :], *self.lines[first + 1 : last]]
        return b"".join([*parts, self.lines[last][: node.end_col_offset]]).decode()


_NEGATED = {
    "==": "!=",
    "!=": "==",
    "<": ">=",
    ">=": "<",
    ">": "<=",
    "<=": ">",
    "in": "not in",
    "not in": "in",
    "contains": "not contains",
    "not contains": "contains",
    "is": "is not",
    "is not": "is",
}


def _in_process(node: ast.AST, helpers: set[str]) -> bool:
    """Would EXPR decide anything inside the program's process? A comparison, a lambda or a
    function the tests define (a helper that asserts or compares) would be decided there, where
    an object equal to everything wins: such a statement is not split."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Compare | ast.Lambda):
            return True
        if isinstance(sub, ast.Name) and sub.id in helpers:
            return True
    return False


def _split_test(test: ast.expr, helpers: set[str]) -> tuple[ast.expr, str, Any, dict] | None:
    """(EXPR, op, EXPECTED, options) of one assert's test, or None."""
    parts = _split_form(test, helpers)
    if parts is None and isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _split_form(test.operand, helpers)
        if inner is not None and inner[1] in _NEGATED:
            parts = (inner[0], _NEGATED[inner[1]], inner[2], inner[3])
        elif inner is not None and inner[1] == "truthy":
            parts = (inner[0], "falsy", None, {})
    if parts is None or _in_process(parts[0], helpers):
        return None
    return parts


def _split_form(test: ast.expr, helpers: set[str]) -> tuple[ast.expr, str, Any, dict] | None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return None  # handled by the caller, once
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        (op,), left, right = test.ops, test.left, test.comparators[0]
        if isinstance(op, ast.Lt | ast.LtE) and (tolerance := _split_abs(left, right, op)) is not None:
            return tolerance  # before `<`: the literal inside abs(...) must not go in
        if type(op) in _OPS:
            if (want := literal(right)) is not _NOT_LITERAL:
                return left, _OPS[type(op)], want, {}
            if (want := literal(left)) is not _NOT_LITERAL:  # LIT op EXPR: mirrored
                return right, _OPS[_MIRROR[type(op)]], want, {}
            return None
        if isinstance(op, ast.In | ast.NotIn):
            name = "in" if isinstance(op, ast.In) else "not in"
            if (want := literal(right)) is not _NOT_LITERAL:
                return left, name, want, {}
            if (want := literal(left)) is not _NOT_LITERAL:
                return right, {"in": "contains", "not in": "not contains"}[name], want, {}
            return None
        constant = isinstance(right, ast.Constant) and any(right.value is c for c in (None, True, False))
        if isinstance(op, ast.Is | ast.IsNot) and constant:
            return left, "is" if isinstance(op, ast.Is) else "is not", right.value, {}
        return None
    if isinstance(test, ast.Compare):
        return None  # chained
    if isinstance(test, ast.Call) and _is_isclose(test.func):
        return _split_isclose(test)
    return test, "truthy", None, {}


def _is_isclose(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "isclose"
        and isinstance(func.value, ast.Name)
        and func.value.id == "math"
    )


def _split_isclose(call: ast.Call) -> tuple[ast.expr, str, Any, dict] | None:
    if len(call.args) != 2 or any(k.arg not in ("rel_tol", "abs_tol") for k in call.keywords):
        return None
    options = {k.arg: literal(k.value) for k in call.keywords}
    if any(v is _NOT_LITERAL or type(v) not in (int, float) for v in options.values()):
        return None
    a, b = call.args
    for expr, lit in ((a, b), (b, a)):
        want = literal(lit)
        if want is not _NOT_LITERAL and type(want) in (int, float):
            return expr, "isclose", want, options
    return None


def _split_abs(left: ast.expr, right: ast.expr, cmp: ast.cmpop) -> tuple[ast.expr, str, Any, dict] | None:
    """`abs(EXPR - LIT) < TOL` or `abs(LIT - EXPR) <= TOL`."""
    op = "abs<" if isinstance(cmp, ast.Lt) else "abs<="
    tol = literal(right)
    if (
        type(tol) not in (int, float)
        or not isinstance(left, ast.Call)
        or not (isinstance(left.func, ast.Name) and left.func.id == "abs")
        or len(left.args) != 1
        or left.keywords
        or not isinstance(left.args[0], ast.BinOp)
        or not isinstance(left.args[0].op, ast.Sub)
    ):
        return None
    diff = left.args[0]
    for expr, lit in ((diff.left, diff.right), (diff.right, diff.left)):
        want = literal(lit)
        if want is not _NOT_LITERAL and type(want) in (int, float):
            return expr, op, want, {"tol": tol}
    return None


def _is_setup(node: ast.stmt) -> bool:
    docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    return isinstance(node, SETUP_NODES) or docstring


def _helpers(tree: ast.Module) -> set[str]:
    """Names the tests bind at top level to functions, classes or lambdas."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@functools.lru_cache(maxsize=4096)
def split_tests(tests: str) -> tuple[list[list[Any]], list[Case]]:
    """(the harness's steps, the cases) — shared, never to be modified: a group of responses to
    one prompt (GRPO) splits its tests once. A script without any case is one unsplittable case.
    Tests that do not compile raise SyntaxError (or ValueError)."""
    tree = ast.parse(tests)
    compile(tree, "<tests>", "exec")  # what only the compiler refuses (`return` outside a def, ...)
    src = _Source(tests)
    helpers = _helpers(tree)
    steps: list[list[Any]] = []
    cases: list[Case] = []
    for node in tree.body:
        text = src(node)
        if _is_setup(node):
            steps.append(["setup", text])
            continue
        k = len(cases)
        parts = _split_test(node.test, helpers) if isinstance(node, ast.Assert) else None
        if parts is None:
            cases.append(Case(k, "run", text))
            steps.append(["run", k, text])
        else:
            expr, op, want, options = parts
            cases.append(Case(k, "split", src(expr), op, want, options))
            steps.append(["expr", k, src(expr)])
    if not cases:
        cases.append(Case(0, "run", tests))
        steps = [["run", 0, tests]]
    return steps, cases


# ----------------------------------------------------------------------------- values back


class Malformed(ValueError):
    pass


def decode(data: Any) -> Any:
    """The harness's canonical JSON back into builtin values (`harness.encode`'s inverse)."""
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is float:
        return data
    if type(data) is list:
        return [decode(x) for x in data]
    if type(data) is dict and len(data) == 1:
        ((tag, body),) = data.items()
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "tuple" and type(body) is list:
            return tuple(decode(x) for x in body)
        if tag == "dict" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            try:
                return {decode(k): decode(v) for k, v in body}
            except TypeError:
                raise Malformed("unhashable key") from None
        if tag in ("set", "frozenset") and type(body) is list:
            try:
                return (set if tag == "set" else frozenset)(decode(x) for x in body)
            except TypeError:
                raise Malformed("unhashable element") from None
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
    raise Malformed(f"not a canonical value: {str(data)[:60]}")


def passed(cases: list[Case], records: list[dict[str, Any]]) -> int:
    """How many cases passed: a case passes only on its own first record, which says so. A
    record for an unknown case, a value for an unsplittable case or an `ok` for a split one
    counts for nothing."""
    seen: set[int] = set()
    n = 0
    for rec in records:
        k = rec.get("i")
        if type(k) is not int or not 0 <= k < len(cases) or k in seen:
            continue
        seen.add(k)
        case = cases[k]
        if case.kind == "run":
            n += rec.get("ok") is True and len(rec) == 2
        elif "v" in rec:
            with contextlib.suppress(Malformed, ValueError, TypeError, OverflowError, RecursionError):
                n += case.check(decode(rec["v"]))
    return n
