"""The package's shape, checked from source: no import cycles, imports only run down the layers.

The import graph is read from the AST of every module under src/rewardplane (lazy imports inside
functions included: they still tie one layer to another), so this needs no new dependency and
imports nothing. docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rewardplane"

LAYERS: tuple[tuple[str, ...], ...] = (
    # lowest first; a module may import its own layer and those listed before it
    ("core",),
    ("data",),
    ("models",),
    ("objectives",),
    ("eval",),  # below train: training evaluates its probe through the eval runner
    ("train",),
    ("serve",),
    ("deploy",),
    ("bench",),
    ("integrations",),
    ("cli", "demo", "__main__"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module of this package: line number of the first such import}."""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import mod` names the submodule; `from pkg import name` the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "core"  # the root package holds only __version__


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as a path a -> b -> ... -> a, or None (iterative DFS, three colours)."""
    colour: dict[str, int] = {}
    for start in sorted(graph):
        if colour.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        path = [start]
        colour[start] = 1
        while stack:
            node, pending = stack[-1]
            if not pending:
                colour[node] = 2
                stack.pop()
                path.pop()
                continue
            nxt = pending.pop()
            if colour.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if not colour.get(nxt):
                colour[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(graph[nxt])))
    return None


def layering_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    found = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            src, dst = layer_of(module), layer_of(target)
            if src not in RANK or dst not in RANK:
                found.append(f"{module}: package {src if src not in RANK else dst!r} has no layer in LAYERS")
            elif RANK[dst] > RANK[src]:
                found.append(
                    f"{module}:{line} imports {target} ({src} may not import the higher layer {dst})"
                )
    return found


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    """`module` is one of `prefixes` or inside one of them (a package prefix)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


SCORERS = ("rewardplane.serve.scorers",)
SPEAKERS = ("rewardplane.bench", "rewardplane.serve.client")
"""Speakers of the wire: they say what the protocol says and import no scorer module."""
PLANNERS = ("rewardplane.bench.qualify",)
"""bench/qualify plans deployments: it reads the scorer specs it lays out, above serve and deploy."""
PROTOCOL = ("rewardplane.serve.protocol",)
PROTOCOL_MAY_IMPORT = ("rewardplane.core", "rewardplane.data", *PROTOCOL)
"""The protocol is the bottom of serve: it imports no scorer, route, backend or app."""


def scorer_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports that break "bench and the client import no scorer module" or "the protocol
    imports nothing of serve but itself"."""
    found = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            if within(module, SPEAKERS) and not within(module, PLANNERS) and within(target, SCORERS):
                found.append(f"{module}:{line} imports {target} (a speaker of the wire imports no scorer)")
            elif within(module, PROTOCOL) and not within(target, PROTOCOL_MAY_IMPORT):
                found.append(
                    f"{module}:{line} imports {target} (the protocol imports only core, data, itself)"
                )
    return found


def test_bench_and_the_client_import_no_scorer_module_and_the_protocol_nothing_above_it():
    assert scorer_imports(import_graph(PACKAGE)) == []


def test_no_import_cycles():
    cycle = find_cycle(import_graph(PACKAGE))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_run_down_the_layers():
    assert layering_violations(import_graph(PACKAGE)) == []


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    """The checks themselves, on a fabricated package, so that a broken checker cannot pass silently."""
    pkg = tmp_path / "rewardplane"
    for sub in ("core", "serve"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from rewardplane.core import b\n")
    (pkg / "core" / "b.py").write_text("def f():\n    from rewardplane.core.a import x\n")
    (pkg / "core" / "c.py").write_text("from ..serve import app\n")
    (pkg / "serve" / "app.py").write_text("import rewardplane.core.a\n")
    graph = import_graph(pkg)
    assert find_cycle(graph) in (
        ["rewardplane.core.a", "rewardplane.core.b", "rewardplane.core.a"],
        ["rewardplane.core.b", "rewardplane.core.a", "rewardplane.core.b"],
    )
    assert layering_violations(graph) == [
        "rewardplane.core.c:1 imports rewardplane.serve.app (core may not import the higher layer serve)"
    ]


def test_the_scorer_rule_catches_a_speaker_or_the_protocol_importing_a_scorer(tmp_path):
    pkg = tmp_path / "rewardplane"
    for sub in ("bench", "serve", "serve/scorers", "serve/protocol"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "serve" / "scorers" / "base.py").write_text("")
    (pkg / "serve" / "client.py").write_text("def f():\n    from rewardplane.serve.scorers import base\n")
    (pkg / "bench" / "loadgen.py").write_text("from rewardplane.serve.protocol import items\n")
    (pkg / "serve" / "protocol" / "items.py").write_text("from ..scorers.base import Scorer\n")
    assert scorer_imports(import_graph(pkg)) == [
        "rewardplane.serve.client:2 imports rewardplane.serve.scorers.base (a speaker of the wire imports no scorer)",
        "rewardplane.serve.protocol.items:1 imports rewardplane.serve.scorers.base"
        " (the protocol imports only core, data, itself)",
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
    """Short modules with one job (docs/architecture.md); a module that grows past this splits by job."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
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
