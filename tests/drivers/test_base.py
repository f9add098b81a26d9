"""Every registered driver honours the Driver contract, and plans are never lossy."""

from __future__ import annotations

import ast
import itertools
import json
import pathlib
import re

import pytest
import torch

import hwdist
import hwdist.testing  # noqa: F401  (registers the emulated accelerator)
from hwdist.drivers.base import ALL_OPS, MOVE_OPS, REDUCE_OP_NAMES, REDUCE_OPS, Plan, PlanError, Post

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]

# Value casts that keep every value exactly (the only ones a plan may use).
LOSSLESS = {
    (torch.bool, torch.uint8),
    (torch.bool, torch.int32),
    (torch.bool, torch.int64),
    (torch.uint8, torch.int32),
    (torch.uint8, torch.int64),
    (torch.int8, torch.int32),
    (torch.int8, torch.int64),
    (torch.int16, torch.int32),
    (torch.int16, torch.int64),
    (torch.int32, torch.int64),
    (torch.int32, torch.float64),  # an integer mean's sum where no wider integer reduces
    (torch.float16, torch.float32),
    (torch.float16, torch.float64),
    (torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.float64),
    (torch.float32, torch.float64),
}
# Value casts that keep every value and so their order: exact for MIN and MAX only (a float32 holds
# every integer up to 2**24, a float64 up to 2**53); a sum could leave the exact range.
ORDER_EXACT = {
    *((src, dst) for src in (torch.bool, torch.uint8, torch.int8, torch.int16)
      for dst in (torch.float32, torch.float64)),
    (torch.int32, torch.float64),
}


def all_drivers():
    return [hwdist.get_driver(n) for n in hwdist.list_backends()]


@pytest.mark.parametrize("name", hwdist.list_backends() + ["emu"])
def test_members_and_types(name):
    drv = hwdist.get_driver(name)
    assert isinstance(drv.name, str) and drv.name == name
    assert isinstance(drv.device_type, str) and drv.device_type
    assert isinstance(drv.priority, int)
    assert isinstance(drv.description, str) and drv.description
    assert isinstance(drv.is_available(), bool)
    reason = drv.unavailable_reason()
    assert (reason is None) == drv.is_available()
    assert isinstance(drv.device_count(), int) and drv.device_count() >= 0
    if not drv.is_available():
        assert drv.device_count() in (0, 1)
    assert drv.native_ops <= ALL_OPS
    assert set(drv.reduce_ops) <= set(REDUCE_OP_NAMES) | {"avg"}
    json.dumps(drv.capabilities())  # plain data
    for method in (
        "is_available",
        "unavailable_reason",
        "device_count",
        "set_device",
        "current_device",
        "comm_device",
        "plan",
        "device_id",
    ):
        doc = getattr(type(drv), method).__doc__
        assert doc and doc.strip(), f"{name}.{method} needs a one-line docstring"


@pytest.mark.parametrize("name", hwdist.list_backends() + ["emu"])
def test_every_plan_is_correct_or_a_clear_error(name):
    drv = hwdist.get_driver(name)
    for op, dtype in itertools.product(sorted(ALL_OPS - {"barrier"}), DTYPES):
        rops = REDUCE_OP_NAMES if op in REDUCE_OPS else (None,)
        for rop in rops:
            try:
                plan = drv.plan(op, dtype, rop)
            except PlanError as exc:
                msg = str(exc)
                assert f"backend '{name}'" in msg, msg
                continue
            assert isinstance(plan, Plan)
            assert plan.native_op in drv.native_ops
            comm = plan.comm_dtype
            if op in MOVE_OPS:
                assert drv.dtypes is None or comm in drv.dtypes
                assert plan.reduce_op is None
                if plan.cast:
                    assert plan.view, f"{name}: {op} {dtype} must move bytes, not values"
            else:
                allowed = drv.reduce_dtypes if drv.reduce_dtypes is not None else drv.dtypes
                assert allowed is None or comm in allowed, (name, op, dtype, rop, plan)
                assert plan.reduce_op in drv.reduce_ops or (
                    plan.reduce_op == "avg" and "avg" in drv.reduce_ops
                )
                if plan.cast and not plan.view:
                    exact = LOSSLESS | (ORDER_EXACT if plan.reduce_op in ("min", "max") else set())
                    assert (dtype, comm) in exact, f"{name}: lossy cast {dtype} -> {comm} ({plan.reduce_op})"
                if plan.view:
                    assert dtype.is_complex and comm == (
                        torch.float32 if dtype == torch.complex64 else torch.float64
                    )
                if rop == "mean":
                    assert plan.reduce_op == "avg" or plan.post is Post.DIVIDE
            assert drv.plan(op, dtype, rop) is plan  # cached


def test_specific_rules():
    gloo = hwdist.get_driver("gloo")
    emu = hwdist.get_driver("emu")
    # int16 is not reducible on gloo: widened losslessly
    assert gloo.plan("all_reduce", torch.int16, "sum").comm_dtype == torch.int32
    # int64 cannot be reduced on emu and there is no lossless cast
    with pytest.raises(PlanError, match="no lossless cast exists"):
        emu.plan("all_reduce", torch.int64, "sum")
    # ... but it moves as bytes
    plan = emu.plan("all_gather", torch.int64)
    assert plan.view and plan.comm_dtype == torch.uint8
    # bool on emu: sum -> max (any), product -> min (all) on uint8
    assert emu.plan("all_reduce", torch.bool, "sum").reduce_op == "max"
    assert emu.plan("all_reduce", torch.bool, "product").reduce_op == "min"
    assert emu.plan("all_reduce", torch.bool, "sum").comm_dtype == torch.uint8
    # bf16 reduced as fp32 on emu
    assert emu.plan("all_reduce", torch.bfloat16, "sum").comm_dtype == torch.float32
    # mean without native avg -> sum then divide
    p = emu.plan("all_reduce", torch.float32, "mean")
    assert (p.reduce_op, p.post) == ("sum", Post.DIVIDE)
    # emulations
    assert emu.plan("gather", torch.float32).native_op == "all_gather"
    assert emu.plan("reduce_scatter", torch.float32, "sum").native_op == "all_reduce"
    # bitwise on floats is an error everywhere
    with pytest.raises(PlanError, match="bitwise ops need an integer or bool tensor"):
        gloo.plan("all_reduce", torch.float32, "band")
    with pytest.raises(ValueError, match="unknown reduce op 'avgg'"):
        gloo.plan("all_reduce", torch.float32, "avgg")


LAUNCHER_MODULES = {"launch/mpi.py", "launch/slurm.py", "launch/torchrun.py"}


def test_no_backend_or_device_names_outside_drivers():
    """Dispatch lives in drivers: no backend/device name string constants elsewhere in
    hwdist/ (docstrings may mention names; code may not branch on them)."""
    root = pathlib.Path(hwdist.__file__).parent
    names = re.compile(
        r"(^|[^a-z_])(nccl|hccl|cncl|mccl|xccl|gloo|mpi|npu|mlu|musa|cuda|xpu|mps)([^a-z_-]|$)"
    )
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        # Launcher resolvers (launch/mpi.py, slurm.py, torchrun.py) are named after their
        # launcher, as drivers are after their backend.
        if rel.startswith(("drivers/", "testing/")) or rel in LAUNCHER_MODULES:
            continue
        tree = ast.parse(path.read_text())
        docstrings = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                body = getattr(node, "body", [])
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    docstrings.add(id(body[0].value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if names.search(node.value.lower()):
                    offenders.append(f"hwdist/{rel}:{node.lineno}: {node.value!r}")
    assert not offenders, "backend/device names outside hwdist/drivers/:\n" + "\n".join(offenders)
