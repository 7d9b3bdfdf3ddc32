"""Plain data: the only values that cross between the trusted evaluator and the program.

A value crosses as tagged JSON and is rebuilt on the other side as a fresh instance of the real
class, so no object, method or class of one process ever runs in the other (no pickle). What
crosses, identified by EXACT type against the classes captured here before any program ran:

    None bool int str float (nan/inf tagged) complex bytes bytearray
    list tuple dict set frozenset                                   nested, bounded
    collections: Counter OrderedDict defaultdict(builtin factory) deque namedtuple instances
    decimal.Decimal fractions.Fraction datetime.{date,datetime,time,timedelta} (fixed offsets)
    the builtin types above themselves (`int`, `str`, ...: an argument such as `isinstance`'s)
    numpy ndarray (dtype + shape + bytes, no object dtype) and numpy scalars, when numpy is loaded

Anything else (a program-defined class, a subclass of `str`, a function, a generator) does not
cross: `encode` hands it to `other`, which the caller chooses — the program's side keeps the
object and sends a reference (`{"ref": n}`); the evaluator's side refuses (`Unverifiable`).

Stdlib only: loaded by file path into the zygote (the program's process and the evaluator are
forks of it) and imported through the package by the server's tests.
"""

from __future__ import annotations

import collections
import datetime as _dt
import decimal
import fractions
import json
import re
import sys
from typing import Any

MAX_DEPTH = 64
MAX_NODES = 1 << 18
"""Values with more nested parts than this do not cross (the whole value stays where it is)."""

# captured before any program runs: rebinding a name later changes nothing here
_type, _len, _range, _isinstance, _issubclass = type, len, range, isinstance, issubclass
_dict_items, _tuple_get, _tuple_len = dict.items, tuple.__getitem__, tuple.__len__
_INF = float("inf")
_SCALARS = (type(None), bool, int, str)
Counter, OrderedDict, defaultdict, deque = (
    collections.Counter,
    collections.OrderedDict,
    collections.defaultdict,
    collections.deque,
)
Decimal, Fraction = decimal.Decimal, fractions.Fraction
_TIMES = {_dt.date: "date", _dt.datetime: "datetime", _dt.time: "time"}
_FACTORIES = {None: None, int: "int", float: "float", str: "str", list: "list", dict: "dict", set: "set"}
_FACTORY_BY_NAME = {v: k for k, v in _FACTORIES.items() if v}
_TYPES = {t: t.__name__ for t in (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)}
_TYPE_BY_NAME = {v: k for k, v in _TYPES.items()}
_DTYPE = re.compile(r"[<>|=]?[?biufcSUmM]\d*(\[\w+\])?")
_np: Any = None
_np_scalars: frozenset = frozenset()


class Unencodable(Exception):
    pass


class Malformed(ValueError):
    pass


def capture() -> None:
    """Take numpy's classes if it is loaded (an allowed package, preimported by the zygote)."""
    global _np, _np_scalars
    np = sys.modules.get("numpy")
    if np is not None and _np is None:
        _np = np
        kinds = {v for v in np.sctypeDict.values() if _isinstance(v, type)}
        _np_scalars = frozenset(k for k in kinds if k not in (np.object_, np.void))


class _Walk:
    def __init__(self, other: Any) -> None:
        self.other, self.nodes = other, 0

    def __call__(self, v: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise Unencodable("too large or nested too deeply")
        t = _type(v)
        if t in _SCALARS:
            return v
        d = depth + 1
        if t is float:
            if v != v or v == _INF or v == -_INF:
                return {"f": "nan" if v != v else ("inf" if v > 0 else "-inf")}
            return v
        if t is list:
            return [self(x, d) for x in v]
        if t is tuple:
            return {"t": [self(x, d) for x in v]}
        if t is dict or t is Counter or t is OrderedDict:
            tag = {dict: "d", Counter: "C", OrderedDict: "O"}[t]
            return {tag: [[self(k, d), self(x, d)] for k, x in _dict_items(v)]}
        if t is set or t is frozenset:
            return {"s" if t is set else "fs": [self(x, d) for x in v]}
        if t is bytes or t is bytearray:
            return {"b" if t is bytes else "ba": v.hex()}
        if t is complex:
            return {"j": [self(v.real, d), self(v.imag, d)]}
        return self.rest(v, t, d)

    def rest(self, v: Any, t: type, d: int) -> Any:
        if t is defaultdict and v.default_factory in _FACTORIES:
            return {
                "dd": [_FACTORIES[v.default_factory], [[self(k, d), self(x, d)] for k, x in _dict_items(v)]]
            }
        if t is deque:
            return {"dq": [v.maxlen, [self(x, d) for x in v]]}
        if t is Decimal:
            return {"dec": str(v)}
        if t is Fraction:
            return {"fr": [v.numerator, v.denominator]}
        if t in _TIMES and (t is _dt.date or v.tzinfo is None or _type(v.tzinfo) is _dt.timezone):
            return {_TIMES[t]: v.isoformat()}
        if t is _dt.timedelta:
            return {"td": [v.days, v.seconds, v.microseconds]}
        if t is type and v in _TYPES:  # a builtin type as an argument: remove_datatype(xs, int)
            return {"ty": _TYPES[v]}
        if _is_namedtuple(t):
            items = [self(_tuple_get(v, i), d) for i in _range(_tuple_len(v))]
            return {"nt": [t.__name__, list(t._fields), items]}
        if _np is not None and t is _np.ndarray and _plain_dtype(v.dtype):
            return {"nd": [v.dtype.str, list(v.shape), _np.ascontiguousarray(v).tobytes().hex()]}
        if t in _np_scalars and _plain_dtype(v.dtype):
            return {"ns": [v.dtype.str, v.tobytes().hex()]}
        return self.other(v)


def _is_namedtuple(t: type) -> bool:
    fields = t.__dict__.get("_fields")
    return (
        t.__bases__ == (tuple,)
        and _type(fields) is tuple
        and all(_type(f) is str for f in fields)
        and _type(t.__dict__.get("__name__", t.__name__)) is str
    )


def _plain_dtype(dtype: Any) -> bool:
    return not dtype.hasobject and dtype.fields is None and dtype.kind in "?biufcSUmM"


def _refuse(v: Any) -> Any:
    t = _type(v)
    raise Unencodable(f"{t.__module__}.{t.__qualname__}"[:80])


def encode(value: Any, other: Any = _refuse) -> Any:
    """`value` as tagged JSON data; a part that is not plain goes to `other(part)`."""
    return _Walk(other)(value)


def dumps(data: Any) -> bytes:
    return json.dumps(data, allow_nan=False, separators=(",", ":")).encode()


_NAMEDTUPLES: dict[tuple[str, tuple[str, ...]], type] = {}


def decode(data: Any, ref: Any = None, depth: int = 0) -> Any:
    """Tagged JSON back into fresh instances of the real classes; `{"ref": n}` and `{"fn": name}`
    go to `ref(tag, body)` (None: refused). Anything else is `Malformed`."""
    t = _type(data)
    if t in _SCALARS or t is float:
        return data
    if depth > MAX_DEPTH:
        raise Malformed("nested too deeply")
    d = depth + 1
    if t is list:
        return [decode(x, ref, d) for x in data]
    if t is not dict or _len(data) != 1:
        raise Malformed("not a tagged value")
    ((tag, body),) = data.items()
    try:
        return _decode_tagged(tag, body, ref, d)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, ArithmeticError) as exc:
        if _isinstance(exc, Malformed):
            raise
        raise Malformed(f"{tag}: {exc}"[:120]) from None


def _pairs(body: Any, ref: Any, d: int) -> list[tuple[Any, Any]]:
    return [(decode(k, ref, d), decode(v, ref, d)) for k, v in body]


def _decode_tagged(tag: str, body: Any, ref: Any, d: int) -> Any:
    if tag == "f" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "t":
        return tuple(decode(x, ref, d) for x in body)
    if tag in ("d", "C", "O"):
        pairs = _pairs(body, ref, d)
        return Counter(dict(pairs)) if tag == "C" else (dict if tag == "d" else OrderedDict)(pairs)
    if tag in ("s", "fs"):
        return (set if tag == "s" else frozenset)(decode(x, ref, d) for x in body)
    if tag in ("b", "ba") and _type(body) is str:
        return (bytes if tag == "b" else bytearray).fromhex(body)
    if tag == "j":
        return complex(decode(body[0], ref, d), decode(body[1], ref, d))
    if tag == "dd":
        factory = None if body[0] is None else _FACTORY_BY_NAME[body[0]]
        return defaultdict(factory, _pairs(body[1], ref, d))
    if tag == "dq":
        return deque([decode(x, ref, d) for x in body[1]], body[0])
    if tag == "dec" and _type(body) is str:
        return Decimal(body)
    if tag == "fr":
        return Fraction(int(body[0]), int(body[1]))
    if tag in ("date", "datetime", "time") and _type(body) is str:
        return {"date": _dt.date, "datetime": _dt.datetime, "time": _dt.time}[tag].fromisoformat(body)
    if tag == "td":
        return _dt.timedelta(days=int(body[0]), seconds=int(body[1]), microseconds=int(body[2]))
    if tag == "ty":
        return _TYPE_BY_NAME[body]
    if tag == "nt":
        key = (str(body[0]), tuple(str(f) for f in body[1]))
        if key not in _NAMEDTUPLES:
            _NAMEDTUPLES[key] = collections.namedtuple(*key)
        return _NAMEDTUPLES[key](*(decode(x, ref, d) for x in body[2]))
    if tag in ("nd", "ns") and _np is not None:
        return _decode_numpy(tag, body)
    if tag in ("ref", "fn") and ref is not None:
        return ref(tag, body)
    raise Malformed(f"unknown tag {tag!r}")


def _decode_numpy(tag: str, body: Any) -> Any:
    if _type(body[0]) is not str or not _DTYPE.fullmatch(body[0]):
        raise Malformed("dtype")
    dtype = _np.dtype(body[0])
    if tag == "ns":
        return _np.frombuffer(bytes.fromhex(body[1]), dtype=dtype)[0]
    shape = tuple(int(n) for n in body[1])
    return _np.frombuffer(bytes.fromhex(body[2]), dtype=dtype).reshape(shape).copy()
