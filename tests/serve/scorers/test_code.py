"""The `code` scorer, local backend: right/partial programs in both test shapes, and hostile
programs (infinite loop, fork bomb, 10 GB allocation, writes outside the sandbox, network,
100 MB of output) contained as per-item errors or failed cases while their neighbours score
normally; the sandbox_fusion backend against a fake SandboxFusion server on loopback; HTTP."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from rewardplane.core.errors import ConfigError
from rewardplane.serve.config import config_from_dict
from rewardplane.serve.execution import sandbox as sandbox_mod
from rewardplane.serve.execution.evaluator import prepared
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.code import CodeScorer, extract_code
from support.sandbox_fusion import FakeSandboxFusion, fake_sandbox_fusion
from support.serve import LiveServer, make_config

TIMEOUT_S = 1.0
ADD = {"inputs": ["1 2\n", "3 4\n", "10 -2\n"], "outputs": ["3\n", "7\n", "8\n"]}
RIGHT = "Here you go:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"
HALF = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n```"

NAMESPACES_OK = sandbox_mod.probe("namespaces")[0]
needs_ns = pytest.mark.skipif(not NAMESPACES_OK, reason="the kernel refuses user+mount+net namespaces here")


@pytest.fixture(scope="module")
def scorer():
    s = CodeScorer("code", options={"timeout_s": TIMEOUT_S, "concurrency": 4, "max_processes": 32})
    if not NAMESPACES_OK:
        s = CodeScorer("code", options={"timeout_s": TIMEOUT_S, "concurrency": 4, "isolation": "rlimits"})
    s.load()
    yield s
    s.close()


def item(response: str, reference, i: str = "x") -> ScoreItem:
    return ScoreItem(id=i, prompt="", response=response, reference=reference)


def test_extract_code():
    assert extract_code("a\n```python\nx=1\n```\nb\n```\ny=2\n```") == "y=2\n"
    assert extract_code("```cpp\nint main(){}\n```\n```python\nz=3\n```") == "z=3\n"
    assert extract_code("print(1)") == "print(1)"


def test_stdin_cases_fraction_and_all_or_nothing(scorer):
    got = scorer.score_batch([item(RIGHT, ADD, "r"), item(HALF, ADD, "h"), item(RIGHT, json.dumps(ADD), "s")])
    assert got == [1.0, pytest.approx(2 / 3), 1.0]
    strict = CodeScorer("strict", options={"scoring": "all_or_nothing"})
    strict.sandbox = scorer.sandbox  # share the running sandbox
    assert strict.score_batch([item(RIGHT, ADD), item(HALF, ADD)]) == [1.0, 0.0]


def test_assert_style_tests(scorer):
    tests = "import math\nassert f(1) == 2\nassert f(2) == 3\nassert f(3) == 5\n"
    got = scorer.score_batch(
        [
            item("```python\ndef f(x):\n    return x + 1\n```", {"tests": tests}, "two"),
            item("def f(x): return x + 1 if x < 3 else 5", {"tests": tests}, "all"),
            item("raise SystemExit(3)", {"tests": tests}, "exit"),
            item("import os\nos._exit(0)", {"tests": tests}, "cheat"),  # skipping the tests is no pass
        ]
    )
    assert got == [pytest.approx(2 / 3), 1.0, 0.0, 0.0]


def test_the_tests_never_enter_the_programs_process(scorer, monkeypatch):
    """The program's process gets the program only; the tests go to the evaluator's own pipe."""
    sent = []
    real = scorer.sandbox.run

    def spy(job, *args, **kwargs):
        sent.append(job)
        return real(job, *args, **kwargs)

    monkeypatch.setattr(scorer.sandbox, "run", spy)
    tests = "import math\nassert f(1) == 918273645\nassert math.isclose(f(4), 618273645.5, rel_tol=1e-9)\n"
    program = "import math\ndef f(x):\n    return {1: 918273645, 4: 618273645.5}.get(x, 0)"
    (got,) = scorer.score_batch([item(program, {"tests": tests})])
    assert got == 1.0
    (job,) = sent
    assert job["mode"] == "calls" and job["tests"] == tests  # to the sandbox object, which splits it:
    payloads = []
    real_exchange = scorer.sandbox._exchange

    def exchange(w, payloads_by_fd, *args):
        payloads.append(list(payloads_by_fd.values()))
        return real_exchange(w, payloads_by_fd, *args)

    monkeypatch.setattr(scorer.sandbox, "_exchange", exchange)
    assert scorer.score_batch([item(program, {"tests": tests})]) == [1.0]
    program_payload, evaluator_payload = payloads[0]
    assert b"assert" not in program_payload and b"isclose(f(4)" not in program_payload
    assert evaluator_payload == prepared(tests)  # the tests compiled, for the evaluator alone


def test_python_semantics_in_the_evaluator(scorer):
    """The value is rebuilt as the real class and compared by the test's own `==`: the honest
    answers plain Python accepts pass (Counter vs dict, 1 vs True, an in-place sort, a constant,
    a module the program imported), HumanEval's check(candidate) runs, and loops are cases."""
    cases = [
        (
            "from collections import Counter\ndef f(s):\n    return Counter(s)",
            "assert f('aab') == {'a': 2, 'b': 1}",
        ),
        ("def f(x):\n    return 1 if x else 0", "assert f(3) == True\nassert f(0) == False"),
        ("def f(xs):\n    xs.sort()", "x = [3, 1, 2]\nf(x)\nassert x == [1, 2, 3]"),
        ("N = 7\ndef f():\n    return N", "assert f() == N == 7"),
        (
            "import math\ndef f(r):\n    return math.pi * r * r",
            "assert math.isclose(f(1), 3.14159, rel_tol=1e-3)",
        ),
        (
            "def f(a, b):\n    return a + b",
            "def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(f)",
        ),
        ("def f(x):\n    return x + 1", "for x in range(3):\n    assert f(x) == x + 1"),
        (
            "def f(x):\n    raise ValueError('no')",
            "try:\n    f(1)\nexcept ValueError as e:\n    assert str(e) == 'no'",
        ),
        (
            "class P:\n    def __init__(s, a):\n        s.a = a\ndef g(ps):\n    return sum(p.a for p in ps)",
            "assert g([P(1), P(2)]) == 3",
        ),
    ]
    got = scorer.score_batch([item(code, {"tests": tests}, str(i)) for i, (code, tests) in enumerate(cases)])
    assert got == [1.0] * len(cases)
    assert scorer.take_batch_stats() == {"tests_evaluated": 11}
    assert scorer.take_batch_stats() == {}  # taken once


def test_what_cannot_cross(scorer):
    """A value of the program's own type, a generator or a str subclass fails the case where the
    tests use it; a test that passes the program its own lambda makes the item unverifiable."""
    got = scorer.score_batch(
        [
            item("def f():\n    return (x for x in [1])", {"tests": "assert list(f()) == [1]"}),
            item(
                "class S(str):\n    def istitle(s):\n        return True\ndef f():\n    return S('x')",
                {"tests": "assert f().istitle()"},
            ),
            item("def f(g):\n    return 1", {"tests": "assert f(lambda x: x) == 1"}),
        ]
    )
    assert got[:2] == [0.0, 0.0]
    assert isinstance(got[2], ItemError) and got[2].code == "unverifiable"


@pytest.mark.parametrize("reference", [None, "not json", {"inputs": ["1"]}, {"tests": "assert ("}, [1, 2]])
def test_bad_reference_is_bad_input(scorer, reference):
    (got,) = scorer.score_batch([item(RIGHT, reference)])
    assert isinstance(got, ItemError) and got.code == "bad_input"


def hostile_programs(tmp_path: Path, port: int) -> dict[str, str]:
    return {
        "loop": "while True:\n    pass",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "alloc_10gb": "x = bytearray(10 * 1024**3)\nprint(len(x))",
        # floods written in chunks, as a runaway print loop writes: each passes its cap within a
        # few writes, so a loaded machine cannot turn it into a timeout (a 100 MB string built
        # first could take longer than the 1 s limit while the fork bomb shares the cores)
        "output_100mb": "import sys\nfor _ in range(1600):\n    sys.stdout.write('x' * 65536)",
        "big_file": "f = open('/tmp/big', 'wb')\nfor _ in range(100):\n    f.write(b'x' * (1 << 20))",
        "write_outside": (
            f"for p in [{str(tmp_path / 'escape.txt')!r}, {str(Path.cwd() / 'ESCAPE_FROM_SANDBOX')!r}]:\n"
            "    try:\n        open(p, 'w').write('x')\n    except OSError as e:\n        print(type(e).__name__)\n"
        ),
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')",
    }


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:  # the unit's cgroup was removed between the glob and the read
        return ""


@needs_ns
def test_hostile_programs_are_contained_and_neighbours_unaffected(scorer, tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    progs = hostile_programs(tmp_path, port)
    items = [item(RIGHT, ADD, "before")]
    items += [item(code, ADD, name) for name, code in progs.items()]
    items += [item(RIGHT, ADD, "after"), item(HALF, ADD, "half")]
    t0 = time.monotonic()
    got = dict(zip([i.id for i in items], scorer.score_batch(items), strict=True))
    elapsed = time.monotonic() - t0
    assert got["before"] == 1.0 and got["after"] == 1.0 and got["half"] == pytest.approx(2 / 3)
    expected = {
        "loop": "timeout",
        "fork_bomb": "timeout",
        "alloc_10gb": "memory_limit",
        "output_100mb": "output_limit",
        "big_file": "output_limit",
    }
    for name, code in expected.items():
        assert isinstance(got[name], ItemError) and got[name].code == code, (name, got[name])
    # writes outside and network are refused *inside* the sandbox: the program fails its cases
    assert got["write_outside"] == 0.0 and got["network"] == 0.0
    assert not (tmp_path / "escape.txt").exists() and not (Path.cwd() / "ESCAPE_FROM_SANDBOX").exists()
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing ever connected
    listener.close()
    # the two timeouts run concurrently with the rest and nothing hangs the batch: a hostile
    # program that escaped its limit would hold it for good (ceiling slack for a loaded machine;
    # the limits themselves are the error codes above)
    assert elapsed < 120, elapsed
    # the sandbox is healthy afterwards and no fork-bomb process survived
    assert scorer.score_batch([item(RIGHT, ADD, str(i)) for i in range(8)]) == [1.0] * 8
    if scorer.sandbox.cfg["cgroup"]:
        base = Path(scorer.sandbox.cfg["cgroup"])
        deadline = time.monotonic() + 60  # the killed units are reaped in the background
        while time.monotonic() < deadline:
            procs = [p for d in base.glob("u*") for p in _read(d / "cgroup.procs").split()]
            if len(procs) <= 2 * scorer.sandbox.cfg["prefork"]:
                break
            time.sleep(0.1)
        # only the idle pre-forked units: a unit and its program's process waiting for a job
        assert len(procs) <= 2 * scorer.sandbox.cfg["prefork"], procs


def test_start_without_namespaces_needs_explicit_rlimits(monkeypatch):
    monkeypatch.setattr(sandbox_mod, "probe", lambda isolation: (False, "EPERM"))
    with pytest.raises(ConfigError, match="isolation: rlimits"):
        CodeScorer("c").load()
    s = CodeScorer("c", options={"isolation": "rlimits", "timeout_s": TIMEOUT_S})
    s.load()
    try:
        assert s.score_batch([item(RIGHT, ADD)]) == [1.0]
        assert s.info().extra["isolation"].startswith("rlimits only")
        (err,) = s.score_batch([item("while True: pass", ADD)])
        assert err.code == "timeout"
    finally:
        s.close()


def test_options_are_checked():
    with pytest.raises(ConfigError, match="unsafe_run_inside"):
        CodeScorer("c", options={"unsafe_run_inside": "sometimes"})
    with pytest.raises(ConfigError, match="packages"):
        CodeScorer("c", options={"packages": "numpy"})
    with pytest.raises(ConfigError, match="packages"):
        CodeScorer("c", options={"packages": ["yaml"], "backend": "sandbox_fusion", "url": "http://x"})
    with pytest.raises(ConfigError, match="not installed"):
        CodeScorer("c", options={"packages": ["surely_not_a_package_here"], "isolation": "rlimits"}).load()
    with pytest.raises(ConfigError, match="backend"):
        CodeScorer("c", options={"backend": "docker"})
    with pytest.raises(ConfigError, match="url"):
        CodeScorer("c", options={"backend": "sandbox_fusion"})
    with pytest.raises(ConfigError, match="scoring"):
        CodeScorer("c", options={"scoring": "best"})


@pytest.mark.parametrize(
    ("options", "want"),
    [
        ({"packages": "numpy"}, "packages: expected a list, got 'numpy'"),
        ({"packages": ["not a name"]}, "packages: 'not a name' is not an import name"),
        (
            {"packages": ["yaml"], "backend": "sandbox_fusion", "url": "http://x"},
            "packages: applies to backend local only",
        ),
        ({"backend": "sandbox_fusion"}, "url must be set with backend sandbox_fusion"),
    ],
)
def test_a_config_names_the_code_option_at_fault(options, want):
    """The code options are CodeOptions' fields and rules: the config loader names the dotted key."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({"scorers": [{"name": "c", "kind": "code", "options": options}]})
    assert str(info.value) == f"scorers[0].options.{want}"


# ----------------------------------------------------------------------------- sandbox_fusion


@pytest.fixture(scope="module")
def fusion_url():
    with fake_sandbox_fusion() as url:
        yield url


def test_sandbox_fusion_backend(fusion_url):
    FakeSandboxFusion.requests.clear()  # the double is shared with other modules
    options = {"backend": "sandbox_fusion", "url": fusion_url, "timeout_s": 3, "unsafe_run_inside": True}
    s = CodeScorer("sf", options=options)
    s.load()
    tests = "assert f(1) == 2\nassert f(2) == 3\nassert f(3) == 5\n"
    got = s.score_batch(
        [
            item(RIGHT, ADD, "right"),
            item(HALF, ADD, "half"),
            item("def f(x): return x + 1", {"tests": tests}, "asserts"),
            item("# TLE\nwhile True: pass", ADD, "tle"),
            item("# OOM", ADD, "oom"),
            item("# BOOM", ADD, "boom"),
            item("# HTTP500", ADD, "http500"),
        ]
    )
    assert got[:3] == [1.0, pytest.approx(2 / 3), pytest.approx(2 / 3)]
    assert [g.code for g in got[3:]] == ["timeout", "memory_limit", "sandbox_error", "sandbox_error"]
    assert all(r["language"] == "python" for r in FakeSandboxFusion.requests)
    assert "1 2\n" in [r["stdin"] for r in FakeSandboxFusion.requests]
    s2 = CodeScorer(
        "dead", options={"backend": "sandbox_fusion", "url": "http://127.0.0.1:9", "timeout_s": 1}
    )
    s2.load()
    (err,) = s2.score_batch([item(RIGHT, ADD)])
    assert err.code == "sandbox_error"  # an unreachable sandbox is an error, never 0
    assert s.info().extra["backend"] == "sandbox_fusion"
    # without the forgeable option, assert-style tests have no evaluator there: unverifiable
    safe = CodeScorer("sf2", options={"backend": "sandbox_fusion", "url": fusion_url, "timeout_s": 3})
    safe.load()
    (err,) = safe.score_batch([item("def f(x): return x + 1", {"tests": tests})])
    assert err.code == "unverifiable"


def test_through_http():
    opts = {"timeout_s": TIMEOUT_S, "concurrency": 2}
    if not NAMESPACES_OK:
        opts["isolation"] = "rlimits"
    with LiveServer(make_config([{"name": "code", "kind": "code", "options": opts}])) as server:
        items = [
            {"id": "right", "response": RIGHT, "reference": json.dumps(ADD)},
            {"id": "loop", "response": "while True: pass", "reference": json.dumps(ADD)},
            {"id": "noref", "response": RIGHT},
        ]
        r = httpx.post(server.url + "/v1/score", json={"scorers": ["code"], "items": items}, timeout=60)
        assert r.status_code == 200, r.text
        res = {x["id"]: x for x in r.json()["results"]}
        assert res["right"]["scores"] == {"code": 1.0}
        assert res["loop"]["errors"]["code"]["code"] == "timeout" and res["loop"]["scores"] == {}
        assert res["noref"]["errors"]["code"]["code"] == "bad_input"
        info = next(s for s in httpx.get(server.url + "/v1/scorers").json()["scorers"] if s["name"] == "code")
        assert info["kind"] == "code" and info["extra"]["backend"] == "local"
        assert "isolation" in info["extra"] and info["extra"]["limits"]["timeout_s"] == TIMEOUT_S
