"""House rules the layering test does not cover, read from source: no function over 80 lines.

GUIDE.md: functions of one job, at most 80 lines, unless the function is a flat table (one
literal the reader scans, not logic) or a CLI parser (one `add_argument` after another). Those
are named in `FLAT_TABLES_AND_PARSERS`, each with why; an entry that is no longer over the
limit (or no longer exists) fails the test until it is deleted here.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rewardplane"
MAX_LINES = 80

FLAT_TABLES_AND_PARSERS: dict[str, str] = {
    "data/synth.py:corrupt_rows": "one literal row per reason code, the validation demo's table",
}


def _definitions(node: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function under `node`, methods and closures included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            yield name, child.end_lineno - child.lineno + 1
            yield from _definitions(child, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _definitions(child, f"{prefix}{child.name}.")
        else:
            yield from _definitions(child, prefix)


@functools.cache
def function_lengths(root: Path = SRC) -> dict[str, int]:
    """`path:qualified name` → lines from `def` to the function's last line, for every function."""
    lengths: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        for name, lines in _definitions(ast.parse(path.read_text(encoding="utf-8"))):
            lengths[f"{module}:{name}"] = lines
    return lengths


def long_functions(root: Path = SRC) -> dict[str, int]:
    return {name: n for name, n in function_lengths(root).items() if n > MAX_LINES}


def test_no_function_over_80_lines_outside_the_allow_lists():
    allowed = FLAT_TABLES_AND_PARSERS.keys()
    offenders = {name: n for name, n in long_functions().items() if name not in allowed}
    assert not offenders, "functions over 80 lines (split them by job): " + ", ".join(
        f"{name} ({n})" for name, n in sorted(offenders.items())
    )


def test_the_allow_lists_hold_only_functions_still_over_the_limit():
    long = long_functions()
    stale = [name for name in FLAT_TABLES_AND_PARSERS if name not in long]
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): delete from the allow-list: {stale}"


def test_the_check_sees_a_long_function(tmp_path):
    """The walk counts nested and method bodies, so an 81-line function is caught wherever it sits."""
    body = "\n".join(f"        x{k} = {k}" for k in range(80))
    (tmp_path / "mod.py").write_text(
        f"class C:\n    def long(self):\n{body}\n\n    def short(self):\n        pass\n"
    )
    assert long_functions(tmp_path) == {"mod.py:C.long": 81}
