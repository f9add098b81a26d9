"""Facts keyed by what decides them: the chip, the library version, the NCCL engine.

The run-time probes read torch_npu's SoC version and the oneCCL version. No NPU or XPU is
here: where a probe needs one, a test-only stand-in module answers as the vendor's would
(each test says so); the real code path is the driver's own, and with no answer the table
is the conservative one.
"""

from __future__ import annotations

import itertools
import types

import pytest
import torch

import hwdist
from hwdist import _compat
from hwdist.drivers import _probes, _vendor_caps
from hwdist.drivers._vendor_caps import CONDITIONS, ENGINE_FACTS, FACTS, table
from hwdist.drivers.base import ALL_OPS, REDUCE_OPS, PlanError
from hwdist.drivers.nccl import ENGINES, NcclDriver
from hwdist.drivers.vendors import HcclDriver, XcclDriver

INTS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---- xccl: oneCCL's integer MIN/MAX ---------------------------------------------------------------


@pytest.mark.parametrize("rop", ["min", "max"])
@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_xccl_never_hands_oneccl_an_integer_min_or_max(op: str, rop: str) -> None:
    """oneCCL returns integer MIN/MAX as SUM (sglang/issues/31011, torch-xpu-ops/issues/3059): every
    integer dtype goes through a float that holds its values, or is refused; floats pass through."""
    drv = hwdist.get_driver("xccl")
    for dtype in INTS:
        try:
            found = drv.plan(op, dtype, rop)
        except PlanError as exc:
            assert dtype == torch.int64 and "wrongly (declared inexact)" in str(exc) and "HINT" in str(exc)
            continue
        assert found.comm_dtype.is_floating_point and not found.view, (dtype, found)
        # float32 holds every value of a 16-bit integer (24-bit significand); int32 needs float64
        assert found.comm_dtype == torch.float64 or dtype not in (torch.int32, torch.int64), (dtype, found)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert drv.plan(op, dtype, rop).passthrough
    assert drv.plan(op, torch.int32, "sum").passthrough  # SUM itself is right


def test_xccl_known_good_oneccl_lifts_the_emulation(monkeypatch):
    """A oneCCL release the conformance run found right (none yet) gets the native integer MIN/MAX.
    The version answer comes from a test-only stand-in for the probe: this machine has no XPU."""
    assert _vendor_caps.ONECCL_KNOWN_GOOD == frozenset()  # no release is known good today
    monkeypatch.setattr(_vendor_caps, "ONECCL_KNOWN_GOOD", frozenset({"2099.1.0"}))
    good, bad = XcclDriver(), XcclDriver()  # type: ignore[abstract]
    good.name = bad.name = "xccl"
    good.probes = {"oneccl": lambda: "2099.1.0"}
    bad.probes = {"oneccl": lambda: "2021.17.2"}
    assert good.plan("all_reduce", torch.int64, "max").passthrough
    with pytest.raises(PlanError, match="declared inexact"):
        bad.plan("all_reduce", torch.int64, "max")
    assert good.details()["probed"] == {"oneccl": "2099.1.0"}


def test_xccl_avg_stays_emulated_on_every_oneccl():
    """AVG is native from oneCCL 2021.15 (XCCL_HAS_AVG) but divides twice on small tensors on Arc Pro B60
    (torch-xpu-ops/issues/3020): hwdist sums and divides whatever the version."""
    for probed in (None, {"oneccl": "2021.14"}, {"oneccl": "2021.15.0"}, {"oneccl": "2021.17.2"}):
        assert "avg" not in table("xccl", probed).reduce_ops
    assert any(f.when == "oneccl>=2021.15" and f.name == "avg" for f in FACTS["xccl"])
    assert any(f.name == "premul_sum" and "xpu-premul" in f.sources for f in FACTS["xccl"])
    assert CONDITIONS["oneccl>=2021.15"].holds({"oneccl": "2021.15.1"})
    assert not CONDITIONS["oneccl>=2021.15"].holds({"oneccl": "2021.9"})
    assert not CONDITIONS["oneccl>=2021.15"].holds({})  # unknown: the conservative row


def test_oneccl_probe_reads_torch_and_says_nothing_without_xccl():
    found = _probes.oneccl_version()
    c10d = __import__("torch._C._distributed_c10d", fromlist=["x"])
    if not hasattr(c10d, "get_xccl_version"):
        assert found is None
    else:
        assert found and found[0].isdigit()


# ---- hccl: Ascend950 reduces float64 and uint64 ------------------------------------------------------


@pytest.fixture
def fake_npu(monkeypatch):
    """A test-only stand-in for torch_npu on an initialised NPU (no Ascend hardware here): its
    get_soc_version answers what the test sets, as torch_npu.npu.get_soc_version does."""
    state = {"soc": 260, "initialized": True}
    vendor = types.ModuleType("torch_npu")
    vendor.npu = types.SimpleNamespace(get_soc_version=lambda: state["soc"])  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "torch_npu", vendor)
    monkeypatch.setattr(
        torch, "npu", types.SimpleNamespace(is_initialized=lambda: state["initialized"]), raising=False
    )
    return state


def _fresh_hccl() -> HcclDriver:
    drv = HcclDriver()  # type: ignore[abstract]  # device_type comes from its VENDORS row
    drv.name = "hccl"
    return drv


def test_ascend950_reduces_float64_and_older_chips_do_not(fake_npu):
    fake_npu["soc"] = 260  # Ascend950 (NpuVariables.h)
    a5 = _fresh_hccl()
    assert a5.plan("all_reduce", torch.float64, "sum").passthrough
    if hasattr(torch, "uint64"):
        assert a5.plan("all_reduce", torch.uint64, "max").passthrough
    assert a5.details()["probed"] == {"soc": 260}
    fake_npu["soc"] = 223  # Ascend910B3
    older = _fresh_hccl()
    with pytest.raises(PlanError, match="cannot reduce float64"):
        older.plan("all_reduce", torch.float64, "sum")
    assert older.plan("all_gather", torch.float64).passthrough  # moving it is fine everywhere


def test_the_soc_probe_waits_for_an_initialised_device(fake_npu):
    fake_npu["initialized"] = False  # torch_npu's get_soc_version would initialise the device: not asked
    drv = _fresh_hccl()
    assert _probes.npu_soc() is None
    with pytest.raises(PlanError):
        drv.plan("all_reduce", torch.float64, "sum")
    fake_npu["initialized"] = True  # once the device is up, the same driver learns its chip
    assert drv.plan("all_reduce", torch.float64, "sum").passthrough


def test_no_probe_answer_without_torch_npu():
    assert "torch_npu" not in __import__("sys").modules
    assert _probes.npu_soc() is None
    assert hwdist.get_driver("hccl").details()["probed"].startswith("nothing yet")


# ---- gaudi and cncl: lossless plans only -----------------------------------------------------------


@pytest.mark.parametrize("backend", ["gaudi", "cncl"])
def test_int64_and_float64_never_travel_narrower(backend):
    """Gaudi moves int64 as 4-byte values unless a setting hwdist cannot see is on, CNCL sends float64 as
    float32: hwdist moves both as their bytes and never reduces them through a narrower type."""
    drv = hwdist.get_driver(backend)
    for dtype in (torch.int64, torch.float64):
        for op in sorted(ALL_OPS - {"barrier"}):
            rops = ("sum", "min", "max", "mean") if op in REDUCE_OPS else (None,)
            for rop in rops:
                try:
                    found = drv.plan(op, dtype, rop)
                except PlanError:
                    continue
                narrower = torch.empty((), dtype=found.comm_dtype).element_size() < 8
                assert found.view or not narrower, (backend, op, dtype, rop, found)
                assert not (found.comm_dtype == torch.float32 and not found.view), found


# ---- nccl: the engines of torch 2.15 ---------------------------------------------------------------


def test_nccl_table_is_its_engine_facts():
    drv = hwdist.get_driver("nccl")
    declared = {f.name for f in ENGINE_FACTS["nccl"] if f.kind == "reduce_op" and f.declared}
    refused = {f.name for f in ENGINE_FACTS["nccl"] if f.kind == "reduce_op" and not f.declared}
    assert declared == set(drv.reduce_ops) and not refused & set(drv.reduce_ops)
    for rop, dtype in itertools.product(("band", "bor", "bxor"), (torch.int32, torch.int64)):
        with pytest.raises(PlanError, match="reduce op not supported"):
            drv.plan("all_reduce", dtype, rop)


@pytest.mark.parametrize("name", NcclDriver.aliases)
def test_torch_215_nccl_names_resolve_to_the_nccl_driver(name):
    assert hwdist.get_driver(name) is hwdist.get_driver("nccl")


def test_the_engine_names_are_torchs_own():
    """Where torch registers its NCCL engines by entry point (torch >= 2.15), hwdist knows each name."""
    from importlib import metadata

    eps = metadata.entry_points()
    group = (
        eps.select(group="torch.distributed.backends")
        if hasattr(eps, "select")
        else eps.get("torch.distributed.backends", [])
    )
    names = {ep.name for ep in group if ep.name.startswith("nccl")} - {"nccl"}
    if not _compat.HAS_NCCL_ENGINES:
        assert _compat.nccl_engine() is None
        return
    assert names == set(NcclDriver.aliases), names


def test_nccl_engine_follows_torchs_switch(monkeypatch):
    monkeypatch.delenv("TORCH_DIST_USE_NCCL2", raising=False)
    if not _compat.HAS_NCCL_ENGINES:
        pytest.skip(f"torch {torch.__version__} has one NCCL engine (two from torch 2.15)")
    assert _compat.nccl_engine() == "ProcessGroupNCCL2"
    assert ENGINES["ProcessGroupNCCL2"].startswith("nccl2 ")
    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", "0")
    assert _compat.nccl_engine() == "ProcessGroupNCCL"
    assert ENGINES["ProcessGroupNCCL"].startswith("nccl-legacy ")
