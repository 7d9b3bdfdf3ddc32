"""The local sandbox on its own (`LocalSandbox`, no scorer): the view a program gets inside the
namespaces, the job shapes, the limits enforced from outside, and a zygote that comes back."""

from __future__ import annotations

import pytest

from rewardplane.serve.execution import sandbox as sandbox_mod
from rewardplane.serve.execution.sandbox import LocalSandbox

NAMESPACES_OK = sandbox_mod.probe("namespaces")[0]
needs_ns = pytest.mark.skipif(not NAMESPACES_OK, reason="the kernel refuses user+mount+net namespaces here")


@pytest.fixture(scope="module")
def box():
    b = LocalSandbox(isolation="namespaces" if NAMESPACES_OK else "rlimits", timeout_s=2.0, prefork=2)
    b.start()
    yield b
    b.close()


def run(box: LocalSandbox, code: str, stdin: str = ""):
    return box.run({"mode": "stdin", "code": code, "stdin": stdin})


def test_stdin_job_reads_its_input_and_reports(box):
    r = run(box, "print(int(input()) * 2)", "21\n")
    assert r.status == "ok" and r.stdout == b"42\n" and r.report["error"] is None, r
    r = run(box, "raise ValueError('no')")
    assert r.status == "ok" and r.report["error"] == "ValueError"


def test_wall_clock_limit_is_enforced_from_outside_and_the_box_recovers(box):
    r = box.run({"mode": "stdin", "code": "import time\ntime.sleep(30)", "stdin": ""}, timeout_s=0.5)
    assert r.status == "timeout" and r.wall_s < 5
    assert run(box, "print('next')").stdout == b"next\n"


def test_a_dead_zygote_is_restarted_on_the_next_run(box):
    box._proc.kill()
    box._proc.wait()
    deadline_ok = False
    for _ in range(50):  # the reader thread notices the EOF, the next run starts a fresh zygote
        r = run(box, "print('back')")
        if r.status == "ok":
            deadline_ok = r.stdout == b"back\n"
            break
    assert deadline_ok and box.restarts >= 1


@needs_ns
def test_sandbox_view_is_isolated(box):
    code = (
        "import os, socket\n"
        "print(os.getpid(), os.getcwd(), len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n"
    )
    r = run(box, code)
    pid, cwd, nprocs = r.stdout.decode().splitlines()[0].split()
    assert pid == "1" and cwd == "/tmp/work" and int(nprocs) <= 2
    assert r.stdout.decode().splitlines()[1] == "['lo']"  # a fresh network namespace
    # the runner keeps the server's uid: home directories and secrets are covered, the
    # interpreter's own files stay importable
    code = (
        "import os, fractions, statistics\n"
        "print(open('/etc/shadow').read() == '' if os.path.exists('/etc/shadow') else True)\n"
        "print(os.listdir('/home') if os.path.isdir('/home') else [])\n"
    )
    r = run(box, code)
    assert r.status == "ok" and r.report["error"] is None, r
    assert r.stdout.decode().splitlines() == ["True", "[]"]
