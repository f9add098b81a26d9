"""The package's import graph, built from the source: no cycles, no private module reached from outside.

Two graphs. In the graph of modules every module and package ``__init__`` is a
node; in the graph of parts the nodes are hwdist's parts: each subpackage
(``hwdist.collectives``, ``hwdist.launch``, ...) and each top-level module
(``hwdist.registry``, ``hwdist.info``, ...). An arrow is any import that can
run, at module level or inside a function: an import deferred into a function
still makes the importing module depend on the imported one, so it counts.
Imports under ``if TYPE_CHECKING:`` never run (they exist for the type checker)
and are not arrows. The rules:

* neither graph has a cycle (a reader can order the modules, and the parts,
  bottom-up);
* ``hwdist.serialization`` imports nothing of ``hwdist.collectives``, directly
  or through another module: the collectives use serialization, never the
  reverse;
* a private module of a subpackage (``hwdist.collectives._strategies``) is
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


def _type_checking_only(tree: ast.Module) -> set[int]:
    """``id`` of every node under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = getattr(test, "id", None) or getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(module: str, source: Optional[str] = None) -> set[str]:
    """Every hwdist module ``module`` imports, at any depth of its source (``source``, else the file's)."""
    path = MODULES.get(module, PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text() if source is None else source)
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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


def module_graph() -> dict[str, dict[str, set[tuple[str, str]]]]:
    """module -> module it imports -> that one arrow (the shape ``cycles`` and the report take)."""
    graph: dict[str, dict[str, set[tuple[str, str]]]] = defaultdict(lambda: defaultdict(set))
    for module in MODULES:
        for target in imports_of(module):
            graph[module][target].add((module, target))
    return graph


def reachable(graph: dict[str, dict[str, set[tuple[str, str]]]], start: str) -> set[str]:
    """Every node an arrow path leads to from ``start``."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), {}):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _report(graph: dict[str, dict[str, set[tuple[str, str]]]], comps: list[list[str]]) -> list[str]:
    problems = []
    for comp in comps:
        arrows = [
            f"    {a} -> {b}: " + ", ".join(sorted(f"{x} imports {y}" for x, y in graph[a][b]))
            for a in comp
            for b in sorted(graph[a])
            if b in comp
        ]
        problems.append(" <-> ".join(comp) + "\n" + "\n".join(arrows))
    return problems


def test_the_modules_of_the_package_import_without_a_cycle() -> None:
    graph = module_graph()
    found = cycles(graph)
    assert not found, "import cycles between modules of hwdist:\n" + "\n".join(_report(graph, found))


def test_serialization_never_imports_the_collectives() -> None:
    """Imports go one way: the collectives use hwdist.serialization; serialization reaches no collective."""
    graph = module_graph()
    ours = [m for m in MODULES if part_of(m) == "hwdist.serialization"]
    assert "hwdist.serialization.restricted.loader" in ours  # the scan sees the restricted loader
    coll = "hwdist.collectives"
    direct = sorted(f"{m} imports {t}" for m in ours for t in imports_of(m) if part_of(t) == coll)
    assert not direct, "serialization imports the collectives:\n  " + "\n  ".join(direct)
    through = sorted(f"{m} reaches {t}" for m in ours for t in reachable(graph, m) if part_of(t) == coll)
    assert not through, "serialization reaches the collectives through others:\n  " + "\n  ".join(through)
    # and the collectives do use it (so the rule above is about a real arrow)
    users = [m for m in MODULES if part_of(m) == coll]
    assert any(part_of(t) == "hwdist.serialization" for m in users for t in imports_of(m))


def test_the_parts_of_the_package_import_without_a_cycle() -> None:
    graph = part_graph()
    problems = _report(graph, cycles(graph))
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


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f():\n    from .collectives import engine\n", {"hwdist.collectives.engine"}),  # lazy: counted
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .collectives import engine\n", set()),
        (
            "import typing\nif typing.TYPE_CHECKING:\n    from . import registry\n"
            "else:\n    from . import info\n",
            {"hwdist.info"},
        ),
        ("from .serialization.restricted import loader\n", {"hwdist.serialization.restricted.loader"}),
        ("from .serialization import encode\n", {"hwdist.serialization"}),  # a name of the package's __init__
    ],
)
def test_imports_of_sees_what_it_should(source: str, expected: set[str]) -> None:
    """The scanner itself, on sources of a module ``hwdist.probe`` (not written: the source is passed in)."""
    assert imports_of("hwdist.probe", source) == expected


def test_a_cycle_through_a_deferred_import_is_found() -> None:
    """A module graph with a function-level arrow back closes a cycle, and the report names both imports."""
    fr, obj = "hwdist.serialization.frames", "hwdist.collectives.objects"
    graph = {fr: {obj: {(fr, obj)}}, obj: {fr: {(obj, fr)}}}
    (comp,) = cycles(graph)
    (text,) = _report(graph, [comp])
    assert f"{fr} imports {obj}" in text and f"{obj} imports {fr}" in text
    assert reachable(graph, "hwdist.serialization.frames") == set(graph)


# ---- the public surface ---------------------------------------------------------------------------

#: The public functions of mmengine.dist.utils and mmengine.dist.dist (mmengine 0.10.7, read from its
#: source) with their parameters; every one ports by name, its parameters leading hwdist's.
MMENGINE_UTILS = {
    "is_distributed": "",
    "get_local_group": "",
    "get_default_group": "",
    "infer_launcher": "",
    "init_dist": "launcher, backend, init_backend, **kwargs",
    "init_local_group": "node_rank, num_gpus_per_node",
    "get_backend": "group",
    "get_world_size": "group",
    "get_rank": "group",
    "get_local_size": "",
    "get_local_rank": "",
    "get_dist_info": "group",
    "is_main_process": "group",
    "master_only": "func",
    "barrier": "group",
    "get_data_device": "data",
    "get_comm_device": "group",
    "cast_data_device": "data, device, out",
}
MMENGINE_DIST = {
    "all_reduce": "data, op, group",
    "all_gather": "data, group",
    "gather": "data, dst, group",
    "broadcast": "data, src, group",
    "sync_random_seed": "group",
    "broadcast_object_list": "data, src, group",
    "all_reduce_dict": "data, op, group",
    "all_gather_object": "data, group",
    "gather_object": "data, dst, group",
    "collect_results": "results, size, device, tmpdir",
    "collect_results_cpu": "result_part, size, tmpdir",
    "collect_results_gpu": "result_part, size",
    "all_reduce_params": "params, coalesce, bucket_size_mb, op, group",
}
#: hwdist's core beside mmengine's names: the registry, drivers, detection, the error root, verification.
CORE = {
    "register_backend",
    "unregister_backend",
    "get_driver",
    "list_backends",
    "available_backends",
    "resolve",
    "Driver",
    "Plan",
    "PlanError",
    "detect",
    "Detection",
    "get_device",
    "init_dist",
    "HwdistError",
    "CollectiveMismatch",
    "verification",
    "set_verification",
    "verification_enabled",
}
#: torch.distributed's collectives that mmengine does not wrap (the rest of a drop-in's surface).
TORCH_COLLECTIVES = {"reduce", "scatter", "reduce_scatter", "all_to_all", "send", "recv", "isend", "irecv",
                     "scatter_object_list"}  # fmt: skip
#: Where the names that left hwdist.__all__ live now (each is still an attribute of hwdist).
HOMES = (
    "hwdist.serialization",
    "hwdist.errors",
    "hwdist.launch",
    "hwdist.training",
    "hwdist.flight",
    "hwdist.info",
    "hwdist.compat.vis4d",
    "hwdist.collectives.tensor",
    "hwdist.collectives.objects",
    "hwdist.collectives.results",
)
#: hwdist.__all__ before it was cut to mmengine's names plus the core (the object-path switch, withdrawn
#: with the native object path, is not listed).
EARLIER_SURFACE = (
    "BackendError dump_flight_record rank_zero_only init_backend destroy new_group Launcher LaunchInfo"
    " LauncherError register_launcher unregister_launcher get_launcher list_launchers LEGACY_BACKEND_IDS"
    " reduce_mean pad_to_largest_tensor CollectiveHandle broadcast_object ObjectCollectiveError"
    " SerializationError WeightsOnlyRefused CollectiveArgumentError PeerFailure Serializer PickleSerializer"
    " RestrictedPickleSerializer RestrictedUnpickler UnpicklingRefused get_serializer set_serializer"
    " use_serializer register_safe_class safe_globals restricted_loads object_to_tensor tensor_to_object"
    " obj2tensor tensor2obj create_tmpdir GradientSynchronizer sync_grad broadcast_tensors bcast_list_"
    " sync_buffer average_metrics synchronized synchronize check_fork_safe is_module_wrapper rank world_size"
).split()


def _params(fn) -> str:
    import inspect

    kinds = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return ", ".join(kinds.get(p.kind, "") + p.name for p in inspect.signature(fn).parameters.values())


def test_the_top_level_surface_is_mmengines_names_torchs_collectives_and_the_core() -> None:
    import hwdist

    names = hwdist.__all__
    assert len(names) <= 60 and len(set(names)) == len(names), len(names)
    assert set(names) == set(MMENGINE_UTILS) | set(MMENGINE_DIST) | TORCH_COLLECTIVES | CORE
    assert len(set(MMENGINE_UTILS) | set(MMENGINE_DIST)) == 31
    missing = [n for n in names if not hasattr(hwdist, n)]
    assert not missing, missing


@pytest.mark.parametrize("module, table", [("utils", MMENGINE_UTILS), ("dist", MMENGINE_DIST)])
def test_every_name_of_mmengine_dist_utils_and_dist_ports_by_name(module: str, table: dict) -> None:
    """``from mmengine.dist.utils import master_only`` -> ``from hwdist.utils import master_only``."""
    import importlib

    import hwdist

    ours = importlib.import_module(f"hwdist.{module}")
    assert ours.__all__ == list(table)  # mmengine's order
    for name, params in table.items():
        fn = getattr(ours, name)
        assert fn is getattr(hwdist, name), name  # the same function as the top level's
        got = _params(fn)
        assert got == params or got.startswith(params + ", ") or not params, (name, got, params)
    try:
        theirs = importlib.import_module(f"mmengine.dist.{module}")
    except ImportError:
        return  # mmengine is not installed: the table above is its 0.10.7 source
    live = {
        n for n, v in vars(theirs).items() if callable(v) and getattr(v, "__module__", "") == theirs.__name__
    }
    live = {n for n in live if not n.startswith("_")}
    assert live <= set(ours.__all__), sorted(live - set(ours.__all__))


def test_names_that_left_all_stay_attributes_of_hwdist_and_have_a_home() -> None:
    import importlib

    import hwdist

    homes = [importlib.import_module(m) for m in HOMES]
    for name in EARLIER_SURFACE:
        assert name not in hwdist.__all__, name
        obj = getattr(hwdist, name)
        home = next((m for m in homes if name in m.__all__ and getattr(m, name) is obj), None)
        assert home is not None, f"hwdist.{name} is in no home's __all__"
    # mmengine.dist.dist imports these from its utils module; hwdist.dist has them as attributes too
    assert hwdist.dist.get_rank is hwdist.get_rank and hwdist.dist.barrier is hwdist.barrier
