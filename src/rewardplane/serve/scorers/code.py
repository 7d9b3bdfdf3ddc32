"""`code` scorer: run the response's program against the tests in the item's `reference`.

The program is the last fenced code block of the response (```python … ``` or ``` … ```), else
the whole response. `reference` (an object, or a string holding JSON) is either

- stdin/stdout cases, the APPS/TACO shape: `{"inputs": ["1 2\\n", …], "outputs": ["3\\n", …]}` —
  the program runs once per case with the input on stdin; its stdout is compared with the output
  (`compare`: `lines` (default: per-line trailing whitespace and trailing blank lines ignored),
  `tokens` (whitespace-separated tokens), `exact`);
- assert-style Python: `{"tests": "assert f(1) == 2\\nassert f(2) == 3"}` — the program is
  executed, then each top-level test statement (imports, defs and assignments are setup) is one
  case.

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

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from rewardplane.core.errors import ConfigError
from rewardplane.serve.execution.fusion import SandboxFusionClient
from rewardplane.serve.scorers.base import ItemError, ScoreItem, ScorerInfo
from rewardplane.serve.scorers.code_cases import passed as cases_passed
from rewardplane.serve.scorers.code_cases import split_tests
from rewardplane.serve.scorers.common import VERSION, OptionsScorer, as_text, identity

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)
RUN_ERRORS = ("timeout", "memory_limit", "output_limit", "sandbox_error")


def extract_code(response: str) -> str:
    """The last fenced block (python-tagged or untagged preferred), else the whole response."""
    blocks = _FENCE.findall(response)
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
            split_tests(ref["tests"])  # cached: the scorer splits the same tests again for free
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


class CodeScorer(OptionsScorer):
    kind: ClassVar[str] = "code"
    modality: ClassVar = "rule"
    allowed_options: ClassVar[frozenset[str]] = frozenset(
        {
            "backend",
            "isolation",
            "scoring",
            "compare",
            "timeout_s",
            "memory_mb",
            "max_output_bytes",
            "max_file_mb",
            "max_open_files",
            "max_processes",
            "tmpfs_mb",
            "prefork",
            "concurrency",
            "url",
            "language",
            "request_timeout_s",
            "unsplittable_tests",
            "packages",
        }
    )

    def __init__(
        self,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        max_batch_size: int = 32,
        max_wait_ms: float = 2.0,
    ) -> None:
        super().__init__(name, options=options, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        o = self.options
        where = f"scorer {name!r} (code)"
        self.backend = o.get("backend", "local")
        if self.backend not in ("local", "sandbox_fusion"):
            raise ConfigError(f"{where}: options.backend must be local or sandbox_fusion")
        self.isolation = o.get("isolation", "namespaces")
        if self.isolation not in ("namespaces", "rlimits"):
            raise ConfigError(f"{where}: options.isolation must be namespaces or rlimits")
        self.scoring = o.get("scoring", "fraction")
        if self.scoring not in ("fraction", "all_or_nothing"):
            raise ConfigError(f"{where}: options.scoring must be fraction or all_or_nothing")
        self.compare = o.get("compare", "lines")
        if self.compare not in ("lines", "tokens", "exact"):
            raise ConfigError(f"{where}: options.compare must be lines, tokens or exact")
        if self.backend == "sandbox_fusion" and not isinstance(o.get("url"), str):
            raise ConfigError(f"{where}: backend sandbox_fusion needs options.url")
        for key in ("timeout_s", "request_timeout_s"):
            v = o.get(key)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v <= 0):
                raise ConfigError(f"{where}: options.{key} must be a positive number")
        ints = ("memory_mb", "max_output_bytes", "max_file_mb", "max_open_files", "max_processes")
        for key in (*ints, "tmpfs_mb", "prefork", "concurrency"):
            v = o.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"{where}: options.{key} must be a positive integer")
        self.unsplittable = o.get("unsplittable_tests", "run")
        if self.unsplittable not in ("run", "error"):
            raise ConfigError(f"{where}: options.unsplittable_tests must be run or error")
        self.packages = o.get("packages", [])
        if not isinstance(self.packages, list) or not all(isinstance(p, str) and p for p in self.packages):
            raise ConfigError(f"{where}: options.packages must be a list of import names")
        if self.packages and self.backend != "local":
            raise ConfigError(f"{where}: options.packages applies to backend local only")
        self.timeout_s = float(o.get("timeout_s", 5.0))
        self.concurrency = int(o.get("concurrency") or os.cpu_count() or 1)
        self.sandbox: Any = None
        self._counts = threading.local()  # the scoring thread's case counts, for take_batch_stats
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"code-{name}")

    def load(self) -> None:
        o = self.options
        if self.backend == "sandbox_fusion":
            self.sandbox = SandboxFusionClient(
                o["url"],
                timeout_s=self.timeout_s,
                memory_mb=int(o.get("memory_mb", 1024)),
                language=o.get("language", "python"),
                request_timeout_s=float(o.get("request_timeout_s", self.timeout_s + 30)),
                max_output_bytes=int(o.get("max_output_bytes", 1 << 20)),
            )
            return
        from rewardplane.serve.execution.sandbox import LocalSandbox, probe

        if self.isolation == "namespaces":
            ok, why = probe("namespaces")
            if not ok:
                raise ConfigError(
                    f"scorer {self.name!r} (code): this kernel does not allow user + mount + network "
                    f"namespaces ({why}); refusing to run untrusted code with rlimits only unless the "
                    "config sets options.isolation: rlimits explicitly"
                )
        try:
            box = LocalSandbox(
                packages=tuple(self.packages),
                isolation=self.isolation,
                timeout_s=self.timeout_s,
                memory_mb=int(o.get("memory_mb", 1024)),
                max_output_bytes=int(o.get("max_output_bytes", 1 << 20)),
                max_file_mb=int(o.get("max_file_mb", 16)),
                max_open_files=int(o.get("max_open_files", 64)),
                max_processes=int(o.get("max_processes", 64)),
                tmpfs_mb=int(o.get("tmpfs_mb", 64)),
                prefork=int(o.get("prefork", min(4, self.concurrency))),
            )
        except LookupError as exc:
            raise ConfigError(f"scorer {self.name!r} (code): options.packages: {exc}") from None
        box.start()
        self.sandbox = box

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def _score_one(self, item: ScoreItem) -> tuple[float | ItemError, int, int]:
        """(the item's result, its split cases, its unsplittable cases)."""
        ref = parse_reference(item.reference)
        if isinstance(ref, ItemError):
            return ref, 0, 0
        code = extract_code(as_text(item.response))
        if ref["mode"] == "assert":
            steps, cases = split_tests(ref["tests"])
            unsplit = sum(c.kind == "run" for c in cases)
            if unsplit and self.unsplittable == "error":
                first = next(c for c in cases if c.kind == "run")
                return (
                    ItemError(
                        "bad_input",
                        f"code: test case {first.index} cannot be split ({first.source[:80]!r}) and "
                        "options.unsplittable_tests is error",
                    ),
                    len(cases) - unsplit,
                    unsplit,
                )
            r = self.sandbox.run({"mode": "assert", "code": code, "steps": steps})
            if r.status != "ok":
                return ItemError(r.status, r.message), len(cases) - unsplit, unsplit
            n, total = cases_passed(cases, r.records), len(cases)
            score = float(n == total) if self.scoring == "all_or_nothing" else n / total
            return score, len(cases) - unsplit, unsplit
        passed = 0
        for stdin, want in zip(ref["inputs"], ref["outputs"], strict=True):
            r = self.sandbox.run({"mode": "stdin", "code": code, "stdin": stdin})
            if r.status != "ok":
                return ItemError(r.status, r.message), 0, 0
            ok = r.program_error() is None and outputs_match(
                r.stdout.decode("utf-8", "replace"), want, self.compare
            )
            passed += ok
            if not ok and self.scoring == "all_or_nothing":
                return 0.0, 0, 0
        n = len(ref["inputs"])
        return (float(passed == n) if self.scoring == "all_or_nothing" else passed / n), 0, 0

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        assert self.sandbox is not None, "load() first"
        out = list(self._pool.map(self._score_one, items))
        self._counts.value = {
            "tests_split": sum(x[1] for x in out),
            "tests_unsplittable": sum(x[2] for x in out),
        }
        return [x[0] for x in out]

    def take_batch_stats(self) -> dict[str, int]:
        """Assert-style cases of the last batch scored on this thread: split (compared here) and
        unsplittable (run inside) — /metrics' `rewardplane_scorer_events_total`."""
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

    def info(self) -> ScorerInfo:
        o = self.options
        extra: dict[str, Any] = {"backend": self.backend, "scoring": self.scoring, "compare": self.compare}
        extra["unsplittable_tests"] = self.unsplittable
        if self.backend == "local" and self.sandbox is not None:
            extra["isolation"] = (
                "user+mount+network+pid+ipc namespaces, minimal read-only root (interpreter, stdlib, "
                "allowed packages), private tmpfs /tmp, no capabilities, rlimits"
                if self.isolation == "namespaces"
                else "rlimits only (no namespaces): no filesystem, network or process isolation"
            )
            extra["packages"] = list(self.packages)
            extra["process_limit"] = self.sandbox.process_limit()
            extra["limits"] = self.sandbox.limits()
        elif self.sandbox is not None:
            extra["url"] = o["url"]
            extra["limits"] = {"timeout_s": self.timeout_s, "memory_mb": int(o.get("memory_mb", 1024))}
        return ScorerInfo(
            name=self.name,
            kind=self.kind,
            modality=self.modality,
            dtype="none",
            device="cpu",
            version=VERSION,
            identity=identity(kind=self.kind, weights="", config={}, dtype="none", options=o),
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.max_wait_ms,
            extra=extra,
        )
