"""Assert-style tests split so that expected values stay in the scorer (serve/scorers/code_cases.py):
which forms split and how, what never splits, the literal evaluator (it runs no test code), the
type-strict comparison, and the decoding of the harness's canonical values."""

from __future__ import annotations

import math

import pytest

from rewardplane.serve.execution.harness import encode
from rewardplane.serve.scorers.code_cases import Malformed, decode, passed, same, split_tests


def one(test: str):
    steps, cases = split_tests(test)
    assert len(cases) == 1, cases
    return cases[0]


@pytest.mark.parametrize(
    ("test", "expr", "op", "expected"),
    [
        ("assert f(1) == 2", "f(1)", "==", 2),
        ("assert 2 == f(1)", "f(1)", "==", 2),
        ("assert f(1) != 2, 'a message'", "f(1)", "!=", 2),
        ("assert f(1) < 10", "f(1)", "<", 10),
        ("assert 10 > f(1)", "f(1)", "<", 10),
        ("assert f(1) >= -1.5e3", "f(1)", ">=", -1500.0),
        ("assert f(1) in [1, 2]", "f(1)", "in", [1, 2]),
        ("assert f(1) not in {1, 2}", "f(1)", "not in", {1, 2}),
        ("assert 3 in f(1)", "f(1)", "contains", 3),
        ("assert f(1) is None", "f(1)", "is", None),
        ("assert f(1) is not None", "f(1)", "is not", None),
        ("assert f(1) is True", "f(1)", "is", True),
        ("assert f(1)", "f(1)", "truthy", None),
        ("assert not f(1)", "f(1)", "falsy", None),
        ("assert not (f(1) == 2)", "f(1)", "!=", 2),
        ("assert not (f(1) < 2)", "f(1)", ">=", 2),
        ("assert f(1) == set([1, 2])", "f(1)", "==", {1, 2}),
        ("assert f(1) == frozenset()", "f(1)", "==", frozenset()),
        ("assert f(1) == {'a': (1, 2), 2: {3}}", "f(1)", "==", {"a": (1, 2), 2: {3}}),
        ("assert f(1) == 1 / 3", "f(1)", "==", 1 / 3),
        ("assert f(1) == math.pi", "f(1)", "==", math.pi),
        ("assert f('é', [1,\n  2]) == 'ü'", "f('é', [1,\n  2])", "==", "ü"),
        ("assert round(f(1), 2) == 3.14", "round(f(1), 2)", "==", 3.14),
    ],
)
def test_forms_that_split_send_only_expr(test, expr, op, expected):
    case = one(test)
    assert (case.kind, case.source, case.op) == ("split", expr, op)
    assert same(case.expected, expected)
    steps, _ = split_tests(test)
    assert steps == [["expr", 0, expr]]


def test_tolerance_forms_keep_the_literal_outside():
    case = one("assert math.isclose(f(8), 3.14, rel_tol=1e-3)")
    assert (case.source, case.op, case.expected, case.options) == ("f(8)", "isclose", 3.14, {"rel_tol": 1e-3})
    case = one("assert math.isclose(2.5, f(8), abs_tol=0.1)")
    assert (case.source, case.expected) == ("f(8)", 2.5)
    # abs(EXPR - LIT) < TOL: EXPR alone goes in; `f(9) - 2.5` inside would let __sub__ decide
    case = one("assert abs(f(9) - 2.5) < 1e-6")
    assert (case.source, case.op, case.expected, case.options) == ("f(9)", "abs<", 2.5, {"tol": 1e-6})
    case = one("assert abs(2.5 - f(9)) <= 0.1")
    assert (case.source, case.op) == ("f(9)", "abs<=")
    assert case.check(2.55) and not case.check(2.7) and not case.check(True)


@pytest.mark.parametrize(
    "test",
    [
        "assert all(f(x) == x for x in range(3))",  # the comparison would happen inside
        "assert [f(1) == 2][0]",
        "assert f(1) == g(2)",  # EXPECTED is not a literal
        "assert f(1) == X",
        "assert 0 < f(1) < 3",  # chained
        "assert f(1) is x",
        "assert sorted(f(1), key=lambda x: -x) == [2, 1]",  # a lambda runs inside
        "for i in range(3):\n    assert f(i) == i + 1",
        "check(f)",
        "assert f(1) == float(open('/etc/passwd').read())",
        "assert f(1) == __import__('os').getpid()",
    ],
)
def test_what_cannot_be_split_runs_inside(test):
    case = one(test)
    assert case.kind == "run" and case.source == test


def test_helpers_defined_by_the_tests_are_never_split():
    steps, cases = split_tests("def ok(x):\n    return x == 1\n\nassert ok(f(1))\nassert ok(f(2)) == True\n")
    assert [c.kind for c in cases] == ["run", "run"]
    assert steps[0] == ["setup", "def ok(x):\n    return x == 1"]


def test_setup_anywhere_is_not_a_case_and_a_script_without_cases_is_one():
    steps, cases = split_tests("import math\nx = 2\nassert f(x) == 4\ny = f(3)\nassert y == 9\n")
    assert [s[0] for s in steps] == ["setup", "setup", "expr", "setup", "expr"]
    assert [c.source for c in cases] == ["f(x)", "y"]
    steps, cases = split_tests("x = f(1)\n")
    assert [c.kind for c in cases] == ["run"] and steps == [["run", 0, "x = f(1)\n"]]


def test_tests_that_do_not_compile_raise():
    with pytest.raises(SyntaxError):
        split_tests("assert (")
    with pytest.raises(SyntaxError):
        split_tests("return 1")  # only the compiler refuses it


def test_same_is_type_strict_with_the_documented_numeric_rule():
    assert same(1, 1.0) and same(2.0, 2) and same(-0.0, 0)
    assert not same(True, 1) and not same(1, True) and not same(0, False) and same(True, True)
    assert same(math.nan, math.nan) and not same(math.nan, 1.0)
    assert not same([1, 2], (1, 2)) and same((1, [2.0]), (1.0, [2]))
    assert same({1: "a"}, {1.0: "a"}) and not same({1: "a"}, {True: "a"})
    assert same({1, 2}, {2.0, 1}) and not same({1}, {True}) and not same({1}, frozenset({1}))
    assert not same("1", 1) and not same(b"a", "a") and same(None, None) and not same(None, 0)


def test_checks_on_decoded_values():
    assert one("assert f() in [1, 2]").check(2.0) and not one("assert f() in [1, 2]").check(True)
    assert one("assert 'b' in f()").check("abc") and not one("assert 'b' in f()").check(["abc"])
    assert one("assert f() < 3").check(2) and not one("assert f() < 3").check("2")
    assert not one("assert f() < 3").check(False)  # bool is not a number here
    assert one("assert f() is None").check(None) and not one("assert f() is None").check(0)
    assert one("assert f()").check([0]) and not one("assert f()").check([])


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        -(10**30),
        2.5,
        math.inf,
        -math.inf,
        "s",
        b"\x00b",
        [1, (2, 3)],
        {"a": {1, 2}},
        {(1, "x"): frozenset({3})},
        {1: [], 2.5: None},
    ],
)
def test_encode_decode_round_trip(value):
    assert same(decode(encode(value)), value)


def test_nan_round_trips_and_malformed_values_are_refused():
    assert math.isnan(decode(encode(math.nan)))
    for bad in ({"evil": 1}, {"dict": [[[1], 2]]}, {"set": [[1]]}, {"tuple": 3}, {"float": "1e9999x"}):
        with pytest.raises(Malformed):
            decode(bad)


def test_a_case_passes_only_on_its_own_first_record():
    _, cases = split_tests("assert f(1) == 2\nassert f(2) == 3\nfor i in []:\n    pass\n")
    assert passed(cases, [{"i": 0, "v": 2}, {"i": 1, "v": 3}, {"i": 2, "ok": True}]) == 3
    assert passed(cases, [{"i": 0, "v": 5}, {"i": 0, "v": 2}]) == 0  # the first record counts
    assert passed(cases, [{"i": 0, "ok": True}, {"i": 2, "v": 1}]) == 0  # wrong kind for the case
    assert passed(cases, [{"i": 7, "v": 2}, {"i": "0", "v": 2}, {"i": 1, "raised": "E"}]) == 0
    assert passed(cases, [{"i": 0, "v": {"evil": 1}}, {"i": 1, "v": {"tuple": [3]}}]) == 0
