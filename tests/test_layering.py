"""The package's shape, checked from source against the design kept as data in
tests/support/layering.py (the line of layers, the parts table of allowed and forbidden arrows,
serve's order of parts) and drawn in docs/architecture.md: no import cycles, no import against
the tables, and the drawing equal to the tables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.layering import (
    ARROWS,
    LAYERS,
    SERVE_ORDER,
    all_imports,
    find_cycle,
    import_graph,
    violations,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rewardplane"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_no_import_cycles():
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_import_keeps_to_the_layers_the_parts_table_and_serves_order():
    assert violations(all_imports(PACKAGE)) == []


def _between(text: str, name: str) -> str:
    match = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
    assert match, f"docs/architecture.md has no <!-- {name} --> block"
    return match.group(1)


def test_docs_architecture_draws_the_same_tables():
    text = ARCHITECTURE.read_text()
    line = " ← ".join(" · ".join(names) for names in LAYERS)
    assert line in _between(text, "layers"), line
    rows = [
        [cell.strip().strip("`") for cell in row.strip().strip("|").split("|")]
        for row in _between(text, "arrows").strip().splitlines()[2:]
    ]
    assert rows == [[a.importer, a.imported, "yes" if a.allowed else "no", a.why] for a in ARROWS]
    assert " ← ".join(SERVE_ORDER) in _between(text, "serve-order")


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "rewardplane"
    for rel, source in {"__init__.py": "", **files}.items():
        path = pkg / rel
        for parent in reversed(path.relative_to(tmp_path).parents[:-1]):
            (tmp_path / parent).mkdir(exist_ok=True)
            (tmp_path / parent / "__init__.py").touch()
        path.write_text(source)
    return pkg


TODAYS_THREE = {
    # the three imports issue 46 found, as they were at 82488e0
    "serve/audit/stats.py": "from rewardplane.eval.bootstrap import replicate_means\n",
    "integrations/audit.py": "import httpx\n\ndef f():\n    from rewardplane.serve.audit.flat import firing\n",
    "bench/qualify/plan.py": "from rewardplane.serve.config import ScorerSpec\n",
    "eval/bootstrap.py": "",
    "serve/audit/flat.py": "",
    "serve/config.py": "",
}


def test_the_checker_catches_todays_three_kinds_of_arrow_on_a_fabricated_package(tmp_path):
    """A downward import the design forbids (serve -> eval), a speaker of the wire past the client
    (an integration importing the service's insides and making its own HTTP calls), and a planner
    (bench/qualify -> serve.config) that only its row in the table allows."""
    graph = all_imports(_package(tmp_path, TODAYS_THREE))
    assert violations(graph) == [
        "rewardplane.integrations.audit:1 imports httpx"
        " (integrations -> httpx: HTTP goes through serve.client (retries, auth, errors))",
        "rewardplane.integrations.audit:4 imports rewardplane.serve.audit.flat"
        " (integrations -> serve: speakers of the wire use the service only through its client and vocabulary)",
        "rewardplane.serve.audit.stats:1 imports rewardplane.eval.bootstrap"
        " (serve -> eval: the service scores through models and objectives, never the evaluation)",
    ]
    without_planner = tuple(a for a in ARROWS if a.importer != "bench.qualify")
    assert violations(graph, without_planner)[0] == (
        "rewardplane.bench.qualify.plan:1 imports rewardplane.serve.config"
        " (bench -> serve: speakers of the wire use the service only through its client and vocabulary)"
    )


def test_the_checker_catches_cycles_upward_imports_and_arrows_inside_serve(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "core/a.py": "from rewardplane.core import b\n",
            "core/b.py": "def f():\n    from rewardplane.core.a import x\n",
            "core/c.py": "from ..serve import app\n",  # up the line of layers
            "serve/app.py": "import rewardplane.core.a\n",
            "serve/config.py": "from rewardplane.serve.protocol import items\n",
            "serve/scorers/composite.py": "from ..config import KindSpec\n",  # up serve's order
            "serve/protocol/items.py": "from rewardplane.data import records\nimport rewardplane.models.x\n",
            "serve/client.py": "from rewardplane.serve.protocol import items\nfrom rewardplane.serve import backend\n",
            "serve/backend.py": "",
            "serve/newpart.py": "from rewardplane.serve.protocol import items\n",
            "bench/loadgen.py": "from rewardplane.serve.protocol import items\nfrom rewardplane.serve.scorers import base\n",
            "serve/scorers/base.py": "",
            "integrations/trl.py": "from rewardplane.serve.client import C\nfrom rewardplane.serve.protocol import items\n",
            "data/records.py": "",
            "models/x.py": "",
        },
    )
    assert find_cycle(import_graph(pkg)) in (
        ["rewardplane.core.a", "rewardplane.core.b", "rewardplane.core.a"],
        ["rewardplane.core.b", "rewardplane.core.a", "rewardplane.core.b"],
    )
    assert violations(all_imports(pkg)) == [
        "rewardplane.bench.loadgen:2 imports rewardplane.serve.scorers.base"
        " (bench -> serve: speakers of the wire use the service only through its client and vocabulary)",
        "rewardplane.core.c:1 imports rewardplane.serve.app (core may not import the higher layer serve)",
        "rewardplane.serve.client:2 imports rewardplane.serve.backend"
        " (serve.client -> serve: the client speaks the wire, it runs nothing of the service)",
        "rewardplane.serve.newpart:1 imports rewardplane.serve.protocol.items"
        " (serve part 'newpart' has no place in SERVE_ORDER)",
        "rewardplane.serve.protocol.items:2 imports rewardplane.models.x"
        " (serve.protocol -> *: the wire's vocabulary is the bottom of serve)",
        "rewardplane.serve.scorers.composite:1 imports rewardplane.serve.config"
        " (upward inside serve: scorers sits below config in SERVE_ORDER)",
    ]


def test_no_test_module_imports_another():
    """Shared builders live in tests/support or conftest.py, never in a test module."""
    tests = Path(__file__).resolve().parent
    names = {p.stem for p in tests.rglob("test_*.py")}
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            for mod in mods:
                if mod.split(".")[-1] in names or mod.split(".")[0] in names:
                    found.append(f"{path.relative_to(tests)}:{node.lineno} imports {mod}")
    assert found == []


MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines():
    """Short modules with one job (docs/architecture.md), in src, tests and benchmarks alike; a
    module that grows past this splits by job."""
    long = {
        str(p.relative_to(ROOT)): n
        for folder in (PACKAGE, ROOT / "tests", ROOT / "benchmarks")
        for p in folder.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_support_module_shadows_the_standard_library():
    """tests/support is on sys.path (and is sys.path[0] for the scripts run from it, such as
    bench_fake_server.py): a `support/http.py` there made `import http` inside uvicorn fail."""
    import sys

    support = ROOT / "tests" / "support"
    shadowing = sorted(p.stem for p in support.glob("*.py") if p.stem in sys.stdlib_module_names)
    assert not shadowing, f"tests/support modules named like standard-library modules: {shadowing}"
