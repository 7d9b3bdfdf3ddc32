"""Plain data (`plain.py`), the only values that cross between the evaluator and the program, and
the evaluator's reading of the tests: no sandbox needed."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import math

import numpy as np
import pytest

from rewardplane.serve.execution import plain
from rewardplane.serve.execution.evaluator import split_cases, wanted_names

P = collections.namedtuple("P", "x y")
VALUES = [
    None,
    True,
    0,
    -(10**30),
    1.5,
    "é",
    b"\x00",
    bytearray(b"ab"),
    3 + 4j,
    [1, [2.0, "x"]],
    (1, (2,)),
    {(1, 2): {frozenset({1}): None}},
    {1, "a"},
    collections.Counter("aab"),
    collections.OrderedDict(b=1, a=2),
    collections.defaultdict(list, a=[1]),
    collections.deque([1, 2], 5),
    P(1, [2]),
    decimal.Decimal("1.10"),
    fractions.Fraction(2, 6),
    datetime.date(2020, 1, 2),
    datetime.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
    datetime.time(3, 4),
    datetime.timedelta(days=-1, seconds=5),
    int,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip_rebuilds_the_real_class(value):
    back = plain.decode(plain.encode(value))
    assert back == value
    if isinstance(value, P):  # a namedtuple of the same name and fields, built on this side
        assert type(back).__name__ == "P" and back._fields == ("x", "y") and back.y == [2]
    else:
        assert type(back) is type(value)
    if isinstance(value, collections.defaultdict):
        assert back.default_factory is list
    if isinstance(value, collections.deque):
        assert back.maxlen == 5


def test_special_floats_and_numpy():
    back = plain.decode(plain.encode([math.nan, math.inf, -math.inf]))
    assert math.isnan(back[0]) and back[1:] == [math.inf, -math.inf]
    plain.capture()
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    got = plain.decode(plain.encode(arr))
    assert got.dtype == np.int16 and (got == arr).all()
    assert type(plain.decode(plain.encode(np.float64(0.5)))) is np.float64
    with pytest.raises(plain.Unencodable):
        plain.encode(np.array([object()]))


class S(str):
    pass


class B(int):
    pass


@pytest.mark.parametrize("value", [S("x"), B(1), lambda: 1, (x for x in []), object(), [S("x")], {1: S("y")}])
def test_only_exact_types_cross(value):
    with pytest.raises(plain.Unencodable):
        plain.encode(value)
    seen = []
    plain.encode(value, lambda v: seen.append(v) or {"ref": 1})
    assert seen  # the caller decides what becomes of what does not cross


@pytest.mark.parametrize(
    "data",
    [
        {"x": 1},
        {"t": 1, "d": 2},
        {"nd": ["O", [1], "00"]},
        {"ref": 1},
        {"fn": "f"},
        {"ty": "object"},
        {"b": "zz"},
    ],
)
def test_anything_else_is_malformed(data):
    with pytest.raises(plain.Malformed):
        plain.decode(data)  # references only where the caller accepts them


def test_bounds():
    deep: list = []
    for _ in range(plain.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(plain.Unencodable):
        plain.encode(deep)
    with pytest.raises(plain.Unencodable):
        plain.encode([0] * (plain.MAX_NODES + 1))


def test_the_tests_never_ask_the_program_for_a_builtin_or_their_own_names():
    tests = (
        "from math import isclose\nimport numpy as np\nK = 3\ndef helper(x):\n    return abs(x)\n"
        "assert all(isclose(f(p), K) for p in ps)\nassert helper(g(1)) == len(h)\n"
        "def check(candidate):\n    y = candidate(1)\n    assert y == 2\ncheck(f)\n"
    )
    assert wanted_names(tests) == ["candidate", "f", "g", "h", "ps", "x", "y"]
    kinds = [kind for kind, _, _ in split_cases(tests)]
    assert kinds == ["setup", "setup", "setup", "setup", "case", "case", "setup", "case"]
    assert [kind for kind, _, _ in split_cases("x = f(1)\n")] == ["case"]  # no case: the script is one
