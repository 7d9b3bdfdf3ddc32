"""The local sandbox on its own (`LocalSandbox`, no scorer): the view a program gets inside the
namespaces, the job shapes, the limits enforced from outside, and a zygote that comes back."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewardplane.serve.execution import sandbox as sandbox_mod
from rewardplane.serve.execution.sandbox import LocalSandbox
from support.exploits import processes_named

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
    assert r.status == "ok" and r.stdout == b"42\n" and r.program_error() is None, r
    r = run(box, "raise ValueError('no')")
    assert r.status == "ok" and r.program_error() == "ValueError"
    assert run(box, "import sys\nsys.exit(0)").program_error() is None
    assert run(box, "import sys\nsys.exit(3)").program_error() == "SystemExit(3)"
    assert run(box, "import os\nos._exit(4)").program_error() == "exit 4"


def test_wall_clock_limit_is_enforced_from_outside_and_the_box_recovers(box):
    r = box.run({"mode": "stdin", "code": "import time\ntime.sleep(30)", "stdin": ""}, timeout_s=0.5)
    assert r.status == "timeout" and r.wall_s < 5
    assert run(box, "print('next')").stdout == b"next\n"


def test_a_dead_zygote_is_restarted_on_the_next_run(box):
    before = box.restarts
    box._proc.kill()
    box._proc.wait()
    # the very next run finds the zygote dead and starts a fresh one: it does not wait for the
    # reader thread to notice the EOF (on a loaded machine that thread may not run for a while)
    r = run(box, "print('back')")
    assert r.status == "ok" and r.stdout == b"back\n", r
    assert box.restarts == before + 1
    assert run(box, "print('again')").stdout == b"again\n" and box.restarts == before + 1


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
    assert r.status == "ok" and r.program_error() is None, r
    assert r.stdout.decode().splitlines() == ["True", "[]"]


ASSERT_JOB = {"mode": "assert", "code": "def f(x):\n    return x + 1", "steps": []}


def calls_job(tests: str, code: str = "def f(x):\n    return x + 1\n") -> dict:
    return {"mode": "calls", "code": code, "tests": tests}


def test_calls_job_runs_the_tests_in_the_evaluator_and_reports_a_verdict(box):
    tests = (
        "import math\n"
        "assert f(1) == 2\n"
        "assert f(2) == (3,)\n"  # fails
        "assert math.isclose(f(0.5), 1.5)\n"
        "f(None)\n"  # TypeError in the program: the case fails
        "try:\n    f(None)\nexcept TypeError:\n    pass\n"  # the builtin type crosses
    )
    r = box.run(calls_job(tests))
    assert r.status == "ok", r
    assert r.report["verdict"] == {"n": 5, "passed": "10101", "program_error": None}
    assert r.records == []  # the program's process sends no case records


def test_an_exit_ends_the_program_and_every_later_call_fails(box):
    code = "import sys\ndef f(x):\n    if x == 2:\n        sys.exit(0)\n    return x + 1\n"
    r = box.run(
        calls_job("assert f(1) == 2\nassert f(2) == 3\ntry:\n    f(1)\nexcept BaseException:\n    pass", code)
    )
    assert r.status == "ok" and r.report["verdict"]["passed"] == "100", r
    r = box.run(calls_job("assert f(1) == 2", "import os\nos._exit(0)"))
    assert r.status == "ok" and r.report["verdict"] == {"n": 1, "passed": "0", "program_error": "exit"}


def test_records_need_the_nonce_and_the_report_needs_the_secret(box):
    # the program writes what used to be a passing report to every descriptor it has, the call
    # socket (fd 4) included: the evaluator reads a broken answer, and the case fails
    code = (
        "import os, json\n"
        "forged = json.dumps({'i': 0, 'v': 2, 'passed': 2, 'total': 2, 'error': None}).encode()\n"
        "for fd in range(64):\n"
        "    try:\n"
        "        os.write(fd, b'\\n' + forged + b'\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "def f(x):\n"
        "    return 2\n"
    )
    r = box.run(calls_job("assert f(1) == 2", code))
    assert r.status == "ok" and r.report["verdict"]["passed"] == "0", r
    assert r.report["forged"] >= 1  # the line reached the unit's records pipe and was dropped


@needs_ns
def test_the_evaluator_is_outside_the_programs_reach(box):
    """The tests see the minimal root with a /tmp of their own (not the program's), are not in
    the program's PID namespace, and hold no capability."""
    code = "open('/tmp/planted.py', 'w').write('x = 1')\nimport os\ndef pid():\n    return os.getpid()\n"
    tests = (
        "import os\n"
        "assert os.listdir('/tmp') == []\n"
        "assert pid() == 1 and os.getpid() != 1\n"
        "assert not os.path.exists('/etc/hostname')\n"
        "try:\n    os.chroot('/')\nexcept PermissionError:\n    pass\nelse:\n    raise AssertionError\n"
    )
    r = box.run(calls_job(tests, code))
    assert r.status == "ok" and r.report["verdict"]["passed"] == "1111", r


@needs_ns
def test_the_environment_is_explicit_never_the_servers(monkeypatch):
    monkeypatch.setenv("RP_TEST_MARKER", "marker-5f1e9c")
    monkeypatch.setenv("REWARDPLANE_TOKEN", "token-9b2d77")
    b = LocalSandbox(timeout_s=5.0, prefork=1)
    b.start()
    try:
        zygote_env = Path(f"/proc/{b._proc.pid}/environ").read_bytes()
        zygote_cmdline = Path(f"/proc/{b._proc.pid}/cmdline").read_bytes()
        for secret in (b"marker-5f1e9c", b"token-9b2d77"):
            assert secret not in zygote_env and secret not in zygote_cmdline
        code = (
            "import os, glob\n"
            "seen = repr(dict(os.environ)).encode()\n"
            "for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
            "    try:\n"
            "        seen += open(p, 'rb').read()\n"
            "    except OSError:\n"
            "        pass\n"
            "print(b'marker-5f1e9c' in seen, b'token-9b2d77' in seen, sorted(os.environ))\n"
        )
        r = run(b, code)
        assert r.status == "ok", r
        assert r.stdout.decode().split(" ", 2)[:2] == ["False", "False"], r.stdout
        assert "RP_TEST_MARKER" not in r.stdout.decode()
    finally:
        b.close()


@needs_ns
def test_the_root_holds_the_interpreter_and_nothing_of_the_server(box, tmp_path):
    import os
    import sys

    secret = tmp_path / "token.txt"
    secret.write_text("token-9b2d77")
    repo = Path(__file__).resolve().parents[3]
    venv_site = [p for p in sys.path if p.endswith("site-packages")]
    code = (
        "import os, json, importlib.util\n"
        f"paths = {[str(secret), str(tmp_path), str(repo / 'pyproject.toml'), str(repo), os.getcwd(), *venv_site]!r}\n"
        "seen = {p: os.path.exists(p) for p in paths}\n"
        "mods = {m: importlib.util.find_spec(m) is not None for m in ['numpy', 'yaml', 'rewardplane', 'pip']}\n"
        "import decimal, sqlite3, zlib, ctypes, ssl, hashlib, json\n"
        "print(json.dumps([sorted(os.listdir('/')), sorted(os.listdir('/etc')), sorted(os.listdir('/dev')), seen, mods]))\n"
    )
    r = run(box, code)
    assert r.status == "ok" and r.program_error() is None, (r, r.records)
    import json

    top, etc, dev, seen, mods = json.loads(r.stdout)
    bound_tops = {p.split("/")[1] for p in box.cfg["root"]["binds"]}
    assert (
        set(top)
        <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"} | bound_tops
    )
    # a checkout under /tmp shares its top with the private /tmp; `seen` shows the checkout is not there
    assert "home" not in top and (repo.parts[1] not in top or repo.parts[1] in bound_tops | {"tmp"})
    assert set(etc) <= {"passwd", "group", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime"}
    assert {"null", "zero", "urandom"} <= set(dev) and "sda" not in dev and "mem" not in dev
    assert not any(seen.values()), seen  # the token file, its directory, the checkout, the venv, cwd
    assert not any(mods.values()), mods  # no site-packages at all by default


@needs_ns
def run_allowing(packages: tuple[str, ...], code: str):
    """`code`'s result in a fresh sandbox that allows `packages`."""
    b = LocalSandbox(timeout_s=10.0, prefork=1, packages=packages)
    b.start()
    try:
        return run(b, code)
    finally:
        b.close()


def test_allowed_packages_and_only_them():
    code = (
        "import importlib.util, yaml\n"
        "print(yaml.safe_load('a: 1'), importlib.util.find_spec('numpy') is None)\n"
    )
    r = run_allowing(("yaml",), code)
    assert r.status == "ok" and r.stdout == b"{'a': 1} True\n", (r, r.records)
    with pytest.raises(LookupError, match="not installed"):
        LocalSandbox(packages=("surely_not_a_package_here",))


@needs_ns
def test_the_program_dies_with_its_unit_even_outside_its_process_group():
    """Without a pids cgroup to sweep, the zygote's pidfd of the program's process (PID 1 of its
    namespace) is what kills a program that left the unit's process group and its parent-death
    signal when the wall clock ends the run."""
    b = LocalSandbox(timeout_s=1.0, prefork=1)
    b.cfg["cgroup"] = None
    b.start()
    code = (
        "import ctypes, os, time\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.prctl(15, b'rpescape2', 0, 0, 0)\n"
        "libc.prctl(1, 0, 0, 0, 0)\n"
        "os.setpgid(0, 0)\n"
        "time.sleep(60)\n"
    )
    try:
        assert run(b, code).status == "timeout"
    finally:
        b.close()
    assert processes_named("rpescape2") == []


@needs_ns
def test_an_allowed_package_under_the_hosts_tmp_is_bound_on_the_private_tmp(tmp_path, monkeypatch):
    """A checkout or a venv under /tmp (CI's, a fresh clone's): the allowed package's directory is
    opened before the new root covers the host's /tmp and bound, read-only, on the private /tmp
    at its own path; nothing else of that directory shows."""
    assert str(tmp_path).startswith("/tmp/")
    site = tmp_path / "site-packages"
    (site / "rp_tmp_pkg").mkdir(parents=True)
    (site / "rp_tmp_pkg" / "__init__.py").write_text("ANSWER = 42\n")
    (site / "neighbour.py").write_text("SECRET = 'x'\n")
    info = site / "rp_tmp_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rp-tmp-pkg\nVersion: 0.1\n")
    (info / "RECORD").write_text("rp_tmp_pkg/__init__.py,,\nrp_tmp_pkg-0.1.dist-info/METADATA,,\n")
    (info / "top_level.txt").write_text("rp_tmp_pkg\n")
    monkeypatch.syspath_prepend(str(site))
    code = (
        "import os, rp_tmp_pkg\n"
        f"site = {str(site)!r}\n"
        "writable = os.access(os.path.join(site, 'rp_tmp_pkg'), os.W_OK)\n"
        "print(rp_tmp_pkg.ANSWER, os.path.exists(os.path.join(site, 'neighbour.py')), writable)\n"
    )
    r = run_allowing(("rp_tmp_pkg",), code)
    assert r.status == "ok" and r.stdout == b"42 False False\n", (r, r.records)
