"""The demucs-style ``distrib.py`` helpers at hwdist's top level, checked against that file's documentation.

demucs' helpers: ``rank()``/``world_size()`` (0 and 1 without a process
group), ``is_distributed()``, ``all_reduce(tensor, op=ReduceOp.SUM)`` (in place,
a no-op when not distributed), ``broadcast_tensors(tensors, src=0)`` (floating
and complex tensors only), ``sync_buffer(buffers, average=True)`` (floating
buffers: averaged, or broadcast from rank 0), ``sync_grad(params)`` (gradients
averaged) and ``average_metrics(metrics, count=1.)`` (the ``count``-weighted
average over the workers). Expected values come from rank numbers.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist.testing.pytest_plugin import one_backend, world_sizes

pytestmark = pytest.mark.dist

#: demucs' signatures: every parameter, in order, with its default (hwdist may add optional ones after them).
DEMUCS_SIGNATURES = {
    "rank": [],
    "world_size": [],
    "is_distributed": [],
    "broadcast_tensors": [("tensors", inspect.Parameter.empty), ("src", 0)],
    "sync_buffer": [("buffers", inspect.Parameter.empty), ("average", True)],
    "sync_grad": [("params", inspect.Parameter.empty)],
    "average_metrics": [("metrics", inspect.Parameter.empty), ("count", 1.0)],
}


@pytest.mark.parametrize("name", sorted(DEMUCS_SIGNATURES))
def test_demucs_signatures(name):
    params = list(inspect.signature(getattr(hwdist, name)).parameters.values())
    want = DEMUCS_SIGNATURES[name]
    assert [(p.name, p.default) for p in params[: len(want)]] == want
    assert all(
        p.default is not inspect.Parameter.empty for p in params[len(want) :]
    )  # extras are optional


def test_demucs_all_reduce_signature():
    # demucs: all_reduce(tensor, op=ReduceOp.SUM); hwdist's top level is mmengine's all_reduce(data, op='sum',
    # group=None): the same positional order, and the op may be given as a ReduceOp (see docs/porting.md)
    params = list(inspect.signature(hwdist.all_reduce).parameters.values())
    assert [p.name for p in params[:2]] == ["data", "op"] and params[1].default == "sum"


def test_demucs_helpers_without_a_process_group():
    assert not hwdist.is_distributed()
    assert (hwdist.rank(), hwdist.world_size(), hwdist.is_distributed()) == (0, 1, False)
    t = torch.tensor([3.0])
    assert hwdist.all_reduce(t, torch_dist.ReduceOp.SUM) is None and t.item() == 3.0
    ts = [torch.tensor([1.0])]
    assert hwdist.broadcast_tensors(ts) is None and ts[0].item() == 1.0
    assert hwdist.sync_buffer(ts) is None and ts[0].item() == 1.0
    p = torch.nn.Parameter(torch.ones(1))
    p.grad = torch.tensor([2.0])
    assert hwdist.sync_grad([p]) is None and p.grad.item() == 2.0
    metrics = {"loss": 0.5, "acc": 1}
    assert hwdist.average_metrics(metrics) == metrics  # not distributed: the metrics as they are


def rank_demucs() -> dict:
    r = hwdist.rank()
    out: dict = {"ids": (r, hwdist.world_size(), hwdist.is_distributed())}
    t = torch.tensor([r + 1.0])
    out["all_reduce"] = (hwdist.all_reduce(t), t.item())
    t = torch.tensor([r + 1.0])
    hwdist.all_reduce(t, torch_dist.ReduceOp.MAX)
    out["all_reduce_max"] = t.item()
    ws = hwdist.world_size()
    ts = [torch.tensor([float(r)]), torch.tensor([r], dtype=torch.int32), torch.tensor([complex(r, -r)])]
    out["broadcast_tensors"] = hwdist.broadcast_tensors(ts, src=ws - 1)
    out["bt"] = (ts[0].item(), ts[1].item(), ts[2].item())
    bufs = [torch.tensor([2.0 * r]), torch.tensor([r], dtype=torch.int64)]
    hwdist.sync_buffer(bufs)
    out["sync_buffer"] = (bufs[0].item(), bufs[1].item())
    bufs = [torch.tensor([2.0 * r + 1])]
    hwdist.sync_buffer(bufs, average=False)
    out["sync_buffer_bcast"] = bufs[0].item()
    model = torch.nn.Linear(2, 1)
    unused = torch.nn.Parameter(torch.zeros(1))
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(0.0)
    model(torch.tensor([[float(r), 1.0]])).sum().backward()  # d/dw = [r, 1], d/db = 1
    hwdist.sync_grad([*model.parameters(), unused])
    out["sync_grad"] = (model.weight.grad.tolist(), model.bias.grad.item(), unused.grad)
    out["average_metrics"] = hwdist.average_metrics({"loss": float(r), "acc": 1.0 + r}, count=r + 1)
    out["average_metrics_default"] = hwdist.average_metrics({"x": float(r)})
    return out


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", world_sizes())
def test_demucs_helpers_on_ranks(dist, world_size, backend):
    ws = world_size
    weights = list(range(1, ws + 1))
    for r, res in enumerate(dist(rank_demucs, world_size, backend)):
        # demucs: is_distributed() is world_size() > 1; hwdist's top-level is_distributed() is mmengine's
        # (a process group exists), so a one-rank group says True (docs/porting.md, deliberate differences)
        assert res["ids"] == (r, ws, True)
        assert res["all_reduce"] == (None, ws * (ws + 1) / 2)
        assert res["all_reduce_max"] == float(ws)
        assert res["broadcast_tensors"] is None
        assert res["bt"] == (float(ws - 1), r, complex(ws - 1, -(ws - 1)))  # the int tensor is skipped
        assert res["sync_buffer"] == (pytest.approx(2.0 * sum(range(ws)) / ws), r)
        assert res["sync_buffer_bcast"] == 1.0
        wgrad, bgrad, unused = res["sync_grad"]
        assert wgrad == [[pytest.approx(sum(range(ws)) / ws), 1.0]] and bgrad == 1.0 and unused is None
        avg = res["average_metrics"]
        assert list(avg) == ["loss", "acc"]
        assert avg["loss"] == pytest.approx(
            sum(w * q for w, q in zip(weights, range(ws))) / sum(weights)
        )
        assert avg["acc"] == pytest.approx(
            sum(w * (1.0 + q) for w, q in zip(weights, range(ws))) / sum(weights)
        )
        assert res["average_metrics_default"] == {"x": pytest.approx(sum(range(ws)) / ws)}
