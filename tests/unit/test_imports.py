"""The package's import graph, built from the source: no cycles, no private module reached from outside.

Nodes are hwdist's parts: each subpackage (``hwdist.collectives``, ``hwdist.launch``,
...) and each top-level module (``hwdist.registry``, ``hwdist.info``, ...). An
arrow is any import, at module level or inside a function: an import deferred
into a function still makes the importing part depend on the imported one, so it
counts. The rules:

* the graph of parts has no cycle (a reader can order the parts bottom-up);
* a private module of a subpackage (``hwdist.collectives.transport``) is
  imported only from inside that subpackage; other parts use the subpackage's
  public modules. The private modules of the top package (``hwdist._compat``,
  ``hwdist._state``, ``hwdist._plugins``) serve every part.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hwdist"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _target(name: str) -> Optional[str]:
    """The hwdist module ``name`` lives in (``hwdist.x.y.func`` -> ``hwdist.x.y``), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every hwdist module ``module`` imports, at any depth of its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        for name in names:
            target = _target(name) if name.startswith("hwdist") else None
            if target and target != module:
                found.add(target)
    return found


def part_of(module: str) -> str:
    """``hwdist.collectives.engine`` -> ``hwdist.collectives``; ``hwdist.info`` -> ``hwdist.info``."""
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def part_graph() -> dict[str, dict[str, set[tuple[str, str]]]]:
    """part -> part -> the (module, module) imports behind that arrow."""
    graph: dict[str, dict[str, set[tuple[str, str]]]] = defaultdict(lambda: defaultdict(set))
    for module in MODULES:
        for target in imports_of(module):
            a, b = part_of(module), part_of(target)
            if a != b and b != "hwdist":
                graph[a][b].add((module, target))
    return graph


def cycles(graph: dict[str, dict[str, set[tuple[str, str]]]]) -> list[list[str]]:
    """The strongly connected components of more than one part (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_the_parts_of_the_package_import_without_a_cycle() -> None:
    graph = part_graph()
    problems = []
    for comp in cycles(graph):
        arrows = [
            f"    {a} -> {b}: " + ", ".join(sorted(f"{x} imports {y}" for x, y in graph[a][b]))
            for a in comp
            for b in sorted(graph[a])
            if b in comp
        ]
        problems.append(" <-> ".join(comp) + "\n" + "\n".join(arrows))
    assert not problems, "import cycles between parts of hwdist:\n" + "\n".join(problems)


def test_private_modules_of_a_subpackage_stay_inside_it() -> None:
    crossing = []
    for module in MODULES:
        for target in imports_of(module):
            parts = target.split(".")
            private = any(p.startswith("_") and not p.startswith("__") for p in parts[2:])
            if len(parts) > 2 and private and part_of(module) != part_of(target):
                crossing.append(f"{module} imports {target}")
    assert not crossing, "private modules reached from another part:\n  " + "\n  ".join(sorted(crossing))


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b": {("a", "b")}}, "b": {"a": {("b", "a")}}}, [["a", "b"]]),
        ({"a": {"b": {("a", "b")}}, "b": {"c": {("b", "c")}}}, []),
        ({"a": {"b": set()}, "b": {"c": set()}, "c": {"a": set()}, "d": {"a": set()}}, [["a", "b", "c"]]),
    ],
)
def test_the_cycle_finder_sees_what_it_should(graph, expected) -> None:
    assert cycles(graph) == expected


def test_deferred_imports_count() -> None:
    """An import inside a function is an arrow too: ``hwdist.cli`` defers some, and they are seen."""
    assert imports_of("hwdist.registry") >= {"hwdist.errors"}
    assert any(part_of(t) == "hwdist.collectives" for m in MODULES for t in imports_of(m) if m == "hwdist")
