"""Training helpers in one process (no process group): no-op semantics, validation, fork check."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import hwdist
from hwdist import info
from hwdist.drivers._common import AcceleratorDriver
from hwdist.drivers.base import Driver


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def test_public_names():
    for name in (
        "GradientSynchronizer",
        "sync_grad",
        "broadcast_tensors",
        "bcast_list_",
        "sync_buffer",
        "average_metrics",
        "synchronized",
        "synchronize",
        "check_fork_safe",
        "is_module_wrapper",
        "rank",
        "world_size",
    ):
        # public in hwdist.training; hwdist.<name> stays for earlier code (not in hwdist.__all__)
        assert name in hwdist.training.__all__ and getattr(hwdist, name) is getattr(hwdist.training, name)
    assert hwdist.rank is hwdist.get_rank and hwdist.world_size is hwdist.get_world_size
    assert hwdist.rank_zero_only is hwdist.master_only  # vis4d's name, from hwdist.info


def test_synchronizer_without_process_group_leaves_gradients_alone():
    model = _model()
    sync = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-5)
    assert len(sync.params) == 4 and sorted(i for b in sync.buckets for i in b) == [0, 1, 2, 3]
    assert sync.buckets[0] == [3]  # reverse order: the last layer's bias goes first
    model(torch.ones(2, 3)).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    sync.wait()
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))
    assert sync.launched == 0 and sync.overlapped == 0
    # repeated steps, accumulation, context manager
    model.zero_grad(set_to_none=True)
    with sync.no_sync():
        model(torch.ones(2, 3)).sum().backward()
    with sync:
        model(torch.ones(2, 3)).sum().backward()
    assert all(torch.allclose(p.grad, 2 * w) for p, w in zip(model.parameters(), want))
    model(torch.ones(2, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="arrived twice before wait"):
        model(torch.ones(2, 3)).sum().backward()
    sync.wait()
    sync.close()
    model(torch.ones(2, 3)).sum().backward()
    model(torch.ones(2, 3)).sum().backward()  # no hooks any more: no complaint
    sync.wait()
    assert "GradientSynchronizer 4 params in 4 buckets" in repr(sync)


def test_synchronizer_ignores_frozen_and_duplicate_params_and_groups_dtypes():
    a = torch.nn.Parameter(torch.ones(4))
    b = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    frozen = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    c = torch.nn.Parameter(torch.ones(2))
    sync = hwdist.GradientSynchronizer([a, b, frozen, a, c])
    assert sync.params == [a, b, c]
    # one bucket per dtype, reverse order inside; launched when their last gradient arrives (b before a)
    assert sync.buckets == [[1], [2, 0]]
    assert hwdist.GradientSynchronizer([a, b, c], bucket_size_mb=0).buckets == [[1], [2, 0]]
    small_first = hwdist.GradientSynchronizer([a, b, c], first_bucket_mb=8 / 2**20)  # c alone fits in 8 bytes
    assert small_first.buckets == [[2], [1], [0]]
    with pytest.raises(TypeError, match="first_bucket_mb must be a number of MiB, got None"):
        hwdist.GradientSynchronizer([a], first_bucket_mb=None)


def test_synchronizer_validation():
    p = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(TypeError, match=r"GradientSynchronizer: params\[1\] must be a torch.Tensor, got str"):
        hwdist.GradientSynchronizer([p, "w"])
    with pytest.raises(TypeError, match="params must be a list or iterable of tensors, got a single tensor"):
        hwdist.GradientSynchronizer(p)
    with pytest.raises(ValueError, match="op must be 'mean' or 'sum' for gradients, got 'max'"):
        hwdist.GradientSynchronizer([p], "max")
    with pytest.raises(ValueError, match="op must be one of"):
        hwdist.GradientSynchronizer([p], "average")
    with pytest.raises(TypeError, match="bucket_size_mb must be a number of MiB, got '10'"):
        hwdist.GradientSynchronizer([p], bucket_size_mb="10")
    hwdist.GradientSynchronizer([p], op=torch.distributed.ReduceOp.SUM)  # ReduceOp values work


def test_sync_grad_and_friends_without_process_group():
    model = _model()
    model(torch.ones(1, 3)).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    hwdist.sync_grad(model.parameters())
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))
    with pytest.raises(TypeError, match=r"sync_grad: params\[0\] must be a torch.Tensor, got int"):
        hwdist.sync_grad([1])
    ts = [torch.ones(2), torch.tensor([3])]
    hwdist.broadcast_tensors(ts)
    hwdist.bcast_list_(ts, src=5)  # no group: nothing to check src against
    hwdist.sync_buffer(ts)
    hwdist.sync_buffer(ts, average=False)
    assert ts[0].tolist() == [1.0, 1.0] and ts[1].tolist() == [3]
    with pytest.raises(
        TypeError, match="broadcast_tensors: tensors must be a list or iterable of tensors, got int"
    ):
        hwdist.broadcast_tensors(3)


def test_average_metrics_without_process_group():
    metrics = {"a": 1, "b": torch.tensor([2.5])}
    assert hwdist.average_metrics(metrics, count=3) is metrics  # demucs: unchanged when not distributed
    assert hwdist.average_metrics({"a": 1.0}, count=0) == {"a": 1.0}
    with pytest.raises(ValueError, match="average_metrics: count must be a finite number >= 0, got nan"):
        hwdist.average_metrics({"a": 1.0}, count=float("nan"))
    with pytest.raises(
        TypeError, match=r"average_metrics: metrics\['a'\] must be a number or a one-element tensor"
    ):
        hwdist.average_metrics({"a": torch.ones(2)})
    with pytest.raises(TypeError, match="average_metrics: metrics keys must be str, got int: 3"):
        hwdist.average_metrics({3: 1.0})
    with pytest.raises(TypeError, match="average_metrics: metrics must be a dict of numbers, got list"):
        hwdist.average_metrics([1.0])


def test_synchronized_and_synchronize_without_process_group():
    @hwdist.synchronized
    def f(x):
        """Doc kept."""
        return x + 1

    assert f(1) == 2 and f.__doc__ == "Doc kept." and f.__name__ == "f"
    assert hwdist.synchronized(group=None)(lambda: 3)() == 3
    with pytest.raises(TypeError, match="synchronized: expected a function, got int"):
        hwdist.synchronized(3)
    hwdist.synchronize()
    assert (hwdist.rank(), hwdist.world_size()) == (0, 1)


def test_is_module_wrapper():
    lin = torch.nn.Linear(1, 1)
    dp = torch.nn.DataParallel(lin)  # works without a GPU (it just forwards)

    class Holder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    class MyWrapper(torch.nn.Module):
        pass

    assert hwdist.is_module_wrapper(dp)
    assert hwdist.is_module_wrapper(Holder(Holder(dp)))
    assert not hwdist.is_module_wrapper(Holder(lin))
    assert not hwdist.is_module_wrapper(lin)
    assert not hwdist.is_module_wrapper("not a module")
    assert hwdist.is_module_wrapper(MyWrapper(), wrappers=(MyWrapper,))
    loop = Holder(lin)
    loop.module = loop  # a cycle does not hang
    assert not hwdist.is_module_wrapper(loop)


def test_local_rank_from_environment_before_a_group(monkeypatch):
    for var in info._LOCAL_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    assert hwdist.get_local_rank() == 0
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert hwdist.get_local_rank() == 2
    monkeypatch.setenv("LOCAL_RANK", "3")  # torchrun's variable wins
    assert hwdist.get_local_rank() == 3


# ---------------------------------------------------------------------------
# fork safety (no GPU here: a test driver says its device is initialised)
# ---------------------------------------------------------------------------
class BusyDriver(Driver):
    """A test driver whose device runtime reports itself initialised."""

    device_type = "busydev"
    description = "test driver with an initialised device"

    def is_initialized(self) -> bool:
        """Always initialised."""
        return True


def test_every_builtin_driver_answers_is_initialized_without_importing_vendor_packages():
    before = set(sys.modules)
    for drv in hwdist.registry.drivers():
        assert drv.is_initialized() is False  # nothing initialised a device in this CPU-only process
    imported = {m for m in set(sys.modules) - before if not m.startswith("torch.")}
    assert not {
        m for m in imported if m.split(".")[0] in {d.vendor_module for d in hwdist.registry.drivers()}
    }
    hwdist.check_fork_safe()
    hwdist.check_fork_safe("fork")


def test_check_fork_safe_refuses_fork_with_an_initialised_device():
    hwdist.register_backend("busyccl", BusyDriver)
    try:
        with pytest.raises(
            RuntimeError, match=r"'busydev' \(backend 'busyccl'\) device runtime is already initialised"
        ):
            hwdist.check_fork_safe("fork")
        hwdist.check_fork_safe("spawn")  # spawn never inherits a device context
        with pytest.raises(ValueError, match="check_fork_safe: start_method must be one of"):
            hwdist.check_fork_safe("clone")
    finally:
        hwdist.unregister_backend("busyccl")
    hwdist.check_fork_safe("fork")


def test_accelerator_driver_asks_the_device_module(monkeypatch):
    """A device module faked on torch (no such hardware here) drives AcceleratorDriver.is_initialized."""

    class FakeAccel(AcceleratorDriver):
        name = "fakeaccel"
        device_type = "fakedev"

    class FakeVendor(FakeAccel):
        vendor_module = "fake_vendor_pkg_for_hwdist_tests"

    state = {"init": False}
    monkeypatch.setattr(
        torch, "fakedev", types.SimpleNamespace(is_initialized=lambda: state["init"]), raising=False
    )
    assert FakeAccel().is_initialized() is False
    state["init"] = True
    assert FakeAccel().is_initialized() is True
    assert FakeVendor().is_initialized() is False  # vendor package never imported: cannot be initialised
    monkeypatch.setitem(
        sys.modules, "fake_vendor_pkg_for_hwdist_tests", types.ModuleType("fake_vendor_pkg_for_hwdist_tests")
    )
    assert FakeVendor().is_initialized() is True
    monkeypatch.setattr(torch, "fakedev", types.SimpleNamespace(), raising=False)  # no is_initialized: False
    assert FakeAccel().is_initialized() is False
