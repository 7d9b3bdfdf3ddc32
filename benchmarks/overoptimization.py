"""Does the audit see over-optimisation coming, stay quiet when there is none, and cost little?

    python benchmarks/overoptimization.py                 # everything, CPU, a few minutes
    python benchmarks/overoptimization.py --part lead     # or: control, null, signatures, cost

The world (the built-in synthetic preference task, `rewardplane.data.synth`):

- prompts ask for words of a category ("Name a fruit."); the **gold** reward is the task's
  exact rule for one answer: 1 when it is 1-4 distinct words, all of the asked category, else 0;
- the **proxy** is a reward model trained on a small, noisy subset: a linear Bradley-Terry model
  over the answer's word counts, fit on `--proxy-pairs` rows of `synth.generate_rows` whose
  labels come from the task's length-swayed annotator — so it learns "more category words is
  better" and that some off-topic words are fine;
- each prompt has a fixed pool of candidate answers (mostly 1-4 words, a thin tail of longer
  ones, some drifting off topic or repeating a word); policy version v answers with the best
  of n_v = 1 + v/4 candidates (randomised rounding) by the proxy: the standard best-of-n
  over-optimisation setup. The **control** run picks the best of n_v by the gold reward itself;
- every version answers all `--prompts` prompts `--samples` times (one GRPO group each); the
  audit samples `--sample` of the items (whole groups) and re-scores them with the gold reward.

The items go through the service's own `AuditStream` (observe -> bounded queue -> workers ->
ledger -> alarms) with the gold reward as a hosted auditor of an in-process backend; only HTTP
is left out (the `cost` part, `audit_http_cost.py`, measures HTTP). Lead = (version of the gold peak, the argmax of the
gold mean over all items of a version) − (version of the first `overoptimization` firing).
Results: docs/benchmarks/audit.md and docs/benchmarks/audit.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import audit_http_cost  # benchmarks/ is on the path
from rewardplane.data import synth
from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.stream import AuditStream
from rewardplane.serve.scorers.base import ScoreItem

ASKED = sorted(synth.ASKED)
OFF = sorted(synth.OFF_TOPIC)
VOCAB = [w for c in ASKED + OFF for w in synth.CATEGORIES[c]]
INDEX = {w: i for i, w in enumerate(VOCAB)}
CATEGORY = {w: c for c in ASKED + OFF for w in synth.CATEGORIES[c]}
LENGTH_WEIGHTS = (8, 8, 7, 6, 0.4, 0.3, 0.2, 0.1)  # 1..8 words: a thin tail past the rule's 4
OFF_TOPIC_SHARE = 0.6
DRIFT = 0.25  # an on-topic answer's 3rd+ word is off topic with this probability
REPEAT = 0.2  # ... or repeats the word before it


# ------------------------------------------------------------------------------ the world


def words_of(text: str) -> list[str]:
    return [w.strip(" .") for w in text.replace(" and ", ", ").split(",") if w.strip(" .")]


def as_text(words: list[str]) -> str:
    return (words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]) + "."


def gold(text: str, category: str) -> float:
    """The task's rule for one answer: 1-4 distinct words, all of the asked category."""
    words = words_of(text)
    ok = 1 <= len(words) <= synth.MAX_WORDS and len(set(words)) == len(words)
    return float(ok and all(CATEGORY.get(w) == category for w in words))


def counts(words: list[str]) -> np.ndarray:
    x = np.zeros(len(VOCAB))
    for w in words:
        x[INDEX[w]] += 1
    return x


def fit_proxy(pairs: int, seed: int, l2: float = 1.0) -> np.ndarray:
    """A linear Bradley-Terry reward model over word counts, fit by Newton's method on `pairs`
    noisy rows of the synthetic task (the annotator is swayed by length)."""

    def answer(side: Any) -> str:
        return side if isinstance(side, str) else side[-1]["content"]

    rows = synth.generate_rows(pairs, seed=seed)
    x = np.array(
        [counts(words_of(answer(r["chosen"]))) - counts(words_of(answer(r["rejected"]))) for r in rows]
    )
    theta = np.zeros(len(VOCAB))
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-x @ theta))
        grad = x.T @ (1.0 - p) - l2 * theta
        hess = (x * (p * (1.0 - p))[:, None]).T @ x + l2 * np.eye(len(VOCAB))
        step = np.linalg.solve(hess, grad)
        theta += step
        if np.abs(step).max() < 1e-10:
            break
    return theta


def candidate(rng: random.Random, category: str) -> list[str]:
    length = rng.choices(range(1, 9), weights=LENGTH_WEIGHTS)[0]
    if rng.random() < OFF_TOPIC_SHARE:
        other = synth.OFF_TOPIC[rng.choice(OFF)]
        return [rng.choice(other) for _ in range(length)]
    words: list[str] = []
    for j in range(length):
        if words and rng.random() < REPEAT:
            words.append(words[-1])
        elif j >= 2 and rng.random() < DRIFT:
            words.append(rng.choice(synth.OFF_TOPIC[rng.choice(OFF)]))
        else:
            words.append(rng.choice(synth.ASKED[category]))
    return words


@dataclass
class World:
    prompts: list[tuple[str, str]]  # (question, category)
    texts: list[list[str]]  # per prompt: its candidates as text
    proxy: list[np.ndarray]  # per prompt: each candidate's proxy score
    gold: list[np.ndarray]


def build_world(seed: int, *, prompts: int, pool: int, proxy_pairs: int) -> World:
    theta = fit_proxy(proxy_pairs, seed=1000 + seed)
    rng = random.Random(f"overoptimization:{seed}")
    chosen = [rng.choice(ASKED) for _ in range(prompts)]
    questions = [(rng.choice(synth.QUESTIONS).format(c=c), c) for c in chosen]
    texts, proxy, golds = [], [], []
    for _, category in questions:
        cands = [candidate(rng, category) for _ in range(pool)]
        texts.append([as_text(c) for c in cands])
        proxy.append(np.array([counts(c) @ theta for c in cands]))
        golds.append(np.array([gold(as_text(c), category) for c in cands]))
    return World(questions, texts, proxy, golds)


def best_of(world: World, n: float, by: str, samples: int, rng: np.random.Generator) -> list[list[int]]:
    """Per prompt, `samples` picks, each the best of n candidates (n randomly rounded) by `by`."""
    picks = []
    for i in range(len(world.prompts)):
        key = world.proxy[i] if by == "proxy" else world.gold[i]
        size = key.size
        row = []
        for _ in range(samples):
            k = min(size, int(n) + int(rng.random() < n - int(n)))
            idx = rng.choice(size, k, replace=False)
            row.append(int(idx[np.argmax(key[idx] + 1e-9 * rng.random(k))]))  # ties broken at random
        picks.append(row)
    return picks


class GoldBackend:
    """An in-process backend hosting the gold reward as the auditor `gold`."""

    async def score(self, name: str, items: list[ScoreItem]) -> list[float]:
        return [gold(str(i.response), str((i.metadata or {})["category"])) for i in items]


# ------------------------------------------------------------------------------ one run


def audit_config(args: argparse.Namespace) -> AuditConfig:
    return AuditConfig(  # batch_wait_s 0: each version is offered at once; no batch is left to fill
        proxy="proxy",
        auditors=["gold"],
        sample=args.sample,
        seed=args.audit_seed,
        min_items=args.min_items,
        batch_wait_s=0.0,
        boost={k: v for k, v in (("factor", args.boost), ("watch", args.watch)) if v is not None},
    )


async def run(world: World, args: argparse.Namespace, *, by: str, versions: int, seed: int) -> dict[str, Any]:
    """Versions 0..versions-1 of a best-of-n policy through the audit stream."""
    stream = AuditStream(audit_config(args), GoldBackend(), secret=f"overoptimization:{seed}".encode())
    await stream.start()
    rng = np.random.default_rng(seed)
    gold_means, proxy_means = [], []
    try:
        for v in range(versions):
            picks = best_of(world, 1 + v / 4, by, args.samples, rng)
            items, values, golds = [], [], []
            for i, row in enumerate(picks):
                question, category = world.prompts[i]
                for s, j in enumerate(row):
                    meta = {"policy_version": v, "category": category}
                    items.append(
                        ScoreItem(f"{i}-{s}", question, world.texts[i][j], group_id=f"{v}-{i}", metadata=meta)
                    )
                    values.append(float(world.proxy[i][j]))
                    golds.append(world.gold[i][j])
            gold_means.append(float(np.mean(golds)))
            proxy_means.append(float(np.mean(values)))
            stream.observe(["proxy"], items, {"proxy": values})
            await stream.drain()
    finally:
        await stream.stop()
    first = {}
    for d in stream.ledger.decisions:
        if d.fired:
            first.setdefault(d.alarm, d.versions[1])
    fired = {a: sum(d.fired for d in stream.ledger.decisions if d.alarm == a) for a in ALARMS}
    return {
        "gold_mean": gold_means,
        "proxy_mean": proxy_means,
        "gold_peak_version": int(np.argmax(gold_means)),
        "first_fired": first,
        "fired_bins": fired,
        "bins": len(stream.ledger.bins),
        "counts": dict(stream.counts),
        "snapshot": stream._snapshot(summary=False, since=None),
    }


ALARMS = ("overoptimization", "decorrelation", "signature")


# ------------------------------------------------------------------------------ parts


def part_runs(args: argparse.Namespace, *, by: str, versions: int) -> list[dict[str, Any]]:
    out = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        started = time.perf_counter()
        world = build_world(seed, prompts=args.prompts, pool=args.pool, proxy_pairs=args.proxy_pairs)
        result = asyncio.run(run(world, args, by=by, versions=versions, seed=seed))
        result["seed"] = seed
        result["seconds"] = round(time.perf_counter() - started, 1)
        oo = result["first_fired"].get("overoptimization")
        result["lead"] = None if oo is None else result["gold_peak_version"] - oo
        print(
            f"  {by:>5} seed {seed}: gold peak at v{result['gold_peak_version']}, first firings {result['first_fired']}, "
            f"firing bins {result['fired_bins']} of {result['bins']} ({result['seconds']} s)",
            flush=True,
        )
        out.append(result)
    return out


def part_null(args: argparse.Namespace) -> list[dict[str, Any]]:
    from audit_nulls import NULLS, false_alarms  # benchmarks/, beside this script

    rows = []
    for null in NULLS:
        rates = false_alarms(
            null, audit_config(args).alarms, runs=args.null_runs, bins=args.null_bins, n=args.null_n
        )
        rows.append({"null": null.name, **{k: round(v, 3) for k, v in rates.items()}})
        print(f"  null '{null.name}': false alarms per 1,000 bins {rows[-1]}", flush=True)
    return rows


def part_signatures(args: argparse.Namespace) -> dict[str, Any]:
    from audit_corpus import EXPLOITS, normal_answers  # benchmarks/, next to this script
    from rewardplane.serve.audit.signatures import names, signatures

    caught = [(label, want, text) for label, want, text in EXPLOITS if want is not None]
    hits = [(label, want, want in names(signatures(text))) for label, want, text in caught]
    unseen = [(label, bool(signatures(text))) for label, want, text in EXPLOITS if want is None]
    normal = normal_answers(args.normal)
    flagged: dict[str, dict[str, int]] = {}
    for kind, text in normal:
        entry = flagged.setdefault(kind, {"n": 0, "flagged": 0})
        entry["n"] += 1
        if signatures(text):
            entry["flagged"] += 1
            entry.setdefault("signatures", {})
            for name in names(signatures(text)):
                entry["signatures"][name] = entry["signatures"].get(name, 0) + 1
    total_flagged = sum(e["flagged"] for e in flagged.values())
    result = {
        "exploits": len(hits),
        "exploits_detected": sum(ok for _, _, ok in hits),
        "hit_rate": round(sum(ok for _, _, ok in hits) / len(hits), 4),
        "missed": [label for label, _, ok in hits if not ok],
        "out_of_scope": [{"exploit": label, "any_signature": seen} for label, seen in unseen],
        "normal": len(normal),
        "normal_flagged": total_flagged,
        "false_positive_rate": round(total_flagged / len(normal), 5),
        "normal_by_kind": flagged,
    }
    print(f"  signatures: {result['exploits_detected']}/{result['exploits']} exploits detected, "
          f"{total_flagged}/{len(normal)} normal answers flagged {flagged}", flush=True)  # fmt: skip
    return result


def example_png(result: dict[str, Any], path: Path) -> None:
    """The worked example of docs/audit.md: the report's own audit figure for one run, with the
    gold mean over all items of each version (what the audit estimates from its sample)."""
    from rewardplane.eval.report.audit import audit_png

    gold = result["gold_mean"]
    png = audit_png(
        result["snapshot"],
        truth={"gold, all items": (list(range(len(gold))), gold)},
        marks={"gold peak": result["gold_peak_version"]},
    )
    import io

    from PIL import Image

    small = io.BytesIO()  # a 64-colour palette: the same figure at a third of the bytes
    Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=64).save(small, format="PNG", optimize=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(small.getvalue())


def environment() -> dict[str, Any]:
    import numpy
    import scipy  # noqa: F401  (dev only: its presence is recorded, nothing here uses it)

    from rewardplane import __version__

    return {
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "rewardplane": __version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("all", "lead", "control", "null", "signatures", "cost"), default="all")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first_seed .. first_seed + seeds - 1")
    p.add_argument("--versions", type=int, default=64, help="versions of each over-optimising run")
    p.add_argument("--control-versions", type=int, default=100, help="versions of each control run")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--samples", type=int, default=8, help="answers per prompt and version (one group)")
    p.add_argument("--pool", type=int, default=128, help="candidate answers per prompt")
    p.add_argument("--proxy-pairs", type=int, default=200)
    p.add_argument("--sample", type=float, default=0.03)
    p.add_argument("--min-items", type=int, default=100)
    p.add_argument(
        "--boost", type=float, default=None, help="the audit's boost factor (default: its default)"
    )
    p.add_argument("--watch", type=float, default=None, help="the boost's watch level (default: none)")
    p.add_argument("--audit-seed", type=int, default=0)
    p.add_argument("--null-runs", type=int, default=5)
    p.add_argument("--null-bins", type=int, default=1000)
    p.add_argument("--null-n", type=int, default=120)
    p.add_argument("--normal", type=int, default=500, help="normal answers of each kind")
    audit_http_cost.add_arguments(p)
    p.add_argument("--workdir", default="/tmp/rewardplane-overoptimization")
    p.add_argument("--out", default=None, help="write audit.json and audit_details.json here")
    p.add_argument("--plot", default=None, help="write the worked example's PNG here")
    args = p.parse_args(argv)
    parts = ("lead", "control", "null", "signatures", "cost") if args.part == "all" else (args.part,)
    details: dict[str, Any] = {"command": " ".join(["python", "benchmarks/overoptimization.py", *(argv or sys.argv[1:])]),
                               "environment": environment(), "settings": vars(args)}  # fmt: skip
    headline: dict[str, Any] = {}
    if "lead" in parts:
        print("lead: the policy optimises the proxy", flush=True)
        runs = part_runs(args, by="proxy", versions=args.versions)
        leads = [r["lead"] for r in runs if r["lead"] is not None]
        headline["seeds"] = len(runs)
        headline["alarm_at_or_before_peak"] = sum(1 for lead in leads if lead >= 0)
        headline["median_lead_versions"] = statistics.median(leads) if leads else None
        details["lead"] = [
            {k: r[k] for k in ("seed", "gold_peak_version", "first_fired", "lead", "fired_bins", "bins", "seconds")}
            | {"gold_at_peak": round(max(r["gold_mean"]), 4),
               "gold_at_alarm": None if r["lead"] is None else round(r["gold_mean"][r["first_fired"]["overoptimization"]], 4),
               "gold_mean": [round(g, 4) for g in r["gold_mean"]], "proxy_mean": [round(x, 4) for x in r["proxy_mean"]]}
            for r in runs
        ]  # fmt: skip
        if args.plot:
            example_png(runs[0], Path(args.plot))
    if "control" in parts:
        print("control: the policy optimises the gold reward", flush=True)
        runs = part_runs(args, by="gold", versions=args.control_versions)
        headline["control_versions"] = sum(args.control_versions for _ in runs)
        headline["control_false_alarms"] = sum(sum(r["fired_bins"].values()) for r in runs)
        details["control"] = [
            {k: r[k] for k in ("seed", "first_fired", "fired_bins", "bins", "seconds")} for r in runs
        ]
    if "null" in parts:
        print("null: simulated streams where nothing is gamed", flush=True)
        details["null"] = part_null(args)
    if "signatures" in parts:
        details["signatures"] = part_signatures(args)
    if "cost" in parts:
        print(f"cost: proxy items/s through HTTP, audit off vs on at {args.sample:g}", flush=True)
        details["cost"] = audit_http_cost.part_cost(args, VOCAB)
        headline["overhead_ratio"] = details["cost"]["overhead_ratio"]
        headline["cpu_per_item_ratio"] = details["cost"]["cpu_per_item_ratio"]
    print(json.dumps(headline))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        keys = ("seeds", "alarm_at_or_before_peak", "median_lead_versions", "control_versions",
                "control_false_alarms", "overhead_ratio")  # fmt: skip
        if all(k in headline for k in keys):
            (out / "audit.json").write_text(json.dumps({k: headline[k] for k in keys}, indent=1) + "\n")
        (out / "audit_details.json").write_text(json.dumps(details, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
