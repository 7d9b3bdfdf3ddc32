"""No pattern or parser over request text goes superlinear (issue 44): the test that finds the
next `_FENCE`.

1. Every regular expression in `src/` is found from source (AST: `re.*(...)`, `re2.*(...)`,
   `compile_linear(...)` calls). A module whose patterns never see request or response text is
   listed in `NOT_REQUEST_TEXT` with the reason; a pattern built at run time is listed in
   `DYNAMIC` with the reason it is safe. Every other call must be a module-level compiled pattern,
   which the test imports and checks. A new call site that is none of these fails, naming it;
   a list entry that no longer matches anything fails too (the lists stay reviewed).
2. Each checked pattern is analysed by regexploit (nested and adjacent quantifiers that
   backtrack cubically or worse) and timed on worst-case inputs built from its own structure:
   every prefix of a string it matches (an unclosed delimiter), repeated or followed by a long
   run of a filler (spaces, letters, braces, newlines, digits), at two sizes. Linear work grows
   about 4x when the text grows 4x; quadratic work 16x. The assertion is on that ratio
   (`MAX_RATIO`), never on a time.
3. The functions that read request text on the service path (`ENTRY_POINTS`: fences, the judge's
   fence and answer parser, the audit's signatures (a batch at a time, as the service reads
   them), the math box reader, the OpenRLHF EOS strip, admission, the JSON guard, the rules) get
   the same inputs, built from the patterns of their module, plus hypothesis-generated mixtures:
   a scan written in Python (the audit's `_boxed_answers`) is caught here, where no regex
   analyser looks.
"""

from __future__ import annotations

import ast
import gc
import importlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from regexploit.ast.sre import SreOpParser
from regexploit.redos import find as find_redos

from rewardplane.serve.linear import compile_linear

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "rewardplane"

NOT_REQUEST_TEXT = {
    "bench/trace.py": "profiler kernel names from a trace the benchmark wrote",
    "data/normalize.py": "dataset rows read by `data prepare`, training and evaluation, never the service",
    "data/reader.py": "file and folder names of a local dataset",
    "deploy/config.py": "the operator's deploy config (a memory size)",
    "eval/artifacts.py": "run directory names",
    "models/reference.py": "commit and file hashes in model metadata",
    "train/checkpoint.py": "checkpoint directory names",
}
"""Modules whose regular expressions never read request or response text, each with why."""

DYNAMIC = {
    (
        "serve/scorers/rules.py",
        "compile_linear",
    ): "the `regex` scorer's own pattern: RE2, linear by construction",
    ("serve/scorers/judge.py", "re2.compile"): "the judge's answer pattern: RE2, linear by construction",
}
"""Patterns built at run time (not module-level constants), with why each is safe."""

EXTRA = {"serve/scorers/judge_prompts.py": ("DEFAULT_PATTERNS",)}
"""Patterns kept in tables rather than compiled where they are written (compiled elsewhere)."""

SMALL, LARGE = 4_000, 16_000
"""Text lengths timed: LARGE = 4 x SMALL."""
MAX_RATIO = 10.0
"""CPU time(LARGE) / CPU time(SMALL): linear work is about 4, quadratic about 16."""
FILLERS = (" ", "a", "{", "\n")
GENERIC_STARTS = ("```", "<", "\\boxed{", "{", "[[", "score:", "</s>", "x <")
"""Openings every text entry point is tried with (and a pattern that matches "")."""
QUICK_S = 0.005
"""A call on the LARGE text that takes less CPU than this is not timed further: quadratic work
at that size (128 million steps, or a copy per character) takes far longer. A shortcut past the
ratio measurement, never asserted. CPU time of this thread, not wall time: on a loaded machine
the thread is descheduled at random, which wall time would count."""


SLOW_S = 0.25
"""A LARGE call taking more CPU than this is compared with one SMALL call, not repeated."""


@dataclass(frozen=True)
class Site:
    module: str  # relative to src/rewardplane
    line: int
    call: str  # "re.compile", "re2.search", "compile_linear", ...
    name: str | None  # the module-level name it is assigned to, if any


CALLS = ("compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split")


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and f.value.id in ("re", "re2")
        and f.attr in CALLS
    ):
        return f"{f.value.id}.{f.attr}"
    if isinstance(f, ast.Name) and f.id == "compile_linear":
        return "compile_linear"
    return None


def regex_sites() -> list[Site]:
    sites = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        top_level = {}
        for stmt in tree.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                top_level[id(stmt.value)] = stmt.targets[0].id
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (call := _call_name(node)):
                sites.append(Site(module, node.lineno, call, top_level.get(id(node))))
    return sites


def _is_request_module(module: str) -> bool:
    return module not in NOT_REQUEST_TEXT and module != "serve/linear.py"


@dataclass(frozen=True)
class Checked:
    where: str
    pattern: str
    flags: int
    search: Callable[[str], Any]
    linear: bool  # compiled by RE2


def checked_patterns() -> list[Checked]:
    """Every module-level pattern of a request-text module, imported as the service uses it."""
    out = []
    for site in regex_sites():
        if not _is_request_module(site.module) or site.name is None:
            continue
        out.append(_checked(site.module, site.name, getattr(_import(site.module), site.name)))
    for module, names in EXTRA.items():
        for name in names:
            table = getattr(_import(module), name)
            for key, pattern in table.items():  # compiled as the service compiles them
                out.append(_checked(module, f"{name}[{key!r}]", compile_linear(pattern)))
    return out


def _import(module: str) -> Any:
    return importlib.import_module("rewardplane." + module.removesuffix(".py").replace("/", "."))


def _checked(module: str, name: str, compiled: Any) -> Checked:
    flags = compiled.flags & ~re.UNICODE if isinstance(compiled, re.Pattern) else 0
    return Checked(
        f"{module}:{name}",
        compiled.pattern,
        flags,
        lambda text: sum(1 for _ in compiled.finditer(text)),
        not isinstance(compiled, re.Pattern),
    )


def test_every_regex_in_src_is_checked_or_reviewed():
    sites = regex_sites()
    unreviewed = [
        f"{s.module}:{s.line} {s.call}(...)"
        for s in sites
        if _is_request_module(s.module) and s.name is None and (s.module, s.call) not in DYNAMIC
    ]
    assert not unreviewed, (
        "a regex over request text that this test cannot check: make it a module-level compiled "
        f"pattern (checked here) or add it to DYNAMIC with why it is safe: {unreviewed}"
    )
    modules = {s.module for s in sites}
    stale = [m for m in NOT_REQUEST_TEXT if m not in modules] + [
        f"{m} {c}" for m, c in DYNAMIC if not any(s.module == m and s.call == c for s in sites)
    ]
    assert not stale, f"reviewed entries that match no regex in src/ any more: {stale}"
    assert len(checked_patterns()) >= 10  # the collector still finds the service's patterns


def _ids(items: list[Checked]) -> list[str]:
    return [c.where for c in items]


PATTERNS = checked_patterns()


@pytest.mark.parametrize("checked", PATTERNS, ids=_ids(PATTERNS))
def test_regexploit_finds_no_redos(checked):
    try:
        parsed = SreOpParser().parse_sre(checked.pattern, checked.flags)
    except Exception:  # RE2-only syntax (`\z`): RE2 never backtracks; still timed below
        assert checked.linear, f"{checked.where}: {checked.pattern!r} does not parse as a Python regex"
        return
    found = find_redos(parsed)
    assert not found, f"{checked.where}: {checked.pattern!r} backtracks: e.g. {found[0].example()}"


def starters(pattern: str, flags: int, *, every_prefix: bool = True) -> list[str]:
    """Prefixes of a string `pattern` matches (the first 1, 2 and 3 characters, all but the last
    and the whole; with `every_prefix` false only the first and the whole): where a delimiter is
    opened and never closed. A pattern that matches the empty string starts with the generic
    openings instead."""
    try:
        example = SreOpParser().parse_sre(pattern, flags).example()
    except Exception:  # a construct regexploit cannot render: the generic openings only
        example = ""
    if not example:
        return list(GENERIC_STARTS)
    cuts = (1, 2, 3, len(example) - 1, len(example)) if every_prefix else (1, len(example))
    return list(dict.fromkeys(example[:k] for k in cuts if k > 0))


def shapes(starts: list[str]) -> Iterator[Callable[[int], str]]:
    """Inputs of a chosen length: an unclosed start and a long filler run, the start repeated,
    the start and a filler repeated."""
    for s in starts:
        yield lambda n, s=s: (s * (n // len(s) + 1))[:n]
        for f in FILLERS:
            yield lambda n, s=s, f=f: s + f * (n - len(s))
            yield lambda n, s=s, f=f: ((s + f) * (n // (len(s) + 1) + 1))[:n]


def growth(fn: Callable[[str], Any], make: Callable[[int], str]) -> float:
    """CPU time(fn(make(LARGE))) / CPU time(fn(make(SMALL))), the best of interleaved rounds,
    each repeated until the small text takes a few milliseconds (1.0 when one LARGE call is under
    `QUICK_S`). The cyclic garbage collector is off while timing: its passes over the test
    process's own objects grow with how many a call allocates, which would read as superlinear."""
    small, large = make(SMALL), make(LARGE)
    gc.disable()
    try:
        started = time.thread_time()
        fn(large)
        once = time.thread_time() - started
        if once < QUICK_S:
            return 1.0
        if once > SLOW_S:  # unambiguous: one call of each size is enough (and bounds the cost)
            started = time.thread_time()
            fn(small)
            return once / max(time.thread_time() - started, 1e-6)
        reps = 1
        while True:
            started = time.thread_time()
            for _ in range(reps):
                fn(small)
            if time.thread_time() - started >= 0.002 or reps >= 64:
                break
            reps *= 4
        best = {SMALL: math.inf, LARGE: math.inf}
        for _ in range(3):
            for n, text in ((SMALL, small), (LARGE, large)):
                started = time.thread_time()
                for _ in range(reps):
                    fn(text)
                best[n] = min(best[n], time.thread_time() - started)
        return best[LARGE] / best[SMALL]
    finally:
        gc.enable()


def worst(fn: Callable[[str], Any], starts: list[str]) -> tuple[float, str]:
    """The largest growth over the inputs built from `starts`, and the input's head."""
    worst_ratio, head = 0.0, ""
    for make in shapes(starts):
        ratio = growth(fn, make)
        if ratio > worst_ratio:
            worst_ratio, head = ratio, make(SMALL)[:24]
        if worst_ratio > MAX_RATIO:
            break
    return worst_ratio, head


@pytest.mark.parametrize("checked", PATTERNS, ids=_ids(PATTERNS))
def test_each_pattern_is_linear_on_inputs_built_from_it(checked):
    ratio, head = worst(checked.search, starters(checked.pattern, checked.flags))
    assert ratio <= MAX_RATIO, (
        f"{checked.where}: {checked.pattern!r} took {ratio:.1f}x as long on 4x the text "
        f"(input starting {head!r}): superlinear"
    )


# ----------------------------------------------------------------------------- entry points


def _extract_code(text: str) -> Any:
    from rewardplane.serve.scorers.code import extract_code

    return extract_code(text)


def _judge_fence(text: str) -> Any:
    from rewardplane.serve.scorers.judge_prompts import fence

    return fence(text)


def _judge_answer(text: str) -> Any:
    from rewardplane.serve.scorers.judge import JudgeOptions
    from rewardplane.serve.scorers.judge_prompts import Unparseable, parse_answer

    pattern = JudgeOptions.model_validate({"url": "http://127.0.0.1:1", "model": "m"}).compiled_pattern()
    try:
        return parse_answer(text, mode="pointwise", parse="regex", pattern=pattern, scale=(1.0, 10.0))
    except Unparseable:
        return None


def _signatures(text: str) -> Any:
    """The audit's service path (`batch_signatures`): the text twice in a batch around an honest
    answer, so the joined search, its halving down to each text, and every detector on the text
    alone (what `signatures` runs) all read it."""
    from rewardplane.serve.audit.signatures import batch_signatures

    return batch_signatures([text, "The answer is 4.", text])


def _last_boxed(text: str) -> Any:
    from rewardplane.serve.scorers.math import last_boxed

    return last_boxed(text)


def _strip_eos(text: str) -> Any:
    from rewardplane.serve.routes.openrlhf import strip_eos

    return strip_eos(text)


def _admission(text: str) -> Any:
    from rewardplane.serve.admission import PROMPT, RESPONSE, admit
    from rewardplane.serve.protocol import ScoreItem

    return admit(ScoreItem(id="1", prompt=text, response=text), frozenset({PROMPT, RESPONSE}), "error")


def _json_guard(text: str) -> Any:
    from rewardplane.serve.protocol.errors import ServeError
    from rewardplane.serve.protocol.guards import load_json

    try:
        load_json(json.dumps({"items": [{"response": text}]}))
        return load_json(text)
    except ServeError:
        return None


def _rule(kind: str, options: dict[str, Any]) -> Callable[[str], Any]:
    from rewardplane.serve.protocol import ScoreItem
    from rewardplane.serve.scorers.registry import scorer_class

    scorer = scorer_class(kind)("rule", options)

    def run(text: str) -> Any:
        return scorer.score_batch([ScoreItem(id="1", prompt="", response=text, reference=text[::-1])])

    return run


ENTRY_POINTS: dict[str, tuple[Callable[[str], Any], tuple[str, ...]]] = {
    "code.extract_code": (_extract_code, ("serve/scorers/code.py",)),
    "judge_prompts.fence": (_judge_fence, ("serve/scorers/judge_prompts.py",)),
    "judge_prompts.parse_answer": (_judge_answer, ("serve/scorers/judge_prompts.py",)),
    "audit.signatures": (_signatures, ("serve/audit/signatures.py",)),
    "math.last_boxed": (_last_boxed, ("serve/scorers/math.py",)),
    "openrlhf.strip_eos": (_strip_eos, ("serve/routes/openrlhf.py",)),
    "admission.admit": (_admission, ()),
    "guards.load_json": (_json_guard, ()),
    "rules.exact_match": (_rule("exact_match", {}), ()),
    "rules.length_words": (_rule("length", {"unit": "words"}), ()),
    "rules.regex": (_rule("regex", {"pattern": r"\s*(?:answer|score)\s*[:=]\s*\d+\s*$"}), ()),
}
"""The functions on the service path that read request text, and the modules whose patterns
shape their worst-case inputs."""


def entry_starts(modules: tuple[str, ...]) -> list[str]:
    starts = list(GENERIC_STARTS)
    for c in PATTERNS:
        if c.where.split(":")[0] in modules:
            starts += starters(c.pattern, c.flags, every_prefix=False)
    return list(dict.fromkeys(starts))


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_each_text_entry_point_is_linear(name):
    fn, modules = ENTRY_POINTS[name]
    ratio, head = worst(fn, entry_starts(modules))
    assert ratio <= MAX_RATIO, (
        f"{name} took {ratio:.1f}x as long on 4x the text (input starting {head!r}): superlinear"
    )


PIECES = st.sampled_from(["```", "`", "<", "/", " ", "\t", "\n", "{", "}", "\\boxed{", "[[", "a", "0", ":"])


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    phases=[Phase.generate],  # no shrinking: the failing input is already short to read
    suppress_health_check=[HealthCheck.too_slow],
)
@given(head=st.lists(PIECES, min_size=1, max_size=4), unit=st.lists(PIECES, min_size=1, max_size=3))
def test_generated_repetitions_stay_linear_in_every_entry_point(head, unit):
    """A head and a repeated unit drawn from the delimiters these parsers look for: the shape of
    a degenerate rollout repeating one token after an opening it never closes."""
    h, u = "".join(head), "".join(unit)

    def make(n: int) -> str:
        return h + (u * (n // len(u) + 1))[: max(0, n - len(h))]

    for name, (fn, _) in ENTRY_POINTS.items():
        ratio = growth(fn, make)
        assert ratio <= MAX_RATIO, f"{name}: {ratio:.1f}x on 4x of {h!r} + {u!r}*n: superlinear"
