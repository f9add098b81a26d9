"""Structure rules checked over the source tree (AST, no import of hwdist needed).

No private imports across modules: a module of hwdist never imports a name starting with ``_`` from
another hwdist module, nor reads ``module._name`` of one. A leading-underscore MODULE (``engine``,
``protocol``, ``_compat``, ...) is a package-internal module: importing the module is fine, and the
names other modules use from it are public (no leading underscore). Private attributes of other
packages (``sys._getframe``, ``torch._C``) are allowed only when listed below with the reason.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hwdist"

#: ``module._name`` of a third-party or standard-library module, with the reason it cannot be avoided.
THIRD_PARTY_ALLOWED = {
    "sys._getframe": "the call site of user code for verification mode's fingerprint (no public API)",
    "sys._current_frames": "the watchdog prints the main thread's stack of a hung rank (no public API)",
    "os._exit": "a hung rank or a failed MPI watchdog must exit without running atexit handlers",
    "torch.distributed.distributed_c10d._new_process_group_helper": (
        "_compat feature-probes the source of torch's group constructor (torch-version quirks live there)"
    ),
    "torch.autograd.Variable._execution_engine": (
        "queue_callback at the end of a backward pass (what torch's own DDP uses; no public API)"
    ),
    "torch._make_per_tensor_quantized_tensor": (
        "rebuilds a quantized tensor from its integer values exactly (no public constructor; torch 2.1-2.15)"
    ),
    "torch._make_per_channel_quantized_tensor": (
        "rebuilds a per-channel quantized tensor from its integer values exactly (no public constructor)"
    ),
    "torch._C._distributed_c10d": (
        "_compat reads torch's own flight recorder (_dump_fr_trace_json, what torch's trace tools read;"
        " no public API), probed by name"
    ),
}

#: Known violations (file under hwdist/, rule), to fix; remove an entry once its file is fixed.
PENDING: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _short(module: str) -> str:
    return module[len("hwdist."):] if module.startswith("hwdist.") else module


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_hwdist_module(name: str) -> bool:
    """Whether ``name`` (dotted) is a module or package of the source tree."""
    if name != "hwdist" and not name.startswith("hwdist."):
        return False
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name of ``from <node.module> import ...`` in ``path``."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _violations(path: Path, text: Optional[str] = None) -> Iterator[str]:
    """Each rule broken by the module at ``path`` (its source: ``text``, else the file's)."""
    tree = ast.parse(path.read_text() if text is None else text, filename=os.fspath(path))
    own = _module_name(path)
    modules: dict[str, str] = {}  # local name -> module it is bound to (hwdist or not)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    modules[head] = head
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(path, node)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if _is_hwdist_module(full):
                    modules[alias.asname or alias.name] = full  # a (package-internal) module: fine
                    continue
                if source.startswith("hwdist") and source != own and _private(alias.name):
                    yield f"import {alias.name} from {_short(source)}"
                elif not source.startswith("hwdist") and _private(alias.name):
                    key = f"{source}.{alias.name}"
                    if key not in THIRD_PARTY_ALLOWED:
                        yield f"import {alias.name} from {source} (third-party private)"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        target = _dotted(node.value, modules)
        if target is None or target == own:
            continue
        full = f"{target}.{node.attr}"
        if _is_hwdist_module(full):
            continue  # a package-internal module reached as an attribute
        if target.startswith("hwdist"):
            yield f"access {_short(full)}"
        elif full not in THIRD_PARTY_ALLOWED:
            yield f"access {full} (third-party private)"


def _dotted(node: ast.expr, modules: dict[str, str]) -> Optional[str]:
    """The module an expression such as ``_t`` or ``torch.distributed`` names, if it names one."""
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, modules)
        if base is None:
            return None
        full = f"{base}.{node.attr}"
        if base.startswith("hwdist"):
            return full if _is_hwdist_module(full) else None
        return full if not _private(node.attr) else None
    return None


def _all_violations() -> set[tuple[str, str]]:
    return {(str(p.relative_to(PACKAGE)), v) for p in _sources() for v in _violations(p)}


def test_no_private_names_across_modules() -> None:
    found = _all_violations()
    new = sorted(found - PENDING)
    assert not new, "private names used across modules:\n" + "\n".join(f"{f}: {v}" for f, v in new)


def test_pending_list_is_current() -> None:
    """A fixed violation leaves the pending list (so the list only shrinks)."""
    stale = sorted(PENDING - _all_violations())
    assert not stale, f"fixed, remove from PENDING: {stale}"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from .collectives.tensor import _helper\n", ["import _helper from collectives.tensor"]),
        ("from .collectives import tensor as _t\n_t._divide(1, 2)\n", ["access collectives.tensor._divide"]),
        ("from .collectives import verify\nverify._enabled\n", ["access collectives.verify._enabled"]),
        ("from .collectives import engine\n_engine.view(None)\n", []),  # a private module, public name
        ("from ._compat import DIST_AVAILABLE\n", []),
        ("import torch\ntorch._C\n", ["access torch._C (third-party private)"]),
        ("import sys\nsys._getframe(1)\n", []),
        ("x = object()\nx._private\n", []),  # not a module: an object's own business
    ],
)
def test_checker_sees_what_it_should(source: str, expected: list[str]) -> None:
    """The checker itself: each rule fires on a sample and stays quiet on the allowed forms."""
    probe = PACKAGE / "probe.py"  # a module hwdist.probe (not written: the source is passed in)
    assert list(_violations(probe, source)) == expected


def test_verification_mode_is_read_only_by_verify() -> None:
    """Verification mode is the engine's hook: no collective reads the mode's flag itself."""
    readers = sorted(
        str(p.relative_to(PACKAGE))
        for p in _sources()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.Name, ast.Attribute, ast.alias, ast.FunctionDef))
        and (getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None))
        == "verification_enabled"
    )
    assert "collectives/verify.py" in readers  # the scan sees the definition
    assert set(readers) <= {"collectives/verify.py", "__init__.py"}, readers  # __init__: the public re-export
