"""Red team against the `code` scorer's SandboxFusion backend, with a SandboxFusion double that runs
what it receives. SandboxFusion runs one script and returns its stdout: the trusted evaluator
cannot run there, so assert-style tests are `unverifiable` (never a number) unless the config
sets `unsafe_run_inside: true` — and then they run in the program's own process, where the
exploits of issue 43 pay: recorded here as the reason the option carries that name."""

from __future__ import annotations

import pytest

from rewardplane.serve.protocol import ScoreItem
from rewardplane.serve.scorers.code import CodeScorer
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
def url():
    with fake_sandbox_fusion() as u:
        yield u


def make(url: str, **options) -> CodeScorer:
    s = CodeScorer(
        "sf", options={"backend": "sandbox_fusion", "url": url, "timeout_s": 3, "concurrency": 4, **options}
    )
    s.load()
    return s


def item(response: str, i: str) -> ScoreItem:
    return ScoreItem(id=i, prompt="", response=response, reference={"tests": TESTS})


def test_without_the_unsafe_option_assert_style_items_are_unverifiable_and_never_sent(url):
    FakeSandboxFusion.requests.clear()
    s = make(url)
    got = s.score_batch([item(RIGHT, "right"), *(item(p, n) for n, p in EXPLOITS.items())])
    assert {g.code for g in got} == {"unverifiable"}
    assert FakeSandboxFusion.requests == []  # nothing ran: no number can come of it
    s.close()


def test_with_unsafe_run_inside_the_tests_share_the_programs_process_and_exploits_pay(url):
    """Recorded, not defended: the option's name says so (docs/verifiers.md, "Reward hacking")."""
    s = make(url, unsafe_run_inside=True)
    got = dict(
        zip(
            ["right", *EXPLOITS],
            s.score_batch([item(RIGHT, "right"), *(item(p, n) for n, p in EXPLOITS.items())]),
            strict=True,
        )
    )
    assert got["right"] == 1.0
    assert got["always_equal"] == 1.0  # the comparison runs where the program's __eq__ is
    assert got["hunts_for_the_expected"] == 1.0  # the tests, expected values included, are readable
    assert got["sys_exit_at_import"] == 0.0 and got["loops_forever"].code == "timeout"
    s.close()
