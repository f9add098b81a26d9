"""Capability plans, reduce-op names, flat buffers and non-distributed semantics (one process).

Plans are computed from the drivers' capability tables alone (no device, no
process group), so NCCL and HCCL plans are checked here without hardware.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist

import hwdist
from hwdist import _compat
from hwdist.collectives import tensor as T
from hwdist.collectives.params import (
    FlatLayout,
    bucket_tensors,
    copy_from_flat,
    flatten_tensors,
    unflatten_tensors,
)
from hwdist.drivers.base import Post
from hwdist.testing import EmulatedDriver
from hwdist.drivers.mpi import PY_MPI_BACKEND, _native

R = tdist.ReduceOp


@pytest.fixture
def gloo():
    return hwdist.get_driver("gloo")


@pytest.fixture
def emu():
    return EmulatedDriver()


# ---------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------
def test_gloo_plans(gloo):
    p = gloo.plan("all_reduce", torch.float32, "sum")
    assert p.passthrough and p.reduce_op == "sum"
    p = gloo.plan("all_reduce", torch.float32, "mean")  # no native avg declared: SUM / n
    assert (p.reduce_op, p.post, p.comm_dtype) == ("sum", Post.DIVIDE, torch.float32)
    p = gloo.plan("all_reduce", torch.int16, "sum")  # gloo has no int16: lossless widening
    assert (p.comm_dtype, p.view) == (torch.int32, False)
    p = gloo.plan("all_gather", torch.int16)  # moving needs no widening: a byte view
    assert p.view and p.comm_dtype == torch.uint8
    assert gloo.plan("broadcast", torch.float16).passthrough


def test_gloo_plans_follow_the_torch_version(gloo):
    # Measured on torch's gloo (docs/hardware.md, "Versions"); the version, not the _compat flag, is the spec
    # here.
    version = _compat.TORCH_VERSION
    bf = gloo.plan("broadcast", torch.bfloat16)
    assert bf.passthrough if version >= (2, 2) else (bf.view and bf.comm_dtype == torch.uint8)
    p = gloo.plan("all_reduce", torch.bfloat16, "sum")  # 2.1: widened to float32
    assert p.comm_dtype == (torch.bfloat16 if version >= (2, 2) else torch.float32)
    # reduce_scatter sums whatever the op before 2.9 (wrong values): emulated with all_reduce there
    assert gloo.plan("reduce_scatter", torch.float32, "max").native_op == (
        "reduce_scatter" if version >= (2, 9) else "all_reduce"
    )
    assert gloo.plan("all_to_all", torch.float32).native_op == (
        "all_to_all" if version >= (2, 12) else "all_gather"
    )
    assert ("all_gather" in gloo.flat_ops) == (version >= (2, 2))
    assert ("reduce_scatter" in gloo.flat_ops) == (version >= (2, 9))  # the tensor form, as the list form
    assert "all_to_all" in gloo.flat_ops  # all_to_all_single works on every version
    # the emulated accelerator wraps a gloo group: the same flat all_gather, or none (and no all_to_all;
    # no reduce_scatter at all)
    assert hwdist.get_driver("emu").flat_ops == gloo.flat_ops - {"all_to_all", "reduce_scatter"}
    # gloo has no complex type: hwdist moves bytes and reduces real pairs on every version
    assert (
        gloo.plan("gather", torch.complex64).comm_dtype,
        gloo.plan("all_reduce", torch.complex64).comm_dtype,
    ) == (
        torch.uint8,
        torch.float32,
    )


def test_emulated_accelerator_plans(emu):
    with pytest.raises(hwdist.PlanError, match="cannot reduce int64 and no lossless cast"):
        emu.plan("all_reduce", torch.int64, "sum")
    p = emu.plan("all_gather", torch.int64)
    assert p.view and p.comm_dtype == torch.uint8 and not p.emulated
    p = emu.plan("all_reduce", torch.bfloat16, "sum")
    assert (p.comm_dtype, p.view) == (torch.float32, False)
    p = emu.plan("all_reduce", torch.bool, "sum")  # any(): MAX on uint8
    assert (p.comm_dtype, p.reduce_op) == (torch.uint8, "max")
    p = emu.plan("all_reduce", torch.complex64, "sum")
    assert (p.comm_dtype, p.view) == (torch.float32, True)
    assert {
        op: emu.plan(op, torch.float32, "sum" if op == "reduce_scatter" else None).native_op
        for op in ("gather", "scatter", "reduce_scatter", "all_to_all")
    } == {
        "gather": "all_gather",
        "scatter": "broadcast",
        "reduce_scatter": "all_reduce",
        "all_to_all": "all_gather",
    }
    with pytest.raises(hwdist.PlanError, match="reduce op not supported"):
        emu.plan("all_reduce", torch.int32, "band")
    with pytest.raises(hwdist.PlanError, match="bitwise ops need an integer"):
        emu.plan("all_reduce", torch.float32, "bor")


def test_accelerator_plans_without_hardware():
    nccl, hccl = hwdist.get_driver("nccl"), hwdist.get_driver("hccl")
    assert nccl.plan("all_reduce", torch.float16, "mean").reduce_op == "avg"  # native AVG on floats
    p = nccl.plan("all_reduce", torch.int32, "mean")
    assert (p.reduce_op, p.post) == ("sum", Post.DIVIDE)
    assert hccl.plan("gather", torch.float32).native_op == "all_gather"


def test_integer_mean_sums_in_a_wider_integer(gloo, emu):
    p = gloo.plan("all_reduce", torch.int8, "mean")
    assert (p.comm_dtype, p.reduce_op, p.post, p.dtype) == (torch.int64, "sum", Post.DIVIDE, torch.int8)
    p = emu.plan("all_reduce", torch.uint8, "mean")  # emu has no int64: int32 is the widest
    assert p.comm_dtype == torch.int32
    with pytest.raises(hwdist.PlanError):
        gloo.plan("all_reduce", torch.bool, "mean")
    assert gloo.plan("all_reduce", torch.float32, "mean").comm_dtype == torch.float32


def test_reduce_op_names():
    for name in T.REDUCE_OP_NAMES:
        assert T.normalize_reduce_op(name) == name
        assert T.normalize_reduce_op(name.upper()) == name
    assert T.normalize_reduce_op("Mean") == "mean"
    assert T.normalize_reduce_op(R.SUM) == "sum"
    assert T.normalize_reduce_op(R.AVG) == "mean"
    assert T.normalize_reduce_op(R.BXOR) == "bxor"
    assert T.normalize_reduce_op(R(R.MAX)) == "max"  # a ReduceOp instance
    with pytest.raises(ValueError, match=r"op must be one of 'sum', 'mean'.*got 'avg2'"):
        T.normalize_reduce_op("avg2")
    with pytest.raises(ValueError, match="reduce_op must be one of.*got None"):
        T.normalize_reduce_op(None, "reduce_op")


def test_legacy_backend_name_is_a_clear_error():
    with pytest.raises(hwdist.BackendError, match="'tcp' backend was removed.*use 'gloo'"):
        hwdist.get_driver("tcp")


# ---------------------------------------------------------------------------
# non-distributed semantics (mmengine's no-ops)
# ---------------------------------------------------------------------------
@pytest.fixture
def single():
    if tdist.is_initialized():
        pytest.skip("a process group exists in the test process")


def test_non_distributed_semantics(single):
    t = torch.arange(3)
    hwdist.all_reduce(t, "mean")
    assert t.tolist() == [0, 1, 2]
    assert hwdist.all_gather(t)[0] is t and len(hwdist.all_gather(t)) == 1
    assert hwdist.gather(t, dst=0)[0] is t
    hwdist.broadcast(t, src=0)
    hwdist.reduce(t, dst=0, op="max")
    assert t.tolist() == [0, 1, 2]
    assert hwdist.all_reduce(t, async_op=True).wait() is None
    assert hwdist.all_gather(t, async_op=True).wait() == [t]
    out = torch.zeros(2)
    hwdist.scatter(out, [torch.ones(2)])
    assert out.tolist() == [1.0, 1.0]
    hwdist.reduce_scatter(out, [torch.full((2,), 3.0)])
    assert out.tolist() == [3.0, 3.0]
    outs = [torch.zeros(2)]
    hwdist.all_to_all(outs, [torch.full((2,), 4.0)])
    assert outs[0].tolist() == [4.0, 4.0]
    seed = hwdist.sync_random_seed()
    assert isinstance(seed, int) and 0 <= seed < 2**31
    assert hwdist.reduce_mean(t) is t
    sizes, padded = hwdist.pad_to_largest_tensor(torch.ones(2, 2))
    assert sizes == [4] and padded.shape == (4,)
    d = {"a": torch.ones(1)}
    hwdist.all_reduce_dict(d)
    assert d["a"].tolist() == [1.0]
    gen = (p for p in [torch.ones(1)])
    hwdist.all_reduce_params(gen)
    assert next(gen, None) is None  # consumed, nothing changed
    with pytest.raises(RuntimeError, match="send needs a process group"):
        hwdist.send(t, 1)
    with pytest.raises(ValueError, match="op must be one of"):
        hwdist.all_reduce(t, "nope")  # bad input is reported even without a process group
    with pytest.raises(TypeError, match="data must be a torch.Tensor"):
        hwdist.broadcast([1, 2])


def test_public_names_are_exported():
    for name in (
        "all_reduce all_gather gather broadcast reduce scatter reduce_scatter all_to_all send recv isend"
        " irecv"
        " sync_random_seed reduce_mean pad_to_largest_tensor all_reduce_dict all_reduce_params"
    ).split():
        assert callable(getattr(hwdist, name)), name


# ---------------------------------------------------------------------------
# flat buffers
# ---------------------------------------------------------------------------
def test_flatten_roundtrip_any_shape():
    nc = torch.arange(6.0).reshape(2, 3).t()
    tensors = [torch.tensor(5.0), torch.ones(2, 3), nc, torch.empty(0)]
    flat, layout = flatten_tensors(tensors)
    assert flat.shape == (1 + 6 + 6,) and layout.offsets == (0, 1, 7, 13) and layout.total == 13
    views = unflatten_tensors(flat, layout)
    assert [v.shape for v in views] == [t.shape for t in tensors]
    assert all(torch.equal(v, t) for v, t in zip(views, tensors))
    targets = [torch.zeros_like(t) for t in tensors]
    copy_from_flat(flat * 2, targets, layout)
    assert all(torch.equal(a, b * 2) for a, b in zip(targets, tensors))


def test_flatten_casts_and_refuses_mixed_dtypes_without_a_target():
    a, b = torch.tensor([1.5], dtype=torch.bfloat16), torch.tensor([2.0])
    with pytest.raises(TypeError, match="several dtypes"):
        flatten_tensors([a, b])
    flat, layout = flatten_tensors([a, b], dtype=torch.float64)
    assert flat.dtype == torch.float64 and flat.tolist() == [1.5, 2.0]
    assert layout.dtypes == (torch.bfloat16, torch.float32)
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
    copy_from_flat(flat[:1] + 1, [p])  # layout defaults to the targets'; requires_grad is fine
    assert p.item() == 2.5
    with pytest.raises(ValueError, match="must be 1-D with 2 elements"):
        unflatten_tensors(torch.zeros(3), layout)
    assert FlatLayout.of([]).total == 0 and flatten_tensors([])[0].numel() == 0


def test_bucket_tensors():
    f, i = torch.ones(4), torch.ones(4, dtype=torch.int64)  # 16 and 32 bytes
    assert bucket_tensors([f, i, f, i, f]) == [[0, 2, 4], [1, 3]]
    assert bucket_tensors([f, f, f, i], bucket_bytes=32) == [[0, 1], [2], [3]]
    assert bucket_tensors([torch.ones(100), f], bucket_bytes=8) == [[0], [1]]  # too big: alone
    assert bucket_tensors([]) == []


# ---------------------------------------------------------------------------
# capabilities as data, the pure planner, tuning
# ---------------------------------------------------------------------------


def test_capabilities_are_frozen_data_the_planner_alone_reads(gloo, emu):
    from dataclasses import FrozenInstanceError

    from hwdist.drivers.base import Capabilities, plan

    caps = emu.caps
    assert isinstance(caps, Capabilities) and hash(caps) == hash(emu.caps)
    with pytest.raises(FrozenInstanceError):
        caps.dtypes = None  # type: ignore[misc]
    # The planner is a function of the capabilities only: an equal table built by hand plans the same.
    twin = Capabilities(
        backend="emu",
        native_ops=caps.native_ops,
        flat_ops=caps.flat_ops,
        reduce_ops=caps.reduce_ops,
        dtypes=caps.dtypes,
        native_object_collectives=False,
    )
    assert twin == caps
    for args in (
        ("all_reduce", torch.bfloat16, "mean"),
        ("all_gather", torch.int64, None),
        ("gather", torch.float32, None),
    ):
        assert plan(twin, *args) is plan(caps, *args) == emu.plan(*args)  # cached once per argument tuple
    with pytest.raises(hwdist.PlanError, match="with backend 'emu'"):
        plan(twin, "all_reduce", torch.int64, "sum")
    assert gloo.capabilities() == gloo.caps.as_dict()


def test_a_subclass_declaration_becomes_its_capabilities():
    from hwdist.drivers.base import Driver

    class Small(Driver):
        device_type = "cpu"
        dtypes = frozenset({torch.float32, torch.int32})
        reduce_ops = frozenset({"sum", "max"})

    drv = Small()
    drv.name = "small"
    assert drv.caps.dtypes == frozenset({torch.float32, torch.int32}) and drv.caps.backend == "small"
    assert drv.plan("all_reduce", torch.float16, "sum").comm_dtype == torch.float32
    assert drv.plan("all_reduce", torch.float16, "sum") is drv.plan("all_reduce", torch.float16, "sum")
    drv.name = "renamed"  # registration renames: the messages follow
    with pytest.raises(hwdist.PlanError, match="backend 'renamed'"):
        drv.plan("all_reduce", torch.float32, "product")


def test_mpi_table_is_computed_not_property_overridden():
    from hwdist.drivers.mpi import PY_MPI_BACKEND, MpiDriver, _native

    for attr in ("native_ops", "dtypes", "reduce_dtypes", "torch_name", "aliases", "process_group_factory"):
        assert not isinstance(MpiDriver.__dict__.get(attr), property), attr
    drv = hwdist.get_driver("mpi")
    assert drv.caps.dtypes == (drv.dtypes if _native() else None)
    assert drv.torch_name == ("mpi" if _native() else PY_MPI_BACKEND)
    assert (drv.process_group_factory is None) == _native()


def test_tuning_is_a_table_outside_the_driver(gloo, emu):
    from hwdist.drivers import tuning
    from hwdist.drivers.base import Driver

    assert "pack_max_bytes" not in vars(type(gloo))
    assert tuning.tuning(gloo) == tuning.Tuning(
        pack_max_bytes=1 << 20, gather_by_broadcast_min_bytes=12 << 20
    )
    assert tuning.gather_by_broadcast_floor() == 12 << 20
    assert tuning.tuning(hwdist.get_driver("mpi")).pack_max_bytes == 1 << 20
    assert tuning.tuning(emu) == tuning.DEFAULT == tuning.Tuning()
    # the knobs are not driver interface
    assert not hasattr(Driver, "pack_max_bytes")
    old = tuning.set_tuning("emu", tuning.Tuning(pack_max_bytes=7))
    try:
        assert tuning.tuning(emu).pack_max_bytes == 7
    finally:
        tuning.TUNING.pop("emu")
    assert old == tuning.DEFAULT
    with pytest.raises(TypeError, match="must be a hwdist.drivers.tuning.Tuning"):
        tuning.set_tuning("emu", 1 << 20)  # type: ignore[arg-type]


# ---------- the MPI driver's plans ----------
# The MPI driver's capability table and plans (no MPI started: plans only).


# The marks of this section's tests (slow ones are skipped by the fast lane, -m 'not slow').
_LAUNCH_MPI_DRIVER_MARKS = pytest.mark.skipif(
    _native(), reason="torch has native MPI here; the table below is the mpi4py one"
)


@_LAUNCH_MPI_DRIVER_MARKS
def test_names():
    drv = hwdist.get_driver("mpi")
    assert drv.torch_name == PY_MPI_BACKEND == "hwdist_mpi"
    assert hwdist.get_driver("hwdist_mpi") is drv  # what get_backend() reports maps back
    assert drv.priority < 0  # never chosen by detection


@_LAUNCH_MPI_DRIVER_MARKS
def test_moves_pass_every_dtype_through():
    drv = hwdist.get_driver("mpi")
    for dtype in (torch.bfloat16, torch.bool, torch.complex128, torch.float16, torch.int16):
        for op in ("all_gather", "broadcast", "all_to_all", "send"):
            assert drv.plan(op, dtype).passthrough


@_LAUNCH_MPI_DRIVER_MARKS
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
