"""The MPI driver's capability table and plans (no MPI started: plans only)."""

from __future__ import annotations

import pytest
import torch

import hwdist
from hwdist.drivers.mpi import PY_MPI_BACKEND, _native

pytestmark = pytest.mark.skipif(
    _native(), reason="torch has native MPI here; the table below is the mpi4py one"
)


def test_names():
    drv = hwdist.get_driver("mpi")
    assert drv.torch_name == PY_MPI_BACKEND == "hwdist_mpi"
    assert hwdist.get_driver("hwdist_mpi") is drv  # what get_backend() reports maps back
    assert drv.priority < 0  # never chosen by detection


def test_moves_pass_every_dtype_through():
    drv = hwdist.get_driver("mpi")
    for dtype in (torch.bfloat16, torch.bool, torch.complex128, torch.float16, torch.int16):
        for op in ("all_gather", "broadcast", "all_to_all", "send"):
            assert drv.plan(op, dtype).passthrough


def test_reductions_widen_only_bfloat16():
    drv = hwdist.get_driver("mpi")
    plan = drv.plan("all_reduce", torch.bfloat16, "sum")
    assert (plan.comm_dtype, plan.view) == (torch.float32, False)
    for dtype in (torch.float16, torch.float32, torch.int64, torch.int8, torch.bool, torch.complex64):
        assert drv.plan("all_reduce", dtype, "sum").passthrough
    mean = drv.plan("all_reduce", torch.float32, "mean")
    assert (mean.reduce_op, mean.post.value) == ("sum", "divide")
    for op in ("reduce", "reduce_scatter", "gather", "scatter"):
        assert not drv.plan(op, torch.float32, "sum" if op.startswith("reduce") else None).emulated
