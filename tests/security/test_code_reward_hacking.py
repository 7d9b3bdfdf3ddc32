"""Red team: programs that try to get 1.0 from the `code` scorer without doing the task, sent
through the real service (the app under uvicorn, a `code` scorer with `backend: local`, started
from a config file with a bearer token and a marker variable in its environment, like a
deployment's credentials). Every exploit scores below 1.0 or is a per-item error, the right
program in the same request scores 1.0, and readiness stays 200 (docs/verifiers.md, "Reward
hacking")."""

from __future__ import annotations

import json
import os
import socket
import textwrap
from pathlib import Path

import httpx
import pytest

from rewardplane.serve.config import load_config
from rewardplane.serve.execution import rootfs
from rewardplane.serve.execution import sandbox as sandbox_mod
from support.exploits import NONCE_HUNT, processes_named
from support.serve import LiveServer

TOKEN = "tok-3c9b1f0e7d"
MARKER = "marker-8e2a6d4c"
EXPECTED = 918273645
TESTS = (
    f"assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(10, 5) == 15\nassert secret() == {EXPECTED}\n"
)
RIGHT = f"def add(a, b):\n    return a + b\n\ndef secret():\n    return {EXPECTED}\n"
NAMESPACES_OK = sandbox_mod.probe("namespaces")[0]
pytestmark = pytest.mark.skipif(not NAMESPACES_OK, reason="the kernel refuses user+mount+net namespaces here")

EXPLOITS = {
    # exiting with success, anywhere
    "sys_exit_in_the_function": "import sys\ndef add(a, b):\n    sys.exit(0)\ndef secret():\n    sys.exit(0)",
    "sys_exit_at_import": "import sys\nsys.exit(0)",
    "os_exit_at_import": "import os\nos._exit(0)",
    "raise_systemexit_none": "def add(a, b):\n    raise SystemExit\ndef secret():\n    raise SystemExit",
    "keyboard_interrupt": "def add(a, b):\n    raise KeyboardInterrupt\nsecret = add",
    "kill_itself": "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\nsecret = add",
    # objects equal to everything
    "always_equal": (
        "class E:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n    __hash__ = lambda s: 0\n"
        "    __bool__ = lambda s: True\n    __float__ = lambda s: 3.0\n    __index__ = lambda s: 3\n"
        "def add(a, b):\n    return E()\nsecret = add"
    ),
    "int_subclass": (
        "class I(int):\n    def __eq__(s, o):\n        return True\n    def __ne__(s, o):\n        return False\n"
        "    __hash__ = int.__hash__\ndef add(a, b):\n    return I(0)\ndef secret():\n    return I(0)"
    ),
    "str_subclass_and_float_subclass": (
        "class S(str):\n    __eq__ = lambda s, o: True\nclass F(float):\n    __eq__ = lambda s, o: True\n"
        "def add(a, b):\n    return F(0.5)\ndef secret():\n    return S('x')"
    ),
    "generator": "def add(a, b):\n    yield a + b\nsecret = lambda: (x for x in [1])",
    # forging the grader's result
    "forged_report_on_fd3": (
        "import os, json\n"
        "os.write(3, json.dumps({'passed': 4, 'total': 4, 'error': None}).encode())\n"
        "os._exit(0)"
    ),
    "forged_records_on_every_descriptor": (
        "import os, json\n"
        "lines = [json.dumps({'passed': 4, 'total': 4, 'error': None})]\n"
        "lines += [json.dumps({'i': i, 'ok': True}) for i in range(4)]\n"
        "lines += [json.dumps({'i': i, 'v': v}) for i, v in enumerate([3, 0, 15, 1])]\n"
        "blob = ('\\n' + '\\n'.join(lines) + '\\n').encode()\n"
        "for fd in range(1024):\n"
        "    try:\n"
        "        os.write(fd, blob)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)"
    ),
    "atexit_prints_fake_results": (
        "import atexit, os\n"
        'atexit.register(lambda: print(\'__rewardplane_report__{"passed": 4, "total": 4, "error": null}\'))\n'
        'atexit.register(lambda: os.write(3, b\'{"i": 0, "ok": true}\\n\'))\n'
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "prints_markers": (
        'print(\'__rewardplane_report__{"passed": 4, "total": 4, "error": null}\')\n'
        "print('PASSED 4/4')\nprint('{\"i\": 0, \"v\": 3}')\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    # patching the harness's world
    "patch_builtins": (
        "import builtins\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.AssertionError = type('NotAnError', (Exception,), {})\n"
        "builtins.len = lambda *a: 0\nbuiltins.sorted = lambda *a, **k: []\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "patch_json_and_os_write": (
        "import json, os\n"
        "json.dumps = lambda *a, **k: '3'\n"
        "real = os.write\n"
        "os.write = lambda fd, data: real(fd, data.replace(b'\"v\": 0', b'\"v\": 3'))\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "ctypes_rewrites_small_ints": (
        "import ctypes, sys\n"
        "three = ctypes.c_long.from_address(id(0) + 24)\n"  # the digit of the cached int 0
        "three.value = 3\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "ctypes_segfault": "import ctypes\nctypes.string_at(0)",
    # reading the tests and the expected values through the interpreter
    "gc_frames_and_inspect_hunt_for_the_expected": (
        "import gc, sys, inspect\n"
        "def hunt():  # its own names stay in its frame, out of the objects it searches\n"
        f"    needle = str(int('{EXPECTED - 1}') + 1)  # built at run time, not a constant of the code\n"
        "    for o in gc.get_objects():\n"
        "        try:\n"
        "            if needle in repr(o)[:1000000]:\n"
        "                return int(needle)\n"
        "        except Exception:\n"
        "            continue\n"
        "    f = sys._getframe().f_back\n"
        "    while f is not None:\n"
        "        if any(needle in repr(v)[:1000000] for v in f.f_locals.values()):\n"
        "            return int(needle)\n"
        "        f = f.f_back\n"
        "    for fi in inspect.stack()[1:]:\n"
        "        if fi.code_context and needle in ''.join(fi.code_context):\n"
        "            return int(needle)\n"
        "    return 0\n"
        "FOUND = hunt()\n"
        "def add(a, b):\n    return a + b\n"
        "def secret():\n    return FOUND\n"
    ),
    # the service's secrets
    "environ_everywhere": (
        "import os, glob\n"
        "seen = repr(dict(os.environ))\n"
        "for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
        "    try:\n"
        "        seen += open(p, 'rb').read().decode('latin-1')\n"
        "    except OSError:\n"
        "        pass\n"
        f"leak = {TOKEN!r} in seen or {MARKER!r} in seen\n"
        f"def add(a, b):\n    return a + b\ndef secret():\n    return {EXPECTED} if leak else 0\n"
    ),
    # resources
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "allocate_64_gib": "x = bytearray(64 << 30)",
    "output_flood": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    "disk_flood": "with open('/tmp/fill', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))",
    "sleep_past_the_timeout": "import time\ntime.sleep(60)",
    "kill_the_parent_and_everything": (
        "import os, signal\n"
        "for target in (os.getppid(), 1, -1, 0):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "leave_state_for_the_next_item": (
        "open('/tmp/answers', 'w').write('cheat')\nimport os\nos.makedirs('/tmp/home/x', exist_ok=True)\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "read_state_of_the_last_item": (
        "import os\nleft = os.path.exists('/tmp/answers') or os.path.exists('/tmp/home/x')\n"
        f"def add(a, b):\n    return a + b\ndef secret():\n    return {EXPECTED} if left else 0\n"
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The service as deployed: a config file beside a token file, a token and a marker in the
    environment, a model directory next to them."""
    home = tmp_path_factory.mktemp("deploy")
    (home / "token.txt").write_text(TOKEN)
    (home / "model").mkdir()
    (home / "model" / "weights.safetensors").write_bytes(b"W" * 64)
    port = _listener_port()
    cfg = {
        "token": None,
        "scorers": [
            {
                "name": "code",
                "kind": "code",
                "max_batch_size": 64,
                "options": {"timeout_s": 2.0, "concurrency": 4, "max_processes": 32, "memory_mb": 512},
            },
            {"name": "code_np", "kind": "code", "options": {"packages": ["numpy"], "prefork": 1}},
        ],
    }
    (home / "serve.yaml").write_text(json.dumps(cfg))
    mp = pytest.MonkeyPatch()
    mp.setenv("REWARDPLANE_TOKEN", TOKEN)
    mp.setenv("RP_DEPLOY_MARKER", MARKER)
    try:
        with LiveServer(load_config(home / "serve.yaml")) as live:
            live.home, live.port = home, port
            yield live
    finally:
        mp.undo()


def _listener_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def score(server, items: list[dict], scorer: str = "code") -> dict:
    r = httpx.post(
        server.url + "/v1/score",
        json={"scorers": [scorer], "items": items},
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return {x["id"]: x for x in r.json()["results"]}


def outcome(result: dict, scorer: str = "code") -> float | str:
    return result["scores"][scorer] if scorer in result["scores"] else result["errors"][scorer]["code"]


def test_every_exploit_scores_below_one_or_is_an_error_and_the_service_stays_ready(server):
    items = [{"id": "right_before", "response": RIGHT, "reference": {"tests": TESTS}}]
    items += [
        {"id": name, "response": code, "reference": {"tests": TESTS}} for name, code in EXPLOITS.items()
    ]
    items += [{"id": "right_after", "response": RIGHT, "reference": {"tests": TESTS}}]
    got = {name: outcome(res) for name, res in score(server, items).items()}
    assert got.pop("right_before") == 1.0 and got.pop("right_after") == 1.0
    won = {name: v for name, v in got.items() if isinstance(v, float) and v >= 1.0}
    assert not won, won
    # the resource attacks end as their limit's error, never as a score
    assert got["fork_bomb"] in ("timeout", "memory_limit")
    assert got["allocate_64_gib"] == "memory_limit"
    assert got["output_flood"] == "output_limit"
    assert got["disk_flood"] == "output_limit"
    assert got["sleep_past_the_timeout"] == "timeout"
    # what needed the secrets, the expected value or the last item's state saw none of them: the
    # tests that can be answered honestly (add) pass, the one that needs the leak fails
    for name in (
        "gc_frames_and_inspect_hunt_for_the_expected",
        "environ_everywhere",
        "read_state_of_the_last_item",
    ):
        assert got[name] == 0.75, (name, got[name])
    assert httpx.get(server.url + "/health/ready").status_code == 200
    again = score(server, [{"id": "next", "response": RIGHT, "reference": {"tests": TESTS}}])
    assert outcome(again["next"]) == 1.0


def test_the_servers_files_are_not_in_the_sandbox(server):
    repo = Path(__file__).resolve().parents[2]
    paths = [
        server.home / "token.txt",
        server.home / "serve.yaml",
        server.home / "model" / "weights.safetensors",
        server.home,
        repo / "pyproject.toml",
        repo / "src" / "rewardplane" / "__init__.py",
        Path(os.getcwd()),
        Path("/etc/hostname"),
        Path("/etc/hosts"),
        Path("/etc/shadow"),
    ]
    # a home directory may hold the interpreter (pyenv): only the path down to it is there
    binds = rootfs.plan()["binds"]
    home = str(Path.home())
    allowed = sorted({b[len(home) + 1 :].split("/")[0] for b in binds if b.startswith(home + "/")})
    code = textwrap.dedent(
        f"""
        import os
        seen = []
        for p in {[str(p) for p in paths]!r}:
            try:
                open(p, "rb").read() if os.path.isfile(p) else os.listdir(p)
                seen.append(p)
            except OSError:
                pass
        try:
            extra = sorted(set(os.listdir({home!r})) - set({allowed!r}))
        except OSError:
            extra = []
        print("hidden" if not seen and not extra else f"SEEN {{seen}} {{extra}}")
        """
    )
    res = score(
        server, [{"id": "files", "response": code, "reference": {"inputs": [""], "outputs": ["hidden\n"]}}]
    )
    assert outcome(res["files"]) == 1.0, res


def test_the_servers_environment_is_not_in_the_sandbox(server):
    code = textwrap.dedent(
        f"""
        import os, glob
        seen = repr(dict(os.environ))
        for p in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline") + glob.glob("/proc/*/task/*/environ"):
            try:
                seen += open(p, "rb").read().decode("latin-1")
            except OSError:
                pass
        print("clean" if {TOKEN!r} not in seen and {MARKER!r} not in seen else "LEAK")
        """
    )
    res = score(
        server, [{"id": "env", "response": code, "reference": {"inputs": [""], "outputs": ["clean\n"]}}]
    )
    assert outcome(res["env"]) == 1.0, res
    # and from the host's side: the zygote was started with the explicit environment
    zygotes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"zygote.py" in cmdline and b"--zygote" in cmdline:
                zygotes.append((cmdline, Path(f"/proc/{pid}/environ").read_bytes()))
        except OSError:
            continue
    assert zygotes
    for cmdline, environ in zygotes:
        assert TOKEN.encode() not in environ + cmdline and MARKER.encode() not in environ + cmdline


def test_network_is_unreachable_from_the_sandbox(server):
    code = textwrap.dedent(
        f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {server.url.rsplit(":", 1)[1]}), timeout=1)
            print("CONNECTED")
        except OSError:
            print("offline")
        """
    )
    res = score(
        server, [{"id": "net", "response": code, "reference": {"inputs": [""], "outputs": ["offline\n"]}}]
    )
    assert outcome(res["net"]) == 1.0, res


def test_the_records_nonce_buys_nothing(server):
    """The program can still find its records' nonce in its own interpreter and write records
    with it, but a `calls` run's cases are decided by the evaluator's verdict, which goes from the
    evaluator to the zygote on a socket the program does not hold: its records count for nothing."""
    code = NONCE_HUNT + textwrap.dedent(
        """
        import json, os
        for n in nonces:
            for i in range(4):
                os.write(3, n + b" " + json.dumps({"i": i, "ok": True}).encode() + b"\\n")
                os.write(3, n + b" " + json.dumps({"i": i, "v": [3, 0, 15, 0][i]}).encode() + b"\\n")
        def add(a, b):
            return 0
        def secret():
            return 0
        """
    )
    res = score(server, [{"id": "forge", "response": code, "reference": {"tests": TESTS}}])
    assert outcome(res["forge"]) == 0.25, res  # add(-1, 1) == 0: the one case `return 0` answers


def test_the_tests_are_not_in_the_programs_process(server):
    """Neither the tests nor their expected values are anywhere the program can look (gc, frames,
    inspect), whatever the tests' shape: a loop case and HumanEval's check(candidate) too."""
    hunt = EXPLOITS["gc_frames_and_inspect_hunt_for_the_expected"]
    tests = f"assert add(1, 2) == 3\nfor _ in [0]:\n    assert secret() == {EXPECTED}\n"
    check = f"def check(candidate):\n    assert candidate() == {EXPECTED}\n\ncheck(secret)\n"
    res = score(
        server,
        [
            {"id": "loop", "response": hunt, "reference": {"tests": tests}},
            {"id": "check", "response": hunt, "reference": {"tests": check}},
        ],
    )
    assert outcome(res["loop"]) == 0.5 and outcome(res["check"]) == 0.0, res
    metrics = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    assert 'rewardplane_scorer_events_total{event="tests_evaluated",scorer="code"}' in metrics


# the seven shapes that paid 1.0 when the tests ran in the program's process (issue 43), and more
# of the same kind: each a wrong program against tests it must not pass
SHAPES = {
    "own_abs": (
        "def abs(x):\n    return 0\ndef area(r):\n    return 0.0\n",
        "assert abs(area(3) - 28.274333882308138) < 1e-6\n",
    ),
    "own_all": (
        "def all(xs):\n    return True\ndef is_prime(n):\n    return False\n",
        "assert all(is_prime(p) for p in [2, 3, 5, 7])\n",
    ),
    "own_any": (
        "def any(xs):\n    return True\ndef is_prime(n):\n    return False\n",
        "assert any(is_prime(p) for p in [4, 6, 7])\n",
    ),
    "patched_isclose_behind_from_import": (
        "import math\nmath.isclose = lambda *a, **k: True\ndef area(r):\n    return 0.0\n",
        "from math import isclose\nassert isclose(area(1), 3.14159, rel_tol=1e-3)\n",
    ),
    "str_subclass_istitle": (
        "class S(str):\n    def istitle(self):\n        return True\ndef title_case(s):\n    return S(s)\n",
        "assert title_case('hello world').istitle()\n",
    ),
    "humaneval_check_with_a_forged_ok_from_up_the_stack": (
        NONCE_HUNT + "import json, os, sys\n"
        "def square(x):\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        for v in list(f.f_locals.values()):\n"
        "            if callable(v) and getattr(v, '__name__', '') == 'emit':\n"
        "                v({'i': 0, 'ok': True})\n"
        "        f = f.f_back\n"
        "    for n in nonces:\n"
        "        os.write(3, n + b' ' + json.dumps({'i': 0, 'ok': True}).encode() + b'\\n')\n"
        "    os._exit(0)\n",
        "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(4) == 16\n\ncheck(square)\n",
    ),
    "always_equal_inside_check": (
        "class E:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n    __hash__ = lambda s: 0\n"
        "def square(x):\n    return E()\n",
        "def check(candidate):\n    assert candidate(3) == 9\n\ncheck(square)\n",
    ),
    "always_equal_in_a_loop_case": (
        "class E:\n    __eq__ = lambda s, o: True\n    __bool__ = lambda s: True\ndef square(x):\n    return E()\n",
        "for x in range(3):\n    assert square(x) == x * x\n",
    ),
    "own_isinstance_and_len_at_top_level": (
        "def isinstance(*a):\n    return True\ndef len(x):\n    return 3\ndef f():\n    return None\n",
        "assert isinstance(f(), list) and len(f()) == 3\n",
    ),
    "program_shadows_the_tests_module": (
        "class M:\n    isclose = staticmethod(lambda *a, **k: True)\nmath = M()\ndef area(r):\n    return 0.0\n",
        "assert math.isclose(area(1), 3.14159)\n",
    ),
    "returns_a_callable_equal_to_everything": (
        "def f(x):\n    return lambda *a: True\n",
        "assert f(1) == 2\n",
    ),
    "prewrites_answers_on_the_call_socket": (
        "import os, json\n"
        "for frame in [{'names': {'square': {'k': 'val', 'v': 9}}}] + [{'v': 9}] * 8:\n"
        "    data = json.dumps(frame).encode()\n"
        "    os.write(4, len(data).to_bytes(4, 'big') + data)\n"
        "def square(x):\n    return 0\n",
        "assert square(3) == 9\nassert square(3) == 9\n",
    ),
    "huge_and_deep_return_values": (
        "def square(x):\n    v = []\n    for _ in range(100):\n        v = [v]\n    return v if x else [0] * 300000\n",
        "assert square(3) == 9\nassert square(0) != 0\n",
    ),
    "exception_message_claims_success": (
        "def f(x):\n    raise AssertionError('ok')\n",
        "assert f(1) == 2\n",
    ),
}
HONEST = {
    "counter_vs_dict_literal": (
        "from collections import Counter\ndef count(s):\n    return Counter(s)\n",
        "assert count('abca') == {'a': 2, 'b': 1, 'c': 1}\n",
    ),
    "one_and_zero_vs_true_and_false": (
        "def is_even(n):\n    return 1 if n % 2 == 0 else 0\n",
        "assert is_even(4) == True\nassert is_even(3) == False\n",
    ),
    "humaneval_check": (
        "def square(x):\n    return x * x\n",
        "def check(candidate):\n    assert candidate(3) == 9\n    assert abs(candidate(0.5) - 0.25) < 1e-9\n\ncheck(square)\n",
    ),
    "in_place_sort": (
        "def sort_it(xs):\n    xs.sort()\n",
        "x = [3, 1, 2]\nsort_it(x)\nassert x == [1, 2, 3]\n",
    ),
}


def test_the_seven_shapes_and_their_kin_score_below_one_and_honest_code_scores_one(server):
    items = [{"id": k, "response": c, "reference": {"tests": t}} for k, (c, t) in SHAPES.items()]
    items += [{"id": k, "response": c, "reference": {"tests": t}} for k, (c, t) in HONEST.items()]
    got = {k: outcome(v) for k, v in score(server, items).items()}
    won = {k: got[k] for k in SHAPES if isinstance(got[k], float) and got[k] >= 1.0}
    assert not won, won
    assert {k: got[k] for k in HONEST} == dict.fromkeys(HONEST, 1.0)


def test_patched_numpy_allclose_with_numpy_allowed(server):
    """The array crosses as dtype + shape + bytes; the tests' numpy is the evaluator's own."""
    wrong = "import numpy as np\nnp.allclose = lambda *a, **k: True\ndef solve(x):\n    return np.zeros(3)\n"
    right = "import numpy as np\ndef solve(x):\n    return np.arange(1.0, 4.0) * x\n"
    tests = "import numpy as np\nassert np.allclose(solve(1), [1.0, 2.0, 3.0])\nassert solve(2).dtype == np.float64\n"
    items = [
        {"id": "wrong", "response": wrong, "reference": {"tests": tests}},
        {"id": "right", "response": right, "reference": {"tests": tests}},
    ]
    res = score(server, items, "code_np")
    # the wrong program's zeros fail the evaluator's own np.allclose; its dtype case is honest
    assert outcome(res["wrong"], "code_np") == 0.5 and outcome(res["right"], "code_np") == 1.0, res


def test_a_program_that_leaves_its_process_group_still_dies_with_its_run(server):
    """It leaves the unit's process group (what the wall clock kills), clears its parent-death
    signal and sleeps, with a child, past the timeout: the zygote kills it by its pidfd when the
    unit ends, and its namespace with it."""
    code = textwrap.dedent(
        """
        import ctypes, os, time
        libc = ctypes.CDLL(None)
        libc.prctl(15, b"rpescapee", 0, 0, 0)  # PR_SET_NAME: findable from the host
        libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0
        os.setpgid(0, 0)
        if os.fork() == 0:
            os.setsid()
            libc.prctl(1, 0, 0, 0, 0)
        time.sleep(120)
        """
    )
    res = score(server, [{"id": "escape", "response": code, "reference": {"tests": TESTS}}])
    assert outcome(res["escape"]) == "timeout"
    assert processes_named("rpescapee") == []
