"""`math` scorer: is the final answer of the response equal to the item's `reference`?

Built on `math-verify` (`pip install 'rewardplane[verifiers]'`): the answer is extracted from the
response (the last `\\boxed{}` only, else LaTeX, or the last number/expression), parsed to sympy and
compared with the parsed reference. 1.0 right, 0.0 wrong (or `format_bonus` for a wrong but boxed answer).

Parsing and sympy comparison can take unbounded time or crash on adversarial text (a tower of
exponents, thousands of nested `\\frac`). Peers run math-verify in threads with signal-based
timeouts that do not fire off the main thread, and turn a crash or timeout into a reward of 0 —
a broken checker then looks like a wrong answer. Here every item is verified in one of a pool of
pre-started worker *processes* (`procpool.DeadlinePool`); the per-item wall-clock limit is
enforced from the outside: when it passes, the worker is SIGKILLed, a warm spare takes its place
and a new spare starts in the background. No signal is ever used inside a thread.

Per-item errors (never numbers): `bad_input` (no reference, or a reference that does not parse),
`timeout` (parse + verify exceeded `timeout_s`), `scorer_failed` (math-verify raised, the worker
died, or ran out of `max_memory_mb`).
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Literal

import re2
from pydantic import Field, model_validator

from rewardplane.core.config import FieldError
from rewardplane.core.errors import ConfigError
from rewardplane.serve.execution import shared
from rewardplane.serve.execution.procpool import DeadlinePool
from rewardplane.serve.protocol import ItemError, ScoreItem
from rewardplane.serve.scorers.base import Scorer
from rewardplane.serve.scorers.common import as_text
from rewardplane.serve.scorers.options import ScorerOptions

# Request text is only ever scanned by RE2 (linear in the text, no backtracking) or by hand.
_NUMBER = re2.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_BOXED = re2.compile(r"\\(?:boxed|fbox)\s*\{")
GSM8K_MARKER = "####"


def _extraction(mode: str) -> tuple[list[Any], list[Any]]:
    """(prediction configs, gold configs) for an extraction mode."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    if mode == "latex":
        pred = [LatexExtractionConfig(boxed_match_priority=0)]
    elif mode == "last_number":
        pred = [ExprExtractionConfig()]
    else:  # auto / boxed: \boxed first, then any LaTeX, then a plain expression
        pred = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return pred, gold


def last_boxed(response: str) -> str | None:
    """The content of the response's last `\\boxed{...}` (or `\\fbox{...}`), braces matched; ""
    when that box is never closed; None without a box. Only this box is read: a response that boxes
    several candidates is judged on its last one, not rewarded for any of them."""
    starts = list(_BOXED.finditer(response))
    if not starts:
        return None
    last = starts[-1]
    depth, i = 1, last.end()
    while i < len(response):
        depth += {"{": 1, "}": -1}.get(response[i], 0)
        if depth == 0:
            return response[last.end() : i]
        i += 1
    return ""


def final_marker_number(text: str) -> Decimal | None:
    """The number after the text's LAST `####` (GSM8K's final-answer line), or None: no marker, or
    what follows it on its line is not a number. Commas and a `$` are dropped (`#### $1,000`), a
    sentence's full stop is allowed. Nothing before the last marker is read, so a worked solution
    whose text says `= 10%` and whose final line is `#### 11` answers 11. A hand scan: one `rfind`
    and one pass over the rest of that line, linear in the text."""
    at = text.rfind(GSM8K_MARKER)
    if at < 0:
        return None
    end = text.find("\n", at)
    line = text[at + len(GSM8K_MARKER) : end if end >= 0 else len(text)]
    token = line.strip().lstrip("$").strip().replace(",", "")
    if token.endswith("."):
        token = token[:-1]
    if not token or any(c not in "0123456789.-" for c in token):
        return None
    try:
        value = Decimal(token)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def _check_gsm8k(response: str, reference: str, options: dict[str, Any]) -> tuple[str, Any]:
    """`answer_format: gsm8k`: the response's final `#### N` against the reference's number (a
    bare number, or a whole GSM8K solution: its own final `#### N`)."""
    gold = final_marker_number(reference if GSM8K_MARKER in reference else GSM8K_MARKER + reference)
    if gold is None:
        return ("error", "bad_input", f"reference {reference[:80]!r} is not a number or a '#### N' answer")
    pred = final_marker_number(response)
    if pred is None:
        return ("ok", 0.0)
    rel_tol = options.get("rel_tol")
    right = pred == gold or (bool(rel_tol) and abs(pred - gold) <= Decimal(str(rel_tol)) * max(1, abs(gold)))
    return ("ok", 1.0 if right else float(options.get("format_bonus", 0.0)))


def _gold_text(reference: str) -> str:
    """A bare reference (`1/2`, `\\frac{1}{2}`, `[1, 2)`) is read as a boxed answer."""
    if "$" in reference or _BOXED.search(reference) or "\\(" in reference or "\\[" in reference:
        return reference
    return "\\boxed{" + reference + "}"


def _numeric_close(gold: list[Any], pred: list[Any], rel_tol: float) -> bool:
    import sympy

    for g in gold:
        for p in pred:
            if isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr) and g.is_number and p.is_number:
                try:
                    a, b = complex(g.evalf()), complex(p.evalf())
                except (TypeError, ValueError):
                    continue
                if abs(a - b) <= rel_tol * max(1.0, abs(a)):
                    return True
    return False


WARMUP: list[tuple[str, str]] = [
    ("\\boxed{\\frac{1}{2}}", "0.5"),  # fraction vs decimal
    ("The answer is \\boxed{\\frac{2}{4}}.", "\\frac{1}{2}"),
    ("Thus $x = \\frac{3}{4}$", "3/4"),  # inline LaTeX
    ("After simplifying we get 42.", "42"),  # a plain number
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),  # surds
    ("\\boxed{[1, 2)}", "[1,2)"),  # intervals
    ("\\boxed{(1, 2)}", "[1,2)"),
    ("\\boxed{x^2 + 2x + 1}", "(x+1)^2"),  # polynomial identities
    ("\\boxed{(x+3)^2}", "x^2 + 4x + 4"),
    ("\\boxed{5\\text{ cm}}", "5"),  # units
    ("\\boxed{\\{1, 2, 3\\}}", "\\{3, 2, 1\\}"),  # sets
    ("\\boxed{3.14159}", "\\pi"),  # a constant
]
"""Run by every worker before it says ready, one of each kind of answer: sympy builds itself
lazily, and a fresh worker that met its first polynomial identity on a real item took 1.4 s
(the next took 40 ms), a spurious `timeout` for a right answer (procpool's docstring)."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or `taskset`'s), not
    the machine's: one worker per usable core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def check_answer(response: str, reference: str, options: dict[str, Any]) -> tuple[str, Any]:
    """("ok", score) or ("error", code, message). Runs inside a worker process (or in-thread in the
    benchmark's reference measurement); never called with a timeout of its own. `options`: the
    score-deciding `MathOptions` as JSON (absent keys take their defaults)."""
    if options.get("answer_format", "math") == "gsm8k":
        return _check_gsm8k(response, reference, options)
    from math_verify import parse, verify

    mode = options.get("extraction", "auto")
    pred_cfg, gold_cfg = _extraction(mode)
    gold = parse(
        _gold_text(reference),
        gold_cfg,
        fallback_mode="no_fallback",
        parsing_timeout=None,
        raise_on_error=True,
    )
    if not gold:
        return ("error", "bad_input", f"reference {reference[:80]!r} does not parse as math")
    box = last_boxed(response)
    boxed = bool(box)
    text = response
    if mode == "boxed" and not boxed:
        return ("ok", 0.0)
    if mode != "last_number" and box is not None:
        if not box.strip():  # the last box is empty or never closed: no answer
            return ("ok", 0.0)
        text = "\\boxed{" + box + "}"
    if mode == "last_number":
        numbers = _NUMBER.findall(response)
        if not numbers:
            return ("ok", 0.0)
        text = numbers[-1].replace(",", "")
    pred = parse(text, pred_cfg, parsing_timeout=None, raise_on_error=True)
    right = bool(pred) and verify(
        gold,
        pred,
        float_rounding=int(options.get("float_rounding", 6)),
        timeout_seconds=None,
        raise_on_error=True,
    )
    if not right and pred and options.get("rel_tol"):
        right = _numeric_close(gold, pred, float(options["rel_tol"]))
    if right:
        return ("ok", 1.0)
    return ("ok", float(options.get("format_bonus", 0.0)) if boxed else 0.0)


class MathOptions(ScorerOptions):
    answer_format: Literal["math", "gsm8k"] = "math"
    """How responses write their final answer: `math` (LaTeX, `\\boxed{}` or a plain expression,
    read as `extraction` says) or `gsm8k` (only the number on the last `#### N` line counts, as
    verl's gsm8k reward reads it; nothing before it; no marker is no answer)."""
    extraction: Literal["auto", "boxed", "latex", "last_number"] = "auto"
    """Where the answer is read: `auto` (the last `\\boxed{}` first, and only that box, so boxing
    every candidate earns nothing; then any LaTeX, then a plain expression), `boxed` (only a boxed
    answer counts, the last one), `latex`, or `last_number`."""
    format_bonus: float = Field(0.0, ge=0, lt=1)
    """The score of a wrong answer that is boxed (`gsm8k`: that has its `#### N` line; 0: wrong is wrong)."""
    rel_tol: float | None = Field(None, ge=0)
    """Also accept numbers within this relative tolerance; null: math-verify's own comparison."""
    float_rounding: int = Field(6, ge=0)
    """Decimal places math-verify rounds floats to before comparing."""
    timeout_s: float = Field(5.0, ge=1e-3)
    """Wall-clock limit per item (parse + verify); past it the worker is killed: `timeout`."""
    workers: int | None = Field(None, ge=1)
    """Worker processes; null: one per core this process may use."""
    spares: int = Field(1, ge=0)
    """Warm workers kept ready to replace a killed one."""
    max_memory_mb: int = Field(2048, ge=0)
    """Address-space limit per worker (0: none); past it the item is `scorer_failed`."""
    depth: int = Field(2, ge=1)
    """Items handed to each worker at once."""

    not_in_identity: ClassVar[frozenset[str]] = frozenset(
        {"timeout_s", "workers", "spares", "max_memory_mb", "depth"}
    )

    @model_validator(mode="after")
    def _one_way_to_read(self) -> MathOptions:
        if self.answer_format == "gsm8k" and self.extraction != "auto":
            raise FieldError(
                "extraction", "applies to answer_format math; gsm8k reads the last '#### N' only"
            )
        return self


class MathScorer(Scorer):
    """See the module docstring; the options are `MathOptions`."""

    kind: ClassVar[str] = "math"
    modality: ClassVar = "rule"
    lowest_score: ClassVar[float | None] = 0.0
    Options = MathOptions

    concurrent_batches: ClassVar[int] = 4
    """The pool is shared and thread-safe, so the batcher hands it several batches at once: the
    next batch's items start on the workers that the current batch's slowest items leave idle."""

    pool: DeadlinePool | None = None

    @property
    def workers(self) -> int:
        return self.options.workers or usable_cores()

    def load(self) -> None:
        try:
            import math_verify  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"scorer {self.name!r} (math) needs math-verify: pip install 'rewardplane[verifiers]'"
            ) from None
        o = self.options
        pool = DeadlinePool(
            "rewardplane.serve.scorers.math:check_answer",
            o.for_identity(),  # what check_answer reads: the options that decide a score
            warmup=WARMUP,
            label="math-verify",
            workers=self.workers,
            spares=o.spares,
            timeout_s=o.timeout_s,
            max_memory_mb=o.max_memory_mb,
            depth=o.depth,
        )
        # one pool per configuration in the process: a composite's inline math component with
        # these options shares the hosted scorer's workers instead of starting its own
        self.pool = shared.acquire(pool)

    def close(self) -> None:
        if self.pool is not None:
            shared.release(self.pool)
            self.pool = None

    def score_batch(self, items: list[ScoreItem]) -> list[float | ItemError]:
        assert self.pool is not None, "load() first"
        out: list[float | ItemError | None] = [None] * len(items)
        todo: list[tuple[int, tuple[str, str]]] = []
        for i, item in enumerate(items):
            ref = item.reference
            if isinstance(ref, int | float) and not isinstance(ref, bool):
                ref = str(ref)
            if not isinstance(ref, str) or not ref.strip():
                out[i] = ItemError(
                    "bad_input", "math needs the item's 'reference' (the final answer, a string)"
                )
            else:
                todo.append((i, (as_text(item.response), ref)))
        for (i, _), res in zip(todo, self.pool.map([p for _, p in todo]), strict=True):
            out[i] = float(res[1]) if res[0] == "ok" else ItemError(res[1], res[2])
        return out  # type: ignore[return-value]

    def warmup_item(self) -> ScoreItem:
        return ScoreItem(id="warmup", prompt="1/2 = ?", response="\\boxed{\\frac{1}{2}}", reference="0.5")

    def identity_config(self) -> dict[str, Any]:
        return {"math_verify": _math_verify_version()}

    def info_extra(self) -> dict[str, Any]:
        o = self.options
        return {
            "backend": f"math-verify {_math_verify_version()}, worker processes",
            "limits": {
                "timeout_s": o.timeout_s,
                "workers": self.workers,
                "spares": o.spares,
                "max_memory_mb": o.max_memory_mb,
                "depth": o.depth,
            },
            "workers_killed": self.pool.killed if self.pool else 0,
        }


def _math_verify_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("math-verify")
    except md.PackageNotFoundError:
        return "missing"
