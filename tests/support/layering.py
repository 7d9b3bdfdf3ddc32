"""The package's design as data, and the checker that holds the code to it (tests/test_layering.py;
docs/architecture.md draws the same three tables, and a test keeps the drawing equal to them).

1. `LAYERS`: the line of packages, lowest first. Without a row in `ARROWS`, a module may import
   its own package and those before it.
2. `ARROWS`: the parts table, package-prefix pairs (importer, imported) that the line alone gets
   wrong: allowed (a planner above what it plans) or forbidden (a speaker of the wire reaching
   past the client, the service reaching into the evaluation). The most specific row wins: the
   longest importer prefix, then the longest imported prefix; `*` is any module of the package.
   An imported prefix outside the package (`httpx`) is a third-party module.
3. `SERVE_ORDER`: serve's parts (its subpackages and top modules), lowest first: a part imports
   only the parts before it, so there is no upward arrow inside serve. A new part takes its place
   here.

The import graph is read from the AST of every module (lazy imports inside functions included:
they still tie one part to another), so checking imports nothing of the package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT_PACKAGE = "rewardplane"

LAYERS: tuple[tuple[str, ...], ...] = (
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


@dataclass(frozen=True)
class Arrow:
    importer: str
    imported: str
    allowed: bool
    why: str


SPEAKERS_MAY_IMPORT = "speakers of the wire use the service only through its client and vocabulary"
ARROWS: tuple[Arrow, ...] = (
    Arrow("serve", "eval", False, "the service scores through models and objectives, never the evaluation"),
    Arrow("serve", "train", False, "the service never trains"),
    Arrow("serve.protocol", "*", False, "the wire's vocabulary is the bottom of serve"),
    Arrow("serve.protocol", "core", True, "errors and hashing"),
    Arrow("serve.protocol", "data", True, "the message records"),
    Arrow("serve.protocol", "serve.protocol", True, "itself"),
    Arrow("serve.client", "serve", False, "the client speaks the wire, it runs nothing of the service"),
    Arrow("serve.client", "serve.client", True, "itself"),
    Arrow("serve.client", "serve.protocol", True, "the vocabulary it speaks"),
    Arrow("serve.client", "serve.retries", True, "its retry policy"),
    Arrow("integrations", "serve", False, SPEAKERS_MAY_IMPORT),
    Arrow("integrations", "serve.client", True, "the client"),
    Arrow("integrations", "serve.protocol", True, "the vocabulary"),
    Arrow("integrations", "deploy", False, SPEAKERS_MAY_IMPORT),
    Arrow("integrations", "bench", False, "a trainer's reward function measures nothing"),
    Arrow("integrations", "httpx", False, "HTTP goes through serve.client (retries, auth, errors)"),
    Arrow("bench", "serve", False, SPEAKERS_MAY_IMPORT),
    Arrow("bench", "serve.client", True, "the client"),
    Arrow("bench", "serve.protocol", True, "the vocabulary"),
    Arrow("bench", "deploy", False, SPEAKERS_MAY_IMPORT),
    Arrow("bench.qualify", "serve", True, "a planner above serve: it lays out the scorer specs it runs"),
    Arrow("bench.qualify", "deploy", True, "a planner above deploy: it lays out the deployments it runs"),
)

SERVE_ORDER: tuple[str, ...] = (
    "protocol",
    "linear",
    "residency",
    "retries",
    "timing",
    "apart",
    "metrics",
    "images",
    "multipart",
    "weights",
    "graphs",
    "execution",
    "admission",
    "scorers",
    "client",
    "audit",
    "config",
    "batcher",
    "prefetch",
    "lifecycle",
    "backend",
    "routes",
    "app",
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_imports(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of its first import}: modules of the package by their
    dotted name, third-party ones by the name written (`httpx`, `transformers.trainer`)."""
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
                if target != name and (target in modules or not within(target, (ROOT_PACKAGE,))):
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """The package's own edges only (what cycles are looked for in)."""
    return {
        m: {t: n for t, n in edges.items() if within(t, (ROOT_PACKAGE,))}
        for m, edges in all_imports(root).items()
    }


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    """`module` is one of `prefixes` or inside one of them (a package prefix)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def local(module: str) -> str:
    """`rewardplane.serve.app` -> `serve.app`; the root package (it holds `__version__`) -> ``."""
    return "" if module == ROOT_PACKAGE else module.removeprefix(ROOT_PACKAGE + ".")


def layer_of(module: str) -> str:
    return local(module).split(".")[0] or "core"


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


def arrow_for(
    importer: str, imported: str, internal: bool, arrows: tuple[Arrow, ...] = ARROWS
) -> Arrow | None:
    """The most specific row of `arrows` about this import (local names; `*` matches only the
    package's own modules), or None."""
    rows = [
        a
        for a in arrows
        if within(importer, (a.importer,))
        and ((a.imported == "*" and internal) or within(imported, (a.imported,)))
    ]
    return max(
        rows, key=lambda a: (len(a.importer), -1 if a.imported == "*" else len(a.imported)), default=None
    )


def violations(
    imports: dict[str, dict[str, int]],
    arrows: tuple[Arrow, ...] = ARROWS,
    serve_order: tuple[str, ...] = SERVE_ORDER,
) -> list[str]:
    """Every import against the three tables, one line each, naming the import and the rule."""
    found = []
    for module, edges in sorted(imports.items()):
        for target, line in sorted(edges.items()):
            problem = _problem(module, target, arrows, serve_order)
            if problem:
                found.append(f"{module}:{line} imports {target} ({problem})")
    return found


def _problem(module: str, target: str, arrows: tuple[Arrow, ...], serve_order: tuple[str, ...]) -> str | None:
    internal = within(target, (ROOT_PACKAGE,))
    src, dst = local(module), local(target) if internal else target
    if internal and dst == "":
        return None  # the root package holds only __version__
    arrow = arrow_for(src, dst, internal, arrows)
    if arrow is not None:
        return None if arrow.allowed else f"{arrow.importer} -> {arrow.imported}: {arrow.why}"
    if not internal:
        return None
    a, b = layer_of(module), layer_of(target)
    if a not in RANK or b not in RANK:
        return f"package {a if a not in RANK else b!r} has no layer in LAYERS"
    if RANK[b] > RANK[a]:
        return f"{a} may not import the higher layer {b}"
    return _serve_problem(src, dst, serve_order)


def _serve_problem(src: str, dst: str, serve_order: tuple[str, ...]) -> str | None:
    """An upward arrow between serve's parts (the package's own __init__ stands above them all)."""
    if not (within(src, ("serve",)) and within(dst, ("serve",))):
        return None
    mine, theirs = (src.split(".") + [""])[1], (dst.split(".") + [""])[1]
    if mine == theirs or mine == "" or theirs == "":
        return None
    for part in (mine, theirs):
        if part not in serve_order:
            return f"serve part {part!r} has no place in SERVE_ORDER"
    if serve_order.index(theirs) > serve_order.index(mine):
        return f"upward inside serve: {mine} sits below {theirs} in SERVE_ORDER"
    return None
