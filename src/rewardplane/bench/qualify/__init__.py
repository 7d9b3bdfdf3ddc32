"""`rewardplane qualify`: the same sweep against each deployment mode, started and stopped here.

For every dtype in the plan, deployments run in this order: dedicated, shared, mps at each
listed active-thread percentage, consolidated. Each is a `rewardplane serve --deploy` process
that qualify writes the deploy file for, starts and stops through bench/server.py, and
benchmarks with the seeded corpus. The parts, one job each:

- `plan`: the plan model (goal targets included) and its expansion into deployments;
- `run`: each deployment's server, sweep and GPU sampling; then everything written out;
- `summary`: validity, parity against dedicated, ratios, goals, the equal-utilisation ceiling;
- `report`: `report.md` and the plots.

MPS daemons are started by the deployments themselves (deploy/mps.py), never here.
"""

from rewardplane.bench.qualify.plan import (
    DEFAULT_ATOL,
    Deployment,
    Goals,
    ModePlan,
    Plan,
    Server,
    Sweep,
    estimate_s,
    expand,
    load_plan,
    parse_plan,
)
from rewardplane.bench.qualify.report import render_report, write_plots
from rewardplane.bench.qualify.run import dry_run, qualify, run_deployment
from rewardplane.bench.qualify.summary import (
    SUMMARY_VERSION,
    equal_utilisation_ceiling,
    evaluate_goals,
    gpu_ms_per_item,
    parity,
    summarize,
)

__all__ = [
    "DEFAULT_ATOL",
    "SUMMARY_VERSION",
    "Deployment",
    "Goals",
    "ModePlan",
    "Plan",
    "Server",
    "Sweep",
    "dry_run",
    "equal_utilisation_ceiling",
    "estimate_s",
    "evaluate_goals",
    "expand",
    "gpu_ms_per_item",
    "load_plan",
    "parity",
    "parse_plan",
    "qualify",
    "render_report",
    "run_deployment",
    "summarize",
    "write_plots",
]
