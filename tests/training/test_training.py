"""Training-loop helpers, in one process and on real ranks (gloo and the emulated accelerator).

In one process (no process group): no-op semantics, validation, the fork check. On real ranks,
every expected value is computed independently inside the rank without any collective: the
single-process reference trains a fresh copy of the model on the concatenation of every rank's
batch (each rank can generate every rank's data from its seed), and expected reductions come
from rank numbers.
"""

from __future__ import annotations

import math
import sys
import types
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import hwdist
from hwdist import info
from hwdist.drivers._common import AcceleratorDriver
from hwdist.drivers.base import Driver
from hwdist.testing.pytest_plugin import capture_error as _catch


def _small_model() -> torch.nn.Module:
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
    model = _small_model()
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
    model = _small_model()
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


# ---------------------------------------------------------------------------
# on real ranks: a small model, per-rank data, and the single-process reference
# ---------------------------------------------------------------------------
def _model(depth: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(4, 8), torch.nn.Tanh()]
    for _ in range(depth - 2):
        layers += [torch.nn.Linear(8, 8), torch.nn.Tanh()]
    layers.append(torch.nn.Linear(8, 3))
    return torch.nn.Sequential(*layers)


def _batch(r: int, step: int, n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(n, 4, generator=g), torch.randn(n, 3, generator=g)


def _reference(ws: int, steps: int = 3) -> list[torch.Tensor]:
    """One process, the concatenated batch of every rank (mean loss = mean of the ranks' means)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        xs, ys = zip(*(_batch(q, step) for q in range(ws)))
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def check_train(mode: str) -> dict:
    """3 SGD steps with the synchronizer (several configurations) or sync_grad."""
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    model = _model()
    with torch.no_grad():  # every rank but 0 starts elsewhere: the initial broadcast must fix that
        for p in model.parameters():
            p.add_(float(r))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sync = None
    if mode == "sync_grad":
        hwdist.broadcast_tensors(model.parameters())
    elif mode == "default":
        sync = hwdist.GradientSynchronizer(model.parameters())
    elif mode == "small_buckets":
        sync = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-4)
    elif mode == "no_overlap":
        sync = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-4, overlap=False)
    elif mode == "context":
        sync = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-4)
    for step in range(3):
        x, y = _batch(r, step)
        opt.zero_grad(set_to_none=step % 2 == 0)  # both kinds of zero_grad
        loss = F.mse_loss(model(x), y)
        if mode == "sync_grad":
            loss.backward()
            hwdist.sync_grad(model.parameters())
        elif mode == "context":
            assert sync is not None
            with sync:
                loss.backward()
        else:
            assert sync is not None
            loss.backward()
            sync.wait()
        opt.step()
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "reference": _reference(ws),
        "buckets": None if sync is None else len(sync.buckets),
    }


@pytest.mark.parametrize("mode", ["default", "small_buckets", "no_overlap", "context", "sync_grad"])
def test_training_matches_single_process(dist, combo, mode):
    ws, backend = combo
    results = dist(check_train, ws, backend, mode)
    first = results[0]["params"]
    for res in results:
        for got, other in zip(res["params"], first):
            assert torch.equal(got, other), "parameters differ across ranks"
        for got, want in zip(res["params"], res["reference"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        if mode == "default":
            assert res["buckets"] == 1  # 4 float32 tensors, far below 10 MiB
        if mode == "small_buckets":
            assert res["buckets"] == 4  # each tensor over the 105-byte limit alone


# ---------------------------------------------------------------------------
# buckets fire during backward
# ---------------------------------------------------------------------------
def check_overlap() -> dict:
    r = hwdist.get_rank()
    model = _model(depth=4)
    sync = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-4)
    first_weight = model[0].weight  # type: ignore[index]  # (a Sequential) its gradient is among the last to arrive
    seen: list[int] = []
    first_weight.register_post_accumulate_grad_hook(lambda p: seen.append(sync.launched))
    out: dict = {"buckets": len(sync.buckets)}
    for step in range(2):
        model.zero_grad(set_to_none=True)
        x, y = _batch(r, step)
        F.mse_loss(model(x), y).backward()
        out[f"after_backward_{step}"] = sync.launched
        sync.wait()
        out[f"overlapped_{step}"] = sync.overlapped
        out[f"after_wait_{step}"] = sync.launched
    out["seen_in_hook"] = list(seen)
    # overlap=False: nothing is launched before wait()
    lazy = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-4, overlap=False)
    sync.close()
    model.zero_grad(set_to_none=True)
    F.mse_loss(model(_batch(r, 0)[0]), _batch(r, 0)[1]).backward()
    out["lazy_after_backward"] = lazy.launched
    lazy.wait()
    out["lazy_overlapped"] = lazy.overlapped
    return out


def test_buckets_launch_during_backward(dist, combo):
    ws, backend = combo
    if ws == 1:
        pytest.skip("one rank: nothing to launch")
    for res in dist(check_overlap, ws, backend):
        n = res["buckets"]
        assert n == 8  # 4 Linear layers, one bucket per tensor
        for step in range(2):
            # every gradient arrived during backward, so every bucket was already launched
            assert res[f"after_backward_{step}"] == n
            assert res[f"overlapped_{step}"] == n
            assert res[f"after_wait_{step}"] == 0
        # when the first layer's weight got its gradient (one of the last), buckets had gone out already
        assert len(res["seen_in_hook"]) == 2 and all(1 <= k <= n for k in res["seen_in_hook"])
        assert res["lazy_after_backward"] == 0 and res["lazy_overlapped"] == 0


# ---------------------------------------------------------------------------
# dtypes, unused parameters, accumulation, misuse
# ---------------------------------------------------------------------------
class Mixed(torch.nn.Module):
    """float32 layers, float64/bf16/fp16 scales, big tensors, params used on rank 0 only, one unused."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.body = torch.nn.Linear(4, 3)
        self.scale64 = torch.nn.Parameter(torch.tensor([1.5], dtype=torch.float64))
        self.scale_bf16 = torch.nn.Parameter(torch.tensor([0.75, 1.25, 1.0], dtype=torch.bfloat16))
        self.scale_f16 = torch.nn.Parameter(torch.tensor([0.5, 1.0, 2.0], dtype=torch.float16))
        self.extra = torch.nn.Linear(4, 3)
        self.never = torch.nn.Parameter(torch.ones(2))
        # >= 1 MiB: reduced in place on gloo when buckets are smaller (how="small"), else packed
        self.big = torch.nn.Parameter(torch.linspace(-1, 1, 300_000))
        self.big_extra = torch.nn.Parameter(torch.linspace(1, 2, 300_000))

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        out = self.body(x) * self.scale_bf16.float() * self.scale_f16.float()
        out = out * self.scale64.float()
        out = out + self.big[:3] * self.big[-3:]
        if use_extra:
            out = out + self.extra(x) + self.big_extra[1:4]
        return out


def _local_grads(q: int, step: int, ws: int) -> dict[str, torch.Tensor]:
    """Rank q's own gradients (computed here, without communication)."""
    m = Mixed()
    x, y = _batch(q, step)
    F.mse_loss(m(x, use_extra=(q == 0)), y).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def check_mixed(how: str) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    model = Mixed()
    if how == "sync_grad":
        sync = None
    else:
        sync = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-5 if how == "small" else 10)
    out: dict = {}
    for step in range(2):
        model.zero_grad(set_to_none=True)
        x, y = _batch(r, step)
        F.mse_loss(model(x, use_extra=(r == 0)), y).backward()
        if sync is None:
            hwdist.sync_grad(model.parameters())
        else:
            sync.wait()
        got = {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}
        # expected: every rank's local gradient (zeros where a rank had none), averaged in float64
        local = [_local_grads(q, step, ws) for q in range(ws)]
        want: dict[str, Optional[torch.Tensor]] = {}
        for n, p in model.named_parameters():
            if all(n not in g for g in local):
                want[n] = None
                continue
            acc = torch.stack(
                [g[n].double() if n in g else torch.zeros_like(p, dtype=torch.float64) for g in local]
            )
            want[n] = (acc.sum(0) / ws).to(p.dtype)
        out[step] = (got, want)
    out["dtypes"] = {n: str(p.grad.dtype) for n, p in model.named_parameters() if p.grad is not None}
    return out


@pytest.mark.parametrize("how", ["default", "small", "sync_grad"])
def test_mixed_dtypes_and_unused_parameters(dist, combo, how):
    ws, backend = combo
    tol = {
        torch.float32: (1e-5, 1e-6),
        torch.float64: (1e-12, 1e-12),
        torch.bfloat16: (2e-2, 1e-2),
        torch.float16: (2e-3, 1e-3),
    }
    for res in dist(check_mixed, ws, backend, how):
        assert res["dtypes"] == {
            "body.weight": "torch.float32",
            "body.bias": "torch.float32",
            "scale64": "torch.float64",
            "scale_bf16": "torch.bfloat16",
            "scale_f16": "torch.float16",
            "extra.weight": "torch.float32",
            "extra.bias": "torch.float32",
            "big": "torch.float32",
            "big_extra": "torch.float32",
        }
        for step in range(2):
            got, want = res[step]
            assert got["never"] is None and want["never"] is None  # no rank had it: stays None everywhere
            for name, w in want.items():
                if w is None:
                    continue
                g = got[name]
                assert g is not None and g.dtype == w.dtype, name
                rtol, atol = tol[w.dtype]
                torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=name)


def check_accumulate_and_misuse() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    model = _model()
    sync = hwdist.GradientSynchronizer(model.parameters(), bucket_size_mb=1e-4)
    out: dict = {}
    # gradient accumulation: the first micro-batch inside no_sync, the second launches
    (xa, ya), (xb, yb) = _batch(r, 0), _batch(r, 1)
    model.zero_grad(set_to_none=True)
    with sync.no_sync():
        F.mse_loss(model(xa), ya).backward()
    out["launched_in_no_sync"] = sync.launched
    F.mse_loss(model(xb), yb).backward()
    sync.wait()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    got = [g.clone() for g in grads if g is not None]
    want = [torch.zeros_like(p) for p in model.parameters()]
    for q in range(ws):  # independently: each rank's accumulated gradients, averaged
        m = _model()
        for s in (0, 1):
            x, y = _batch(q, s)
            F.mse_loss(m(x), y).backward()
        for w, p in zip(want, m.parameters()):
            assert p.grad is not None
            w += p.grad / ws
    out["accumulated"] = (got, want)
    # a second backward before wait() without no_sync is refused on every rank
    model.zero_grad(set_to_none=True)
    F.mse_loss(model(xa), ya).backward()
    out["twice"] = _catch(lambda: F.mse_loss(model(xb), yb).backward())
    sync.wait()  # drains what the first backward launched; every rank does the same
    # bad arguments raise on every rank (only rank 0 passes a bad one)
    out["bad_item"] = _catch(
        hwdist.GradientSynchronizer,
        [torch.nn.Parameter(torch.ones(1)), "w" if r == 0 else torch.nn.Parameter(torch.ones(1))],
    )
    out["bad_op"] = _catch(hwdist.GradientSynchronizer, model.parameters(), "max")
    out["bad_src"] = _catch(hwdist.GradientSynchronizer, model.parameters(), broadcast_from=ws)
    extra = [torch.nn.Parameter(torch.ones(2))] if r == ws - 1 else []
    out["mismatch"] = _catch(hwdist.GradientSynchronizer, [*model.parameters(), *extra])
    out["shape_mismatch"] = _catch(
        hwdist.GradientSynchronizer, [torch.nn.Parameter(torch.ones(2 if r == 0 else 3))]
    )
    out["grad_op_bad"] = _catch(hwdist.sync_grad, model.parameters(), "min")
    before = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    out["grad_op_mismatch"] = _catch(hwdist.sync_grad, model.parameters(), "sum" if r == ws - 1 else "mean")
    after = [p.grad for p in model.parameters() if p.grad is not None]
    out["grads_untouched"] = len(before) == len(after) and all(
        torch.equal(a, b) for a, b in zip(before, after)
    )
    # healthy afterwards
    model.zero_grad(set_to_none=True)
    x, y = _batch(r, 2)
    F.mse_loss(model(x), y).backward()
    sync.wait()
    out["healthy"] = sync.overlapped
    return out


def test_accumulation_and_misuse(dist, combo):
    ws, backend = combo
    for r, res in enumerate(dist(check_accumulate_and_misuse, ws, backend)):
        assert res["launched_in_no_sync"] == 0
        got, want = res["accumulated"]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        kind, msg = res["twice"]
        assert kind == "RuntimeError" and "arrived twice before wait()" in msg and "no_sync" in msg
        assert res["bad_op"] == (
            "ValueError",
            "GradientSynchronizer: op must be 'mean' or 'sum' for gradients, got 'max'",
        )
        assert res["grad_op_bad"] == (
            "ValueError",
            "sync_grad: op must be 'mean' or 'sum' for gradients, got 'min'",
        )
        if r == 0:
            assert res["bad_item"] == (
                "TypeError",
                "GradientSynchronizer: params[1] must be a torch.Tensor, got str",
            )
        else:
            # the other ranks raise CollectiveArgumentError (a TypeError and a ValueError) naming rank 0
            kind, msg = res["bad_item"]
            assert (
                kind == "CollectiveArgumentError"
                and "GradientSynchronizer: rank 0 was given invalid arguments" in msg
            )
            assert "params[1] must be a torch.Tensor, got str" in msg
        assert (
            res["bad_src"][0] == "ValueError"
            and f"broadcast_from must be a rank in 0..{ws - 1}" in res["bad_src"][1]
        )
        assert res["grads_untouched"]
        if ws > 1:
            kind, msg = res["grad_op_mismatch"]
            assert kind == "ValueError" and "sync_grad: every rank must pass the same op" in msg, msg
            assert f"rank {r}: op={'sum' if r == ws - 1 else 'mean'!r}" in msg, msg
            kind, msg = res["mismatch"]
            assert kind == "ValueError" and "every rank must pass the same number of tensors" in msg
            assert f"rank {r} passed {4 + (r == ws - 1)}" in msg and "between 4 and 5" in msg
            kind, msg = res["shape_mismatch"]
            assert kind == "ValueError" and "same shapes and dtypes" in msg
        else:  # one rank: nothing to compare against
            assert (
                res["mismatch"] is None and res["shape_mismatch"] is None and res["grad_op_mismatch"] is None
            )
        assert res["healthy"] == (4 if ws > 1 else 0)


# ---------------------------------------------------------------------------
# broadcast_tensors / bcast_list_ / sync_buffer / average_metrics / small helpers
# ---------------------------------------------------------------------------
def check_broadcasts(backend: str) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    ints = torch.int32 if backend == "emu" else torch.int64
    out: dict = {}
    src = ws - 1
    # broadcast_tensors: float and complex tensors only
    ts = [
        torch.full((3,), r + 0.5),
        torch.tensor([r], dtype=ints),
        torch.tensor([complex(r, -r)], dtype=torch.complex64),
        torch.full((2,), r + 0.25, dtype=torch.bfloat16),
        torch.full((2, 3), float(r), dtype=torch.float64).t(),  # non-contiguous
    ]
    hwdist.broadcast_tensors(ts, src=src)
    out["broadcast_tensors"] = [t.tolist() for t in ts]
    # bcast_list_: every dtype, a big tensor (>= 1 MiB goes as it is on CPU drivers), a generator
    big = torch.full((300_000,), float(r))
    ts2 = [
        torch.tensor([r, r + 1], dtype=torch.int64),
        torch.tensor([r == 0]),
        big,
        torch.full((2, 2), r * 1.0)[:, 0],
    ]
    hwdist.bcast_list_((t for t in ts2), src=0)
    out["bcast_list_"] = [
        ts2[0].tolist(),
        ts2[1].tolist(),
        (big.min().item(), big.max().item()),
        ts2[3].tolist(),
    ]
    # mismatches raise on every rank, before any data moves
    mine = [torch.ones(2)] * (3 if r == ws - 1 else 2) + [torch.tensor([1])]  # the int tensor is not counted
    out["count_mismatch"] = _catch(hwdist.broadcast_tensors, mine)
    out["shape_mismatch"] = _catch(hwdist.bcast_list_, [torch.ones(2 + (r == 0))])
    out["bad_item"] = _catch(hwdist.bcast_list_, [torch.ones(1), 3] if r == ws - 1 else [torch.ones(1)] * 2)
    out["bad_src"] = _catch(hwdist.broadcast_tensors, [torch.ones(1)], src=ws)
    out["not_list"] = _catch(hwdist.bcast_list_, torch.ones(2))
    # the ranks name different sources, or one averages while the others broadcast: every rank raises
    out["src_mismatch"] = _catch(hwdist.bcast_list_, [torch.ones(1)], src=ws - 1 if r == 0 else 0)
    out["average_mismatch"] = _catch(hwdist.sync_buffer, [torch.ones(1)], average=r == 0)
    ok = [torch.tensor([float(r)])]
    hwdist.broadcast_tensors(ok, src=src)
    out["healthy"] = ok[0].item()
    # sync_buffer: average vs broadcast; int buffers untouched
    bn = torch.nn.BatchNorm1d(2)
    mean, var, tracked = bn.running_mean, bn.running_var, bn.num_batches_tracked
    assert mean is not None and var is not None and tracked is not None
    with torch.no_grad():
        mean.fill_(r + 1.0)
        var.fill_(2.0 * r)
        tracked.fill_(10 + r)
    hwdist.sync_buffer(bn.buffers())
    out["avg"] = (mean.tolist(), var.tolist(), tracked.item())
    with torch.no_grad():
        mean.fill_(r + 1.0)
    hwdist.sync_buffer(bn.buffers(), average=False, src=src)
    out["bcast"] = (mean.tolist(), tracked.item())
    out["buffer_mismatch"] = _catch(hwdist.sync_buffer, [torch.ones(1)] * (1 + (r == 0)))
    return out


def test_broadcast_tensors_bcast_list_and_sync_buffer(dist, combo):
    ws, backend = combo
    src = ws - 1
    for r, res in enumerate(dist(check_broadcasts, ws, backend, backend)):
        assert res["broadcast_tensors"] == [
            [src + 0.5] * 3,
            [r],  # int: skipped
            [complex(src, -src)],
            [src + 0.25] * 2,
            [[float(src)] * 2] * 3,
        ]
        assert res["bcast_list_"] == [[0, 1], [True], (0.0, 0.0), [0.0, 0.0]]
        if ws > 1:
            kind, msg = res["count_mismatch"]
            assert (
                kind == "ValueError"
                and "broadcast_tensors: every rank must pass the same number of tensors" in msg
            )
            assert f"rank {r} passed {3 if r == ws - 1 else 2}" in msg
            kind, msg = res["shape_mismatch"]
            assert (
                kind == "ValueError" and "bcast_list_: every rank must pass tensors of the same shapes" in msg
            )
            kind, msg = res["bad_item"]
            if r == ws - 1:
                assert (kind, msg) == ("TypeError", "bcast_list_: tensors[1] must be a torch.Tensor, got int")
            else:  # a TypeError and a ValueError, naming the bad rank and its error
                assert (
                    kind == "CollectiveArgumentError" and f"rank {ws - 1} was given invalid arguments" in msg
                )
                assert "tensors[1] must be a torch.Tensor, got int" in msg
            kind, msg = res["buffer_mismatch"]
            assert kind == "ValueError" and "sync_buffer: every rank must pass the same number" in msg
            kind, msg = res["src_mismatch"]
            assert kind == "ValueError" and "bcast_list_: every rank must pass the same src" in msg, msg
            assert f"rank {r}: src={ws - 1 if r == 0 else 0}" in msg, msg
            kind, msg = res["average_mismatch"]
            assert kind == "ValueError" and "sync_buffer: every rank must pass the same average" in msg, msg
        else:
            assert (
                res["count_mismatch"] is None
                and res["shape_mismatch"] is None
                and res["buffer_mismatch"] is None
                and res["src_mismatch"] is None
                and res["average_mismatch"] is None
            )
        kind, msg = res["bad_src"]
        assert kind == "ValueError" and f"broadcast_tensors: src must be a rank in 0..{ws - 1}" in msg
        assert res["not_list"] == (
            "TypeError",
            "bcast_list_: tensors must be a list or iterable of tensors, got a single tensor",
        )
        assert res["healthy"] == float(src)
        mean_mean = sum(q + 1.0 for q in range(ws)) / ws
        mean_var = sum(2.0 * q for q in range(ws)) / ws
        assert res["avg"] == ([mean_mean] * 2, [mean_var] * 2, 10 + r)
        assert res["bcast"] == ([src + 1.0] * 2, 10 + r)


def check_metrics() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    metrics = {"loss": 1.0 + r, "acc": torch.tensor(0.5 * r), "n": r}
    out["weighted"] = hwdist.average_metrics(metrics, count=r + 1)
    out["default_count"] = hwdist.average_metrics({"x": float(r)})
    out["zero_count"] = hwdist.average_metrics({"x": 1.0}, count=0)
    out["keys"] = _catch(hwdist.average_metrics, {"loss": 1.0, **({"extra": 2.0} if r == ws - 1 else {})})
    out["bad_count"] = _catch(hwdist.average_metrics, {"x": 1.0}, count=-1 if r == 0 else 1)
    out["bad_value"] = _catch(hwdist.average_metrics, {"x": "high" if r == 0 else 1.0})
    out["healthy"] = hwdist.average_metrics({"x": 2.0})
    # small helpers
    calls: list[int] = []

    @hwdist.synchronized
    def work(v: int) -> int:
        calls.append(v)
        return v * 2

    @hwdist.synchronized(group=None)
    def work2() -> str:
        return "ok"

    out["synchronized"] = (work(r), work2(), calls)
    hwdist.synchronize()
    out["aliases"] = (hwdist.rank(), hwdist.world_size(), hwdist.is_distributed())
    return out


def test_average_metrics_and_small_helpers(dist, combo):
    ws, backend = combo
    counts = [q + 1 for q in range(ws)]
    total = sum(counts)
    for r, res in enumerate(dist(check_metrics, ws, backend)):
        w = res["weighted"]
        assert list(w) == ["loss", "acc", "n"]
        assert w["loss"] == pytest.approx(sum(c * (1.0 + q) for q, c in enumerate(counts)) / total)
        assert w["acc"] == pytest.approx(sum(c * 0.5 * q for q, c in enumerate(counts)) / total)
        assert w["n"] == pytest.approx(sum(c * q for q, c in enumerate(counts)) / total)
        assert res["default_count"]["x"] == pytest.approx(sum(range(ws)) / ws)
        if ws > 1:
            assert math.isnan(res["zero_count"]["x"])
        else:  # one process: the metrics unchanged, as demucs returns them
            assert res["zero_count"] == {"x": 1.0}
        if ws > 1:
            kind, msg = res["keys"]
            assert kind == "ValueError" and msg.startswith("average_metrics: ") and "extra" in msg
        else:
            assert res["keys"] is None
        if r == 0:
            assert res["bad_count"] == (
                "ValueError",
                "average_metrics: count must be a finite number >= 0, got -1",
            )
            assert (
                res["bad_value"][0] == "TypeError"
                and "metrics['x'] must be a number, got str" in res["bad_value"][1]
            )
        elif ws > 1:
            kind, msg = res["bad_count"]
            assert kind == "ValueError" and "rank 0" in msg and "count must be a finite number" in msg
            assert res["bad_value"][0] == "ValueError" and "rank 0" in res["bad_value"][1]
        assert res["healthy"] == {"x": 2.0}
        assert res["synchronized"] == (2 * r, "ok", [r])
        assert res["aliases"] == (r, ws, True)


def check_wrappers() -> tuple:
    model = torch.nn.Linear(2, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    class Outer(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.module = inner

    return (
        hwdist.is_module_wrapper(ddp),
        hwdist.is_module_wrapper(Outer(ddp)),
        hwdist.is_module_wrapper(Outer(model)),
        hwdist.is_module_wrapper(model),
    )


def test_is_module_wrapper_with_ddp(dist):
    assert dist(check_wrappers, 2, "gloo") == [(True, True, False, False)] * 2


def check_before_group() -> tuple:
    # no process group in this pool: the launcher's environment is all there is
    return hwdist.is_distributed(), hwdist.get_local_rank(), hwdist.get_local_size()


def test_local_rank_before_a_process_group(dist):
    assert dist(check_before_group, 2, None) == [(False, 0, 2), (False, 1, 2)]
