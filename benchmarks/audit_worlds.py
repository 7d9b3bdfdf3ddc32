"""The audit's alarms on worlds other than the benchmark's own task, on seeds never tuned on,
and the share of `late` items under an async trainer (issue 45).

    python benchmarks/audit_worlds.py --part worlds --seeds 10 --first-seed 100
    python benchmarks/audit_worlds.py --part lag
    python benchmarks/audit_worlds.py --part worlds --rollouts 512 --versions 200   # a small step

A world is a large pool of candidate answers, each with a proxy and a gold score; policy version
v answers by drawing from the pool tilted toward the proxy, π_v ∝ exp(β_v · proxy) — exactly the
policy KL-regularised RL converges to, so E_v[gold] is known (the weighted pool mean) and the
gold peak is exact. An **over-optimising** run lets β grow linearly, past the gold peak; an
**honest** run lets β rise to a plateau below it (gold rises, then stays; it never falls).

- `length` (`length-slow`: the same world optimised 2.3 times slower): quality q ~ N(0, 1), a length L ~ Gamma(2, 1.5); proxy = q + 0.4 L (a length-swayed
  reward model); gold = q − 0.08 · max(0, L − 4)² (too long is worse). Tilting toward the proxy
  buys length: gold peaks, then falls.
- `ties`: the proxy has four tied levels; within them gold falls slightly with the level (the
  proxy orders the bulk against gold by a hair), and 6% of answers are at a fifth level with a
  much higher gold: τ(proxy, gold) is negative while the covariance is positive, and tilting
  toward the proxy raises gold — the honest plateau that fired the τ rules (issue 45). The
  over-optimising run adds 0.3% of hacks at the top level with a gold of −1.

Every version's `--rollouts` answers (groups of `--group`) go through the service's own
`AuditStream` (sampler, queue, workers, ledger, alarms) with the gold as a hosted auditor, at
`--sample`. Detection: `overoptimization` first fires at or before the gold peak. False alarms:
bins at which any alarm fired in the honest runs, per 1,000 versions.
Results: docs/benchmarks/audit.md ("Other worlds", "Async trainers").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rewardplane.serve.audit.config import AuditConfig
from rewardplane.serve.audit.stream import AuditStream
from rewardplane.serve.scorers.base import ScoreItem

ALARMS = ("overoptimization", "decorrelation", "signature")
POOL = 200_000


@dataclass(frozen=True)
class World:
    name: str
    pool: Callable[[np.random.Generator, bool], tuple[np.ndarray, np.ndarray]]
    """(proxy, gold) of the candidate pool; the flag: the over-optimising variant."""
    step: float  # β per version of the over-optimising run
    plateau: float  # the β an honest run levels off at


def length_pool(rng: np.random.Generator, hacked: bool) -> tuple[np.ndarray, np.ndarray]:
    quality, length = rng.normal(size=POOL), rng.gamma(2.0, 1.5, size=POOL)
    return quality + 0.4 * length, quality - 0.08 * np.maximum(0.0, length - 4.0) ** 2


def ties_pool(rng: np.random.Generator, hacked: bool) -> tuple[np.ndarray, np.ndarray]:
    level = rng.choice(4, size=POOL, p=[0.4, 0.3, 0.2, 0.1]).astype(np.float64)
    gold = 0.6 - 0.08 * level + 0.05 * rng.normal(size=POOL)
    top = rng.random(POOL) < 0.06
    level[top], gold[top] = 4.0, 1.5 + 0.05 * rng.normal(size=int(top.sum()))
    if hacked:
        hack = rng.random(POOL) < 0.003
        level[hack], gold[hack] = 6.0, -1.0
    return level, gold


WORLDS = {
    "length": World("length", length_pool, step=0.03, plateau=0.15),
    "length-slow": World("length-slow", length_pool, step=0.0128, plateau=0.15),
    "ties": World("ties", ties_pool, step=0.05, plateau=0.15),
}


def beta(world: World, version: int, honest: bool) -> float:
    """β of version v: linear (over-optimising), or rising to `plateau` (time constant 8 versions)."""
    if honest:
        return world.plateau * (1.0 - np.exp(-version / 8))
    return world.step * version


def tilt(proxy: np.ndarray, b: float) -> np.ndarray:
    w = np.exp(b * (proxy - proxy.max()))
    return w / w.sum()


class PoolGold:
    """The gold reward as a hosted auditor: each item carries its pool index."""

    def __init__(self, gold: np.ndarray) -> None:
        self.gold = gold

    async def score(self, name: str, items: list[ScoreItem]) -> list[float]:
        return [float(self.gold[int(i.id)]) for i in items]


def config(args: argparse.Namespace, **settings: Any) -> AuditConfig:
    settings["boost"] = {k: v for k, v in (("factor", args.boost), ("watch", args.watch)) if v is not None}
    return AuditConfig(proxy="proxy", auditors=["gold"], sample=args.sample, batch_wait_s=0.0, **settings)


async def run(world: World, seed: int, honest: bool, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    proxy, gold = world.pool(rng, not honest)
    stream = AuditStream(config(args), PoolGold(gold), secret=f"{world.name}:{seed}".encode())
    await stream.start()
    truth = []
    try:
        for v in range(args.versions if honest else args.over_versions):
            weights = tilt(proxy, beta(world, v, honest))
            truth.append(float(weights @ gold))
            picks = rng.choice(POOL, size=args.rollouts, p=weights)
            meta = {"policy_version": v}
            items = [ScoreItem(str(j), "q", "an answer", group_id=f"{k // args.group}", metadata=meta)
                     for k, j in enumerate(picks.tolist())]  # fmt: skip
            stream.observe(["proxy"], items, {"proxy": proxy[picks].tolist()})
            await stream.drain()
    finally:
        await stream.stop()
    first: dict[str, int] = {}
    for d in stream.ledger.decisions:
        if d.fired:
            first.setdefault(d.alarm, d.versions[1])
    fired = {a: sum(d.fired for d in stream.ledger.decisions if d.alarm == a) for a in ALARMS}
    tilts = [b["auditors"]["gold"]["tilt"] for b in stream.ledger.bins]
    taus = [b["auditors"]["gold"]["tau"] for b in stream.ledger.bins]
    tail = slice(-max(1, len(tilts) // 3), None)  # the plateau: the last third of the bins
    return {
        "world": world.name,
        "seed": seed,
        "honest": honest,
        "gold_peak_version": int(np.argmax(truth)),
        "gold_at_peak": round(max(truth), 4),
        "gold_at_alarm": round(truth[first["overoptimization"]], 4) if "overoptimization" in first else None,
        "gold_falls": bool(max(truth) - truth[-1] > 1e-9 and np.argmax(truth) < len(truth) - 1),
        "first_fired": first,
        "fired_bins": fired,
        "bins": len(stream.ledger.bins),
        "plateau_tau": _median([t["point"] for t in taus[tail] if t]),
        "plateau_tilt": _median([t["point"] for t in tilts[tail] if t]),
        "evidence": stream._snapshot(summary=True, since=None)["evidence"],
        "counts": dict(stream.counts),
    }


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 3) if values else None


def part_worlds(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in args.worlds:
        world = WORLDS[name]
        runs = []
        for honest in (False, True):
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                started = time.perf_counter()
                r = asyncio.run(run(world, seed, honest, args))
                r["seconds"] = round(time.perf_counter() - started, 1)
                runs.append(r)
                print(f"  {name} {'honest' if honest else 'over-opt'} seed {seed}: peak v{r['gold_peak_version']} "
                      f"first {r['first_fired']} fired {r['fired_bins']} of {r['bins']} bins, plateau tau "
                      f"{r['plateau_tau']} tilt {r['plateau_tilt']} ({r['seconds']} s)", flush=True)  # fmt: skip
        over = [r for r in runs if not r["honest"]]
        honest_runs = [r for r in runs if r["honest"]]
        leads = [r["gold_peak_version"] - r["first_fired"]["overoptimization"] for r in over
                 if "overoptimization" in r["first_fired"]]  # fmt: skip
        versions = args.versions * len(honest_runs)
        out[name] = {
            "detected_at_or_before_peak": sum(lead >= 0 for lead in leads),
            "runs": len(over),
            "median_lead": float(np.median(leads)) if leads else None,
            "leads": leads,
            "honest_versions": versions,
            "honest_gold_falls": sum(r["gold_falls"] for r in honest_runs),
            "false_alarms_per_1000_versions": {
                a: round(1000 * sum(r["fired_bins"][a] for r in honest_runs) / versions, 2) for a in ALARMS
            },
            "runs_detail": runs,
        }
        print(f"{name}: {json.dumps({k: v for k, v in out[name].items() if k != 'runs_detail'})}", flush=True)
    return out


async def lag_run(args: argparse.Namespace, settle: int, seed: int) -> dict[str, int]:
    """An async trainer: at step t one worker sends version t, the other version t − L, L drawn
    from 1-4 each step; the audit at `settle` versions."""
    rng = np.random.default_rng(seed)
    proxy, gold = WORLDS["length"].pool(rng, False)
    stream = AuditStream(config(args, settle_versions=settle), PoolGold(gold), secret=b"lag")
    await stream.start()
    try:
        for t in range(args.versions):
            for version in (t, t - int(rng.integers(1, 5))):
                if version < 0:
                    continue
                picks = rng.choice(POOL, size=args.rollouts // 2)
                items = [ScoreItem(str(j), "q", "an answer", group_id=f"{t}-{version}-{k // args.group}",
                                   metadata={"policy_version": version}) for k, j in enumerate(picks.tolist())]  # fmt: skip
                stream.observe(["proxy"], items, {"proxy": proxy[picks].tolist()})
                await asyncio.sleep(0)
            await stream.drain()
    finally:
        await stream.stop()
    return {"audited": stream.counts.get("audited", 0), "late": stream.counts.get("late", 0)}


def part_lag(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for settle in (1, 2, 4, 5, 6):
        counts = asyncio.run(lag_run(args, settle, args.first_seed))
        rows.append(
            {
                "settle_versions": settle,
                **counts,
                "late_share": round(counts["late"] / max(1, counts["audited"]), 4),
            }
        )
        print(f"  lag 1-4: settle_versions {settle}: {rows[-1]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("worlds", "lag"), default="worlds")
    p.add_argument("--worlds", nargs="+", default=["length", "ties"], choices=sorted(WORLDS))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=100)
    p.add_argument("--versions", type=int, default=100, help="versions of each honest run")
    p.add_argument("--over-versions", type=int, default=48, help="versions of each over-optimising run")
    p.add_argument("--rollouts", type=int, default=4096, help="answers per version")
    p.add_argument("--group", type=int, default=8, help="answers per group (sampled whole)")
    p.add_argument("--sample", type=float, default=0.03)
    p.add_argument(
        "--boost", type=float, default=None, help="the audit's boost factor (default: its default)"
    )
    p.add_argument("--watch", type=float, default=None, help="the boost's watch level (default: none)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    result = part_worlds(args) if args.part == "worlds" else part_lag(args)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"command": " ".join(sys.argv), "result": result}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
