"""Red team against the `code` scorer's SandboxFusion backend, with a SandboxFusion double that runs
what it receives: the expected values never leave the scorer (no request holds one), the
exploits that need the grader's cooperation score below 1.0, and the right program scores 1.0.
The records share stdout with the program there, behind a nonce the program can read (it is in
the script it runs in): forging with it is recorded here, and worth only the values it guesses."""

from __future__ import annotations

import textwrap

import pytest

from rewardplane.serve.protocol import ScoreItem
from rewardplane.serve.scorers.code import CodeScorer
from support.exploits import NONCE_HUNT
from support.sandbox_fusion import FakeSandboxFusion, fake_sandbox_fusion

EXPECTED = 918273645
TESTS = f"assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert secret() == {EXPECTED}\n"
RIGHT = f"def add(a, b):\n    return a + b\n\ndef secret():\n    return {EXPECTED}\n"
EXPLOITS = {
    "sys_exit_at_import": "import sys\nsys.exit(0)",
    "os_exit_at_import": "import os\nos._exit(0)",
    "sys_exit_in_the_function": "import sys\ndef add(a, b):\n    sys.exit(0)\nsecret = lambda: sys.exit(0)",
    "always_equal": (
        "class E:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n    __hash__ = lambda s: 0\n"
        "def add(a, b):\n    return E()\nsecret = lambda: E()"
    ),
    "int_subclass": "class I(int):\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return I(0)\nsecret = lambda: I(0)",
    "old_report_marker_printed": (
        'print(\'\\n__rewardplane_report__{"passed": 3, "total": 3, "error": null}\')\n'
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "atexit_prints_records": (
        "import atexit, json\n"
        "atexit.register(lambda: print('\\n'.join(json.dumps({'i': i, 'v': v}) for i, v in enumerate([3, 0, 1]))))\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "patch_builtins": (
        "import builtins\nbuiltins.type = lambda *a: int\nbuiltins.isinstance = lambda *a: True\n"
        "def add(a, b):\n    return 0\nsecret = lambda: 0"
    ),
    "hunts_for_the_expected": (
        "import gc\n"
        "def hunt():\n"
        f"    needle = str(int('{EXPECTED - 1}') + 1)  # built at run time, not a constant of the code\n"
        "    return int(needle) if any(needle in repr(o)[:100000] for o in gc.get_objects()) else 0\n"
        "FOUND = hunt()\n"
        "def add(a, b):\n    return a + b\nsecret = lambda: FOUND"
    ),
    "loops_forever": "while True:\n    pass",
}


@pytest.fixture(scope="module")
def scorer():
    with fake_sandbox_fusion() as url:
        s = CodeScorer(
            "sf", options={"backend": "sandbox_fusion", "url": url, "timeout_s": 3, "concurrency": 4}
        )
        s.load()
        yield s
        s.close()


def item(response: str, i: str) -> ScoreItem:
    return ScoreItem(id=i, prompt="", response=response, reference={"tests": TESTS})


def test_exploits_score_below_one_and_no_request_holds_an_expected_value(scorer):
    FakeSandboxFusion.requests.clear()
    names = ["right_before", *EXPLOITS, "right_after"]
    programs = [RIGHT, *EXPLOITS.values(), RIGHT]
    got = dict(
        zip(
            names, scorer.score_batch([item(p, n) for n, p in zip(names, programs, strict=True)]), strict=True
        )
    )
    assert got.pop("right_before") == 1.0 and got.pop("right_after") == 1.0
    won = {n: v for n, v in got.items() if isinstance(v, float) and v >= 1.0}
    assert not won, won
    assert got["loops_forever"].code == "timeout"
    assert got["hunts_for_the_expected"] == pytest.approx(2 / 3)  # found nothing to return
    # what was sent: the programs (two of which hold the value: RIGHT) and the harness with EXPRs
    for body in FakeSandboxFusion.requests:
        harness_part = body["code"].rsplit("fusion_main(", 1)[-1]
        steps = harness_part.split('"steps"', 1)[-1]
        assert str(EXPECTED) not in steps, steps[:300]


def test_forging_records_with_the_nonce_from_the_script_is_a_guess(scorer):
    """Recorded, not defended: the nonce is in the script the program runs in."""
    code = NONCE_HUNT.replace("nonces", "cell_nonces") + textwrap.dedent(
        """
        import json, re, sys
        # the script: a file SandboxFusion wrote (its argv[0]) or, here, python -c's argument
        src = open(sys.argv[0]).read() if sys.argv[0] not in ("", "-c") else " ".join(sys.orig_argv)
        frame = sys._getframe()
        while frame.f_back is not None:
            frame = frame.f_back
        nonces = set(re.findall(r"'([0-9a-f]{32})'\\)", src)) | {
            v for v in frame.f_globals.values() if isinstance(v, str) and re.fullmatch("[0-9a-f]{32}", v)
        }
        nonces |= {n.decode() for n in cell_nonces}
        for n in nonces:
            for i, v in enumerate([3, 0, 123]):
                print("\\n" + n + " " + json.dumps({"i": i, "v": v}))
        def add(a, b):
            return 0
        secret = lambda: 0
        """
    )
    (got,) = scorer.score_batch([item(code, "forge")])
    # found: its forged records come first and count; the two public answers are right, the
    # expected value it had to guess is not
    assert got == pytest.approx(2 / 3)
