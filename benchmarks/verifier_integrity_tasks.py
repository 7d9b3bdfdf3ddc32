"""The inputs of benchmarks/verifier_integrity.py as tasks every verifier can take: the exploit
corpus (tests/support/exploit_corpus/), HumanEval's canonical solutions, MBPP's reference
solutions, their one-token mutants, and GSM8K's train solutions (../shared/data/, README there).

A task is a dict: `id`, `set` (corpus | humaneval | mbpp), `kind` (exploit | honest | mutant),
`style` (assert | check | stdio: tests_run as one script after the program either way),
`program`, `tests` (the test source as plain Python runs it after the program), `entry_point`,
`calls` ([args, expected] pairs for harnesses that call the function themselves, tuples tagged
`{"tuple": [...]}`; null when the tests are not all `f(literals) == literal`), `inputs`/`outputs`
(stdio), `dataset` (evalplus's name for its special oracles), `reference` (rewardplane's item
reference) and, for corpus entries, `expect`.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import random
import sys
import tokenize
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"
sys.path.insert(0, str(REPO / "tests"))

from support import exploit_corpus  # noqa: E402  (the corpus is test data: tests/support)

SWAPS = {
    "==": "!=",
    "!=": "==",
    "<": ">=",
    ">": "<=",
    "<=": ">",
    ">=": "<",
    "+": "-",
    "-": "+",
    "and": "or",
    "or": "and",
    "True": "False",
    "False": "True",
    "*": "+",
    "/": "*",
    "//": "%",
    "%": "//",
    "min": "max",
    "max": "min",
    "&": "|",
    "|": "&",
}
"""One-token mutations: an operator flipped; an integer constant is moved by one (off-by-one)."""
MUTANT_TRIES = 4


def tag(value: Any) -> Any:
    """A test value as JSON (tuples tagged); None when JSON cannot carry it (sets, bytes, non-str keys)."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        out = [tag(v) for v in value]
        return None if any(o is None and v is not None for o, v in zip(out, value, strict=True)) else out
    if type(value) is tuple:
        inner = tag(list(value))
        return None if inner is None else {"tuple": inner}
    if type(value) is dict and all(type(k) is str for k in value) and "tuple" not in value:
        out = {k: tag(v) for k, v in value.items()}
        return None if any(out[k] is None and value[k] is not None for k in value) else out
    return None


def _call_case(test: ast.expr, callee: str | None) -> tuple[str, list, Any] | None:
    """`f(literals) == literal` as (f, args, expected); None for any other shape."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    call, want = test.left, test.comparators[0]
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.keywords):
        return None
    if callee is not None and call.func.id != callee:
        return None
    try:
        return call.func.id, [ast.literal_eval(a) for a in call.args], ast.literal_eval(want)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def calls_from_asserts(statements: list[ast.stmt], callee: str | None) -> tuple[str, list] | None:
    """(function name, tagged [args, expected] pairs) when every statement is such an assert."""
    name, calls = None, []
    for stmt in statements:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring
        if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and stmt.test.value is True:
            continue  # HumanEval's `assert True, "..."`
        case = _call_case(stmt.test, callee) if isinstance(stmt, ast.Assert) else None
        if case is None or (name is not None and case[0] != name):
            return None
        name = case[0]
        args, want = tag(case[1]), tag(case[2])
        if args is None or (want is None and case[2] is not None):
            return None
        calls.append([args, want])
    return (name, calls) if name and calls else None


def corpus_tasks() -> list[dict]:
    out = []
    for entry in exploit_corpus.EXPLOITS + exploit_corpus.HONEST:
        p = entry.problem
        calls = tag([[list(args), want] for args, want in p.calls]) if p.calls else None
        out.append(
            {
                "id": entry.name,
                "set": "corpus",
                "kind": "exploit" if entry.expect != "one" else "honest",
                "family": entry.family,
                "expect": entry.expect,
                "style": p.style,
                "program": entry.program,
                "tests": exploit_corpus.test_code(p) if p.style != "stdio" else "",
                "entry_point": p.entry_point,
                "calls": calls,
                "inputs": list(p.inputs),
                "outputs": list(p.outputs),
                "dataset": "corpus",
                "reference": exploit_corpus.reference(p),
            }
        )
    return out


def humaneval_tasks(limit: int | None = None) -> list[dict]:
    with gzip.open(DATA / "HumanEval.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f][:limit]
    out = []
    for row in rows:
        tests = f"{row['test']}\n\ncheck({row['entry_point']})\n"
        check = next(
            (n for n in ast.parse(row["test"]).body if isinstance(n, ast.FunctionDef) and n.name == "check"),
            None,
        )
        found = calls_from_asserts(check.body, "candidate") if check else None
        out.append(
            _function_task(
                f"humaneval/{row['task_id'].split('/')[1]}",
                "humaneval",
                "check",
                row["prompt"] + row["canonical_solution"],
                tests,
                row["entry_point"],
                found[1] if found else None,
            )
            | {"mutable_from": len(row["prompt"])}
        )
    return out


def mbpp_tasks(limit: int | None = None) -> list[dict]:
    rows = [json.loads(line) for line in (DATA / "mbpp_prompt_validation_train.jsonl").open()][:limit]
    out = []
    for row in rows:
        tests = "\n".join(row["test_list"]) + "\n"
        if row["test_setup_code"]:
            tests = row["test_setup_code"] + "\n" + tests
        found = None if row["test_setup_code"] else calls_from_asserts(ast.parse(tests).body, None)
        first = ast.parse(row["test_list"][0]).body[0]
        entry = next(
            (n.func.id for n in ast.walk(first) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)),
            "",
        )
        out.append(
            _function_task(
                f"mbpp/{row['task_id']}",
                "mbpp",
                "assert",
                row["code"],
                tests,
                found[0] if found else entry,
                found[1] if found else None,
            )
            | {"mutable_from": 0}
        )
    return out


def _function_task(tid, dataset, style, program, tests, entry, calls) -> dict:
    return {
        "id": tid,
        "set": dataset,
        "kind": "honest",
        "style": style,
        "program": program,
        "tests": tests,
        "entry_point": entry,
        "calls": calls,
        "inputs": [],
        "outputs": [],
        "dataset": dataset,
        "reference": {"tests": tests},
    }


def mutation_candidates(task: dict, tries: int = MUTANT_TRIES) -> list[dict]:
    """Up to `tries` one-token mutants of the task's program (in its solution part only), in a
    fixed pseudo-random order seeded by the task id: the first that plain Python rejects is the
    task's mutant."""
    program, start = task["program"], task["mutable_from"]
    line_starts = [0]
    for line in io.StringIO(program, newline=""):
        line_starts.append(line_starts[-1] + len(line))
    edits = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(program, newline="").readline):
            at = line_starts[tok.start[0] - 1] + tok.start[1]
            if at < start:
                continue
            if tok.string in SWAPS and tok.type in (tokenize.OP, tokenize.NAME):
                edits.append((at, tok.string, SWAPS[tok.string]))
            elif tok.type == tokenize.NUMBER and tok.string.isdigit():
                edits.append((at, tok.string, str(int(tok.string) + 1)))
            elif tok.type == tokenize.NUMBER and tok.string.replace(".", "", 1).isdigit():
                edits.append((at, tok.string, repr(float(tok.string) + 1)))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    random.Random(task["id"]).shuffle(edits)
    out = []
    for k, (at, old, new) in enumerate(edits[:tries]):
        mutated = program[:at] + new + program[at + len(old) :]
        out.append(
            task | {"id": f"{task['id']}~m{k}", "kind": "mutant", "program": mutated, "edit": f"{old}->{new}"}
        )
    return out


def gsm8k_rows(limit: int | None = None) -> list[dict]:
    return [json.loads(line) for line in (DATA / "gsm8k_train.jsonl").open()][:limit]


def changed_final_number(answer: str) -> str:
    head, _, last = answer.rpartition("#### ")
    return f"{head}#### {int(last.replace(',', '')) + 1}"
