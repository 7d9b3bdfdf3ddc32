"""`code` scorer: run the response's program against the tests in the item's `reference`.

The program is the last fenced code block of the response (```python … ``` or ``` … ```), else
the whole response. `reference` (an object, or a string holding JSON) is either

- stdin/stdout cases, the APPS/TACO shape: `{"inputs": ["1 2\\n", …], "outputs": ["3\\n", …]}` —
  the program runs once per case with the input on stdin; its stdout is compared with the output
  (`compare`: `lines` (default: per-line trailing whitespace and trailing blank lines ignored),
  `tokens` (whitespace-separated tokens), `exact`);
- assert-style Python: `{"tests": "assert f(1) == 2\\nassert f(2) == 3"}` (or HumanEval's
  `def check(candidate): ...` with `check(f)`) — each top-level test statement (imports, defs
  and assignments are setup) is one case. The tests run in a trusted evaluator outside the
  program's process and reach the program only by calls that carry plain data
  (`serve/execution/evaluator.py`); a case passes when its statement completes there.

Score: the fraction of cases passed (`scoring: fraction`, default) or 1.0/0.0
(`scoring: all_or_nothing`). A program that raises, exits non-zero or prints the wrong thing fails
its case — that is a wrong program. A run the checker could not complete is a per-item error,
never a 0: `timeout` (wall clock or CPU time), `memory_limit`, `output_limit` (stdout over
`max_output_bytes` or a file over `max_file_mb`), `sandbox_error`, and `bad_input` (no usable
reference).

Backends: `local` (rewardplane.serve.execution.sandbox: warm pre-forked runners in user + mount +
network + PID namespaces with rlimits; a resource boundary, not a security boundary) and
`sandbox_fusion` (the SandboxFusion HTTP API, `POST {url}/run_code`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rewardplane.core.config import FieldError
from rewardplane.core.errors import ConfigError
from rewardplane.serve.execution.evaluator import inside_steps, prepared
from rewardplane.serve.execution.fusion import SandboxFusionClient
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.common import as_text
from rewardplane.serve.scorers.options import ScorerOptions

_LANG = re.compile(r"[ \t]*([\w+#.-]*)")
"""A fence's language tag at the start of its opening line (one pass: no backtracking)."""
RUN_ERRORS = ("timeout", "memory_limit", "output_limit", "sandbox_error")
LOCAL_SANDBOX_OPTIONS = (
    "isolation",
    "timeout_s",
    "memory_mb",
    "max_output_bytes",
    "max_file_mb",
    "max_open_files",
    "max_processes",
    "tmpfs_mb",
)
"""Options handed to `LocalSandbox` as they are (its keyword arguments bear the same names)."""


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block as (language tag, body): an opening ``` with the rest of its line, the
    body up to the next ```. One left-to-right scan with `str.find`, linear in the text: an
    opening fence with no newline or no closing fence after it ends the scan (no later fence
    can close either), where a backtracking regex would retry from every later position
    (quadratic on an unclosed ``` and a long tail)."""
    blocks, pos = [], 0
    while (start := text.find("```", pos)) >= 0:
        newline = text.find("\n", start + 3)
        if newline < 0:
            break
        end = text.find("```", newline + 1)
        if end < 0:
            break
        lang = _LANG.match(text, start + 3, newline)
        blocks.append((lang.group(1) if lang else "", text[newline + 1 : end]))
        pos = end + 3
    return blocks


def extract_code(response: str) -> str:
    """The last fenced block (python-tagged or untagged preferred), else the whole response."""
    blocks = fenced_blocks(response)
    if not blocks:
        return response
    preferred = [body for lang, body in blocks if lang.lower() in ("", "python", "py", "python3")]
    return (preferred or [body for _, body in blocks])[-1]


def parse_reference(ref: Any) -> dict[str, Any] | ItemError:
    if isinstance(ref, str):
        try:
            ref = json.loads(ref)
        except ValueError:
            return ItemError("bad_input", "code: reference is a string but not JSON")
    if not isinstance(ref, dict):
        return ItemError("bad_input", "code needs the item's 'reference': {inputs, outputs} or {tests}")
    if "tests" in ref:
        if not isinstance(ref["tests"], str) or not ref["tests"].strip():
            return ItemError("bad_input", "code: reference.tests must be non-empty Python source")
        try:
            prepared(ref["tests"])  # cached: the sandbox sends the same compiled tests for free
        except (SyntaxError, ValueError) as exc:
            return ItemError("bad_input", f"code: reference.tests does not compile: {exc}")
        return {"mode": "assert", "tests": ref["tests"]}
    ins, outs = ref.get("inputs"), ref.get("outputs")
    if ref.get("fn_name"):
        return ItemError("bad_input", "code: call-based APPS cases (fn_name) are not supported; use {tests}")
    if (
        not isinstance(ins, list)
        or not isinstance(outs, list)
        or len(ins) != len(outs)
        or not ins
        or not all(isinstance(x, str) for x in ins + outs)
    ):
        return ItemError(
            "bad_input", "code: reference.inputs/outputs must be equal-length non-empty string lists"
        )
    return {"mode": "stdin", "inputs": ins, "outputs": outs}


def outputs_match(got: str, want: str, how: str) -> bool:
    if how == "exact":
        return got == want
    if how == "tokens":
        return got.split() == want.split()
    a = [line.rstrip() for line in got.rstrip().splitlines()]
    b = [line.rstrip() for line in want.rstrip().splitlines()]
    return a == b


class CodeOptions(ScorerOptions):
    backend: Literal["local", "sandbox_fusion"] = "local"
    """`local`: this host's sandbox (a zygote forking each run into namespaces with rlimits and a
    minimal root); `sandbox_fusion`: a SandboxFusion server's `POST {url}/run_code`."""
    isolation: Literal["namespaces", "rlimits"] = "namespaces"
    """local: user + mount + network + PID namespaces, a minimal read-only root and rlimits, or
    rlimits only (no filesystem, network or process isolation; only when set explicitly)."""
    scoring: Literal["fraction", "all_or_nothing"] = "fraction"
    """The fraction of test cases passed, or 1.0 only when every case passes."""
    compare: Literal["lines", "tokens", "exact"] = "lines"
    """stdin/stdout cases: per line with trailing whitespace and blank lines ignored,
    whitespace-separated tokens, or byte for byte."""
    unsafe_run_inside: bool = False
    """FORGEABLE, off by default: run assert-style tests inside the program's own process (a case
    passes if its statement completes there), as peers do, instead of in the trusted evaluator;
    a program can patch the tests' world or forge their records. The only way to run
    assert-style tests on `sandbox_fusion` (counted in /metrics as `tests_inside`)."""
    packages: list[str] = Field(default_factory=list)
    """local only (refused with sandbox_fusion): import names the programs may use beyond the
    standard library, with their dependencies; a name not installed here refuses the scorer at
    load."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock and CPU-time limit per run: `timeout`."""
    memory_mb: int = Field(1024, ge=1)
    """Memory limit per run: `memory_limit`."""
    max_output_bytes: int = Field(1 << 20, ge=1)
    """stdout limit per run: `output_limit`."""
    max_file_mb: int = Field(16, ge=1)
    """local: largest file a run may write: `output_limit`."""
    max_open_files: int = Field(64, ge=1)
    """local: open file descriptors per run."""
    max_processes: int = Field(64, ge=1)
    """local: processes and threads per run."""
    tmpfs_mb: int = Field(64, ge=1)
    """local: size of the run's private /tmp."""
    prefork: int | None = Field(None, ge=1)
    """local: warm runners kept forked; null: min(4, concurrency)."""
    concurrency: int | None = Field(None, ge=1)
    """Items run at once; null: the machine's CPU count."""
    url: str | None = None
    """sandbox_fusion: the server's base URL (required there)."""
    language: str = "python"
    """sandbox_fusion: the `language` sent with each run."""
    request_timeout_s: float | None = Field(None, gt=0)
    """sandbox_fusion: HTTP timeout per request; null: timeout_s + 30."""

    not_in_identity: ClassVar[frozenset[str]] = frozenset({"prefork", "concurrency"})

    @field_validator("packages")
    @classmethod
    def _import_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name.isidentifier():
                raise ValueError(f"{name!r} is not an import name")
        return names

    @model_validator(mode="after")
    def _backend_rules(self) -> CodeOptions:
        if self.backend == "sandbox_fusion" and not self.url:
            raise FieldError("url", "must be set with backend sandbox_fusion")
        if self.packages and self.backend != "local":
            raise FieldError("packages", "applies to backend local only")
        return self


class CodeScorer(Scorer):
    """Each item's program against the tests in its reference, in the local sandbox or on a
    SandboxFusion server, `concurrency` items at a time (see the module docstring). Assert-style
    tests run in the sandbox unit's trusted evaluator, which sends the verdict; the program is
    reached only by calls (`serve/execution/evaluator.py`)."""

    kind: ClassVar[str] = "code"
    modality: ClassVar = "rule"
    lowest_score: ClassVar[float | None] = 0.0
    Options = CodeOptions

    sandbox: Any = None

    @property
    def concurrency(self) -> int:
        """Items run at once: the option, else the machine's CPU count."""
        return self.options.concurrency or os.cpu_count() or 1

    @functools.cached_property
    def _pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"code-{self.name}")

    @functools.cached_property
    def _counts(self) -> threading.local:
        """The scoring thread's case counts of its last batch, for take_batch_stats."""
        return threading.local()

    def load(self) -> None:
        o = self.options
        if o.backend == "sandbox_fusion":
            self.sandbox = SandboxFusionClient(
                o.url,
                timeout_s=o.timeout_s,
                memory_mb=o.memory_mb,
                language=o.language,
                request_timeout_s=o.request_timeout_s or o.timeout_s + 30,
                max_output_bytes=o.max_output_bytes,
            )
            return
        from rewardplane.serve.execution.sandbox import LocalSandbox, probe

        if o.isolation == "namespaces":
            ok, why = probe("namespaces")
            if not ok:
                raise ConfigError(
                    f"scorer {self.name!r} (code): this kernel does not allow user + mount + network "
                    f"namespaces ({why}); refusing to run untrusted code with rlimits only unless the "
                    "config sets options.isolation: rlimits explicitly"
                )
        local = o.model_dump(include=set(LOCAL_SANDBOX_OPTIONS))  # the sandbox's own names
        try:
            box = LocalSandbox(
                packages=tuple(o.packages), prefork=o.prefork or min(4, self.concurrency), **local
            )
        except LookupError as exc:  # an allowed package this environment does not have
            raise ConfigError(f"scorer {self.name!r} (code): options.packages: {exc}") from None
        box.start()
        self.sandbox = box

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def _score_one(self, item: ScoreItem) -> tuple[float | ItemError, int, int]:
        """(the item's result, its cases run in the evaluator, its cases run inside)."""
        ref = parse_reference(item.reference)
        if isinstance(ref, ItemError):
            return ref, 0, 0
        code = extract_code(as_text(item.response))
        all_or_nothing = self.options.scoring == "all_or_nothing"
        if ref["mode"] == "assert":
            if self.options.unsafe_run_inside:
                steps, total = inside_steps(ref["tests"])
                r = self.sandbox.run({"mode": "inside", "code": code, "steps": steps})
                n = _passed_inside(total, r.records) if r.status == "ok" else 0
                inside = total
            elif self.options.backend == "sandbox_fusion":
                why = "code: assert-style tests need the local evaluator (or options.unsafe_run_inside)"
                return ItemError("unverifiable", why), 0, 0
            else:
                r = self.sandbox.run({"mode": "calls", "code": code, "tests": ref["tests"]})
                n, total, inside = (0, 0, 0) if r.status != "ok" else (*_verdict(r.report), 0)
                if r.status == "ok" and isinstance(n, ItemError):
                    return n, 0, 0
            if r.status != "ok":
                return ItemError(r.status, r.message), 0, 0
            return (float(n == total) if all_or_nothing else n / total), total - inside, inside
        passed = 0
        for stdin, want in zip(ref["inputs"], ref["outputs"], strict=True):
            r = self.sandbox.run({"mode": "stdin", "code": code, "stdin": stdin})
            if r.status != "ok":
                return ItemError(r.status, r.message), 0, 0
            ok = r.program_error() is None and outputs_match(
                r.stdout.decode("utf-8", "replace"), want, self.options.compare
            )
            passed += ok
            if not ok and all_or_nothing:
                return 0.0, 0, 0
        n = len(ref["inputs"])
        return (float(passed == n) if all_or_nothing else passed / n), 0, 0

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        assert self.sandbox is not None, "load() first"
        out = list(self._pool.map(self._score_one, items))
        self._counts.value = {
            "tests_evaluated": sum(x[1] for x in out),
            "tests_inside": sum(x[2] for x in out),
        }
        return [x[0] for x in out]

    def take_batch_stats(self) -> dict[str, int]:
        """Assert-style cases of the last batch scored on this thread: run in the evaluator, or
        inside the program's process (`unsafe_run_inside`) — /metrics'
        `rewardplane_scorer_events_total`."""
        counts = getattr(self._counts, "value", None) or {}
        self._counts.value = None
        return {k: v for k, v in counts.items() if v}

    def warmup_item(self) -> ScoreItem:
        return ScoreItem(
            id="warmup",
            prompt="Echo the input.",
            response="```python\nprint(input())\n```",
            reference={"inputs": ["hi\n"], "outputs": ["hi\n"]},
        )

    def info_extra(self) -> dict[str, Any]:
        o = self.options
        if self.sandbox is None:
            return {}
        if o.backend == "sandbox_fusion":
            return {
                "backend": o.backend,
                "url": o.url,
                "limits": {"timeout_s": o.timeout_s, "memory_mb": o.memory_mb},
            }
        return {
            "backend": o.backend,
            "isolation": (
                "user+mount+network+pid+ipc namespaces, minimal read-only root (interpreter, stdlib, "
                "allowed packages), private tmpfs /tmp, no capabilities, rlimits"
                if o.isolation == "namespaces"
                else "rlimits only (no namespaces): no filesystem, network or process isolation"
            ),
            "packages": list(o.packages),
            "process_limit": self.sandbox.process_limit(),
            "limits": self.sandbox.limits(),
        }


def _verdict(report: dict[str, Any]) -> tuple[int | ItemError, int]:
    """(cases passed, cases) from the evaluator's verdict; `unverifiable` when the tests handed
    the program something that cannot cross; `sandbox_error` when there is no usable verdict."""
    v = report.get("verdict")
    if not isinstance(v, dict) or type(v.get("n")) is not int:
        return ItemError("sandbox_error", "the evaluator sent no verdict"), 0
    if v.get("unverifiable"):
        why = f"code: a value the tests pass to the program cannot cross the boundary ({v['unverifiable']})"
        return ItemError("unverifiable", why[:300]), 0
    passed = v.get("passed")
    if type(passed) is not str or len(passed) != v["n"] or v["n"] < 1:
        return ItemError("sandbox_error", "the evaluator sent a malformed verdict"), 0
    return passed.count("1"), v["n"]


def _passed_inside(total: int, records: list[dict[str, Any]]) -> int:
    """`unsafe_run_inside`: a case passes on its own first record, which says `ok`."""
    seen: set[int] = set()
    n = 0
    for rec in records:
        k = rec.get("i")
        if type(k) is not int or not 0 <= k < total or k in seen:
            continue
        seen.add(k)
        n += rec.get("ok") is True and len(rec) == 2
    return n
