"""One rank's bad or hostile input, and calls that cannot go on: on real ranks, every rank raises.

Shared tensors, poisoned metrics, integer ops, bad arguments on one rank, and the
compat modules' one-sided arguments.

Each test is a row of the fault table in docs/reliability.md (the environment variables' rows
are in tests/launch/test_resolvers.py). Bad input is given on ONE rank (the last) where the row
is about one rank, and every rank must raise within seconds: each case is timed on the
rank and the harness's own call limit catches a hang.

Then clear errors, raised alike on every rank, where a call cannot go on (on real gloo ranks):

* ``collect_results(..., weights_only=True)`` where a rank's results hold a type allowed nowhere: each
  sender reads its own items back through the restricted loader before it sends them (as the other
  object collectives do), so every rank raises ``WeightsOnlyRefused`` naming the rank, the item and
  the type, through communication and through ``tmpdir`` alike.
* A group whose only backend serves a device this machine lacks (a backend registered with torch for
  ``hpu``, which torch knows without its hardware): every operation raises ``BackendError`` naming the
  device-to-backend map, the device and the fix, on every rank, before anything is sent.
* ``broadcast_object_list`` checks ``src`` as ``broadcast`` does: the same words, on every rank that
  passed it, in a group of one too.
"""

from __future__ import annotations

import builtins
import math
import os
import pickle
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist import _compat
from hwdist.testing import RankPool
from hwdist.testing.pytest_plugin import capture_error as _catch, one_backend
from collections import OrderedDict
import hwdist.compat.legacy as legacy
import hwdist.compat.megengine as meg
import hwdist.compat.vis4d as vis4d

pytestmark = pytest.mark.dist

#: A bad argument on one rank must reach every rank well within this (the group timeout is minutes).
FAST = 10.0


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.monotonic()
    return _catch(fn, *args, **kwargs), time.monotonic() - start


def _healthy() -> float:
    t = torch.ones(1)
    hwdist.all_reduce(t)
    return t.item()


# ---------------------------------------------------------------------------
# a tensor given twice, or tied weights, is reduced once (also in place, >= 1 MiB)
# ---------------------------------------------------------------------------
BIG = 300_000  # float32 elements: 1.2 MB, over gloo's 1 MiB in-place limit


def check_shared_tensors() -> dict:
    r = hwdist.get_rank()
    out: dict = {}
    big, small = torch.full((BIG,), r + 1.0), torch.full((3,), r + 1.0)
    hwdist.all_reduce_params([big, big, small, small])
    out["repeated"] = (big.unique().tolist(), small.unique().tolist())
    # tied weights: state_dict() holds two tensor objects over one storage
    model = torch.nn.Module()
    model.a = torch.nn.Linear(600, 600, bias=False)  # 1.44 MB
    model.b = torch.nn.Linear(600, 600, bias=False)
    model.b.weight = model.a.weight
    with torch.no_grad():
        model.a.weight.fill_(r + 1.0)
    values = list(model.state_dict().values())
    assert len(values) == 2 and values[0] is not values[1]
    hwdist.all_reduce_params(values)
    out["tied"] = model.a.weight.detach().unique().tolist()
    # a big tensor and a view into it: never two in-place reductions over one memory
    whole = torch.full((BIG,), r + 1.0)
    hwdist.all_reduce_params([whole, whole[:10]])
    out["overlap"] = whole.unique().tolist()
    # gradients: sync_grad and GradientSynchronizer with repeated parameters
    w, v = torch.nn.Parameter(torch.zeros(BIG)), torch.nn.Parameter(torch.zeros(3))
    w.grad, v.grad = torch.full((BIG,), r + 1.0), torch.full((3,), r + 1.0)
    hwdist.sync_grad([w, w, v, v], op="sum")
    out["sync_grad"] = (w.grad.unique().tolist(), v.grad.unique().tolist())
    w.grad, v.grad = torch.full((BIG,), r + 1.0), torch.full((3,), r + 1.0)
    sync = hwdist.GradientSynchronizer([w, w, v, v], op="sum", broadcast_from=None, overlap=False)
    sync.wait()
    out["synchronizer"] = (len(sync.params), w.grad.unique().tolist(), v.grad.unique().tolist())
    return out


def test_shared_tensors_are_reduced_once(dist, combo):
    ws, backend = combo
    total = float(sum(q + 1 for q in range(ws)))
    for res in dist(check_shared_tensors, ws, backend):
        assert res["repeated"] == ([total], [total])
        assert res["tied"] == [total]
        assert res["overlap"] == [total]
        assert res["sync_grad"] == ([total], [total])
        assert res["synchronizer"] == (2, [total], [total])


# ---------------------------------------------------------------------------
# a zero-weight NaN/inf on one rank does not poison average_metrics
# ---------------------------------------------------------------------------
def check_zero_weight_metrics() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    last = r == ws - 1 and ws > 1
    metrics = {
        "loss": math.nan if last else 1.0 + r,
        "acc": math.inf if last else 0.5,
        "t": torch.tensor(-math.inf if last else 2.0),
    }
    out = {"weighted": hwdist.average_metrics(metrics, count=0 if last else r + 1)}
    out["all_zero"] = hwdist.average_metrics({"x": math.nan}, count=0)
    out["nan_counted"] = hwdist.average_metrics(
        {"x": math.nan if last else 1.0}, count=1
    )  # a weighted NaN is real
    return out


def test_zero_weight_metrics_do_not_poison_the_average(dist, combo):
    ws, backend = combo
    live = range(ws - 1) if ws > 1 else range(1)
    counts = {q: q + 1 for q in live}
    for res in dist(check_zero_weight_metrics, ws, backend):
        w = res["weighted"]
        assert w["loss"] == pytest.approx(
            sum(c * (1.0 + q) for q, c in counts.items()) / sum(counts.values())
        )
        assert w["acc"] == pytest.approx(0.5) and w["t"] == pytest.approx(2.0)
        assert math.isnan(res["all_zero"]["x"])
        assert math.isnan(res["nan_counted"]["x"]) == (ws > 1)


# ---------------------------------------------------------------------------
# integers are not reduce ops (5 was silently BAND, 2 PRODUCT)
# ---------------------------------------------------------------------------
def check_integer_ops() -> dict:
    r = hwdist.get_rank()
    out: dict = {}
    t = torch.tensor([r + 6], dtype=torch.int32)  # emu reduces no int64
    for name, op in {"five": 5, "two": 2, "np_four": np.int64(4), "bool": True, "float": 0.0}.items():
        out[name] = (_catch(hwdist.all_reduce, t, op), t.item())
    out["dict"] = _catch(hwdist.all_reduce_dict, {"a": torch.ones(1)}, 5)
    out["params"] = _catch(hwdist.all_reduce_params, [torch.ones(1)], op=2)
    ok = {}
    for name, op in {
        "PRODUCT": torch_dist.ReduceOp.PRODUCT,
        "Product": "Product",
        "MAX_obj": torch_dist.ReduceOp(torch_dist.ReduceOp.MAX),
        "Max": "Max",
    }.items():
        x = torch.tensor([r + 6], dtype=torch.int32)
        hwdist.all_reduce(x, op)
        ok[name] = x.item()
    out["ok"] = ok
    return out


def test_integer_reduce_ops_are_refused(dist, combo):
    ws, backend = combo
    product = math.prod(q + 6 for q in range(ws))
    for r, res in enumerate(dist(check_integer_ops, ws, backend)):
        for name, shown in {
            "five": "5",
            "two": "2",
            "np_four": repr(np.int64(4)),
            "bool": "True",
            "float": "0.0",
        }.items():
            err, value = res[name]
            assert err[0] == "ValueError" and f"got {shown} (a plain number is not a ReduceOp" in err[1], err
            assert value == r + 6  # untouched
        assert res["dict"][0] == "ValueError" and "got 5" in res["dict"][1]
        assert res["params"][0] == "ValueError" and "got 2" in res["params"][1]
        assert res["ok"] == {"PRODUCT": product, "Product": product, "MAX_obj": ws + 5, "Max": ws + 5}


# ---------------------------------------------------------------------------
# dst normalisation: gather's dst checked up front
# ---------------------------------------------------------------------------
def check_gather_dst() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    out["none"] = _timed(hwdist.gather, torch.ones(2), None)
    out["none_same_shape"] = _timed(hwdist.gather, torch.ones(2), dst=None, same_shape=True)
    out["str"] = _timed(hwdist.gather, torch.ones(2), "0")
    # an integer-like dst (np.int64) works, in verification mode too, even when other ranks pass an int
    dst = np.int64(ws - 1) if r % 2 else ws - 1
    got = hwdist.gather(torch.tensor([r]), dst)
    out["np_dst"] = [t.item() for t in got]
    with hwdist.verification():
        got = hwdist.gather(torch.tensor([r]), dst)
        out["np_dst_verified"] = [t.item() for t in got]
        objs = hwdist.gather_object(r, dst)
        out["np_dst_object"] = objs
        x = torch.tensor([r + 1.0])
        hwdist.broadcast(x, np.int64(0) if r % 2 else 0)
        out["np_src_verified"] = x.item()
    out["healthy"] = _healthy()
    return out


def test_gather_dst_is_checked_up_front(dist, combo):
    ws, backend = combo
    for r, res in enumerate(dist(check_gather_dst, ws, backend)):
        if ws > 1:
            for case in ("none", "none_same_shape"):
                err, elapsed = res[case]
                assert err == ("TypeError", "gather: dst must be an int rank, got NoneType: None"), err
                assert elapsed < FAST
            assert res["str"][0] == ("TypeError", "gather: dst must be an int rank, got str: '0'")
        mine = list(range(ws)) if r == ws - 1 else []
        assert res["np_dst"] == mine and res["np_dst_verified"] == mine
        assert res["np_dst_object"] == (list(range(ws)) if r == ws - 1 else None)
        assert res["np_src_verified"] == 1.0
        assert res["healthy"] == ws


# ---------------------------------------------------------------------------
# all_reduce_dict checks every value before any communication; one bad rank -> every rank raises
# ---------------------------------------------------------------------------
def _spoilers() -> dict[str, Callable[[dict], Any]]:
    return {
        "sparse": lambda d: {**d, "b": d["b"].to_sparse()},
        "meta": lambda d: {**d, "b": torch.ones(2, device="meta")},
        "ndarray": lambda d: {**d, "b": np.ones(2, dtype=np.float32)},
        "not_dict": lambda d: list(d.values()),
    }


def check_dict_one_bad_rank() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    last = r == ws - 1
    out: dict = {}

    def make(tag: str, n: int = 1) -> dict:
        return {"a": torch.ones(3 if n == 1 else n), "b": torch.full((2,), r + 1.0), tag: torch.zeros(n)}

    # after the ranks agreed on this layout (the predicted call: packed, or stacked when every value
    # has one shape), or with a layout never seen
    for mode in ("verify", "verification"):
        for route, n in (("agreed", 1), ("agreed_stacked", 2), ("new", 1)):
            for case, spoil in [*_spoilers().items(), ("op", None)]:
                tag = f"{mode}_{route}_{case}"
                if route != "new":
                    hwdist.all_reduce_dict(make("k", n))
                d = make("k" if route != "new" else tag, n)
                arg = spoil(d) if last and spoil is not None else d
                op = "foo" if last and case == "op" else "sum"
                # "verify": verification off, verify=True for the call; "verification": on (the default)
                kwargs = {"verify": True} if mode == "verify" else {}
                with hwdist.verification(mode == "verification"):
                    out[tag] = _timed(hwdist.all_reduce_dict, arg, op, **kwargs)
    # verify=False: a bad value on every rank raises on every rank (before any communication)
    for case, spoil in _spoilers().items():
        out[f"unchecked_{case}"] = _timed(hwdist.all_reduce_dict, spoil(make("k")), verify=False)
    good = make("k")
    hwdist.all_reduce_dict(good)
    out["healthy"] = good["b"].tolist()
    return out


def test_all_reduce_dict_bad_value_on_one_rank_raises_everywhere(dist, combo):
    ws, backend = combo
    if ws == 1:
        pytest.skip("one bad rank among several")
    words = {
        "sparse": "data['b'] must be a dense (strided) tensor, got a sparse_coo tensor",
        "meta": "data['b'] is a meta tensor",
        "ndarray": "data['b'] must be a torch.Tensor, got ndarray",
        "not_dict": "data must be a dict of tensors, got list",
        "op": "op must be one of",
    }
    for r, res in enumerate(dist(check_dict_one_bad_rank, ws, backend)):
        for mode in ("verify", "verification"):
            for route in ("agreed", "agreed_stacked", "new"):
                for case, text in words.items():
                    err, elapsed = res[f"{mode}_{route}_{case}"]
                    assert err is not None, (mode, route, case)
                    assert elapsed < FAST, (mode, route, case, elapsed)
                    kind, msg = err  # the bad rank's message is in its header: every rank names it
                    assert f"rank {ws - 1}: " in msg and text in msg, (mode, route, case, err)
                    bad_rank = case == "not_dict" and r == ws - 1
                    expected = "ArgumentAssertionError" if bad_rank else "ValueError"
                    assert kind == expected, (mode, route, case, err)
        for case, text in words.items():
            if case == "op":
                continue
            err, _ = res[f"unchecked_{case}"]
            kind = "ArgumentAssertionError" if case == "not_dict" else "TypeError"  # mmengine asserts a dict
            assert err == (kind, f"all_reduce_dict: {text}") or (err[0] == kind and text in err[1]), err
        assert res["healthy"] == [float(sum(q + 1 for q in range(ws)))] * 2


# ---------------------------------------------------------------------------
# GradientSynchronizer's bucket config is part of the construction check
# ---------------------------------------------------------------------------
def check_synchronizer_config() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    last = r == ws - 1
    params = [torch.nn.Parameter(torch.ones(BIG)), torch.nn.Parameter(torch.ones(1000))]
    out: dict = {}
    for name, kwargs in {
        "bucket_size_mb": {"bucket_size_mb": 0.001 if last else 10.0},
        "first_bucket_mb": {"first_bucket_mb": 0.001 if last else 1.0},
        "op": {"op": "sum" if last else "mean"},
        "broadcast_from": {"broadcast_from": None if last else 0},
    }.items():
        out[name] = _timed(hwdist.GradientSynchronizer, params, **kwargs)
    sync = hwdist.GradientSynchronizer(params, bucket_size_mb=0.001, first_bucket_mb=0.001)
    for p in params:
        p.grad = torch.full_like(p, r + 1.0)
    sync.wait()
    out["healthy"] = [p.grad.unique().tolist() for p in params]
    return out


def test_gradient_synchronizer_config_differs_on_one_rank(dist, combo):
    ws, backend = combo
    for res in dist(check_synchronizer_config, ws, backend):
        for name in ("bucket_size_mb", "first_bucket_mb", "op", "broadcast_from"):
            err, elapsed = res[name]
            if ws == 1:
                assert err is None
                continue
            assert elapsed < FAST
            assert err[0] == "ValueError", err
            assert (
                "GradientSynchronizer: every rank must pass the same op, bucket_size_mb, first_bucket_mb"
                in err[1]
            ), err
        mean = sum(q + 1.0 for q in range(ws)) / ws
        assert res["healthy"] == [[mean], [mean]]


# ---------------------------------------------------------------------------
# complex gather, sparse tensors, ndarray values, a bad bucket size
# ---------------------------------------------------------------------------
def check_unclear_errors() -> dict:
    r = hwdist.get_rank()
    out: dict = {}
    for dtype in (torch.complex64, torch.complex128):
        z = torch.tensor([complex(r, -r), complex(0.5, r)], dtype=dtype)
        uneven = torch.full((r + 1,), complex(r, 1), dtype=dtype)
        name = str(dtype)[6:]
        out[name] = [t.tolist() for t in hwdist.gather(z, dst=0, same_shape=True)]
        out[name + "_uneven"] = [t.tolist() for t in hwdist.gather(uneven, dst=0)]
        out[name + "_dtype"] = [str(t.dtype) for t in hwdist.gather(z, dst=0)]
    s = torch.ones(3).to_sparse()
    out["sparse"] = {
        "all_reduce": _catch(hwdist.all_reduce, s),
        "broadcast": _catch(hwdist.broadcast, s, 0),
        "all_gather": _catch(hwdist.all_gather, s),
        "gather": _catch(hwdist.gather, s, 0),
        "reduce": _catch(hwdist.reduce, s, 0),
    }
    out["ndarray"] = _timed(hwdist.all_reduce_dict, {"a": np.ones(2)})
    out["bucket"] = _catch(hwdist.all_reduce_params, [torch.ones(1)], bucket_size_mb="x")
    # a group that is not one (torch's name for the world, a rank list): a TypeError naming `group`, raised
    # before anything else (on every rank here, since every rank passes it)
    out["group"] = {
        "all_reduce": _catch(hwdist.all_reduce, torch.ones(1), group="world"),
        "all_reduce_dict": _catch(hwdist.all_reduce_dict, {"a": torch.ones(1)}, group=[0, 1]),
        "broadcast_object_list": _catch(hwdist.broadcast_object_list, [1], 0, group="world"),
        "collect_results": _catch(hwdist.collect_results, [1], 1, group="world"),
    }
    out["healthy"] = _healthy()
    return out


def test_complex_gather_and_clear_errors(dist, combo):
    ws, backend = combo
    for r, res in enumerate(dist(check_unclear_errors, ws, backend)):
        for name in ("complex64", "complex128"):
            if r == 0:
                assert res[name] == [[complex(q, -q), complex(0.5, q)] for q in range(ws)]
                assert res[name + "_uneven"] == [[complex(q, 1)] * (q + 1) for q in range(ws)]
                assert res[name + "_dtype"] == [f"torch.{name}"] * ws
            elif ws > 1:
                assert res[name] == [] and res[name + "_uneven"] == []
        for fn, err in res["sparse"].items():
            assert err is not None and err[0] == "TypeError", (fn, err)
            assert err[1].startswith(
                f"{fn}: data must be a dense (strided) tensor, got a sparse_coo tensor"
            ), err
        err, elapsed = res["ndarray"]
        if ws > 1:  # a one-rank group reduces nothing (mmengine's no-op)
            assert err == ("ValueError", "all_reduce_dict: data['a'] must be a torch.Tensor, got ndarray"), (
                err
            )
            assert elapsed < FAST
        assert res["bucket"] == (
            "TypeError",
            "all_reduce_params: bucket_size_mb must be a number of MiB, got 'x'",
        )
        for fn, err in res["group"].items():
            given = "list: [0, 1]" if fn == "all_reduce_dict" else "str: 'world'"
            want = (
                f"{fn}: group must be a torch.distributed.ProcessGroup or None (the default group),"
                f" got {given}"
            )
            assert err == ("TypeError", want), (fn, err)
        assert res["healthy"] == ws


# ---------------------------------------------------------------------------
# one thread per group at a time (as torch); a second thread's call while one is in flight raises
# ---------------------------------------------------------------------------
def check_two_threads() -> dict:
    from hwdist.collectives import call_entry

    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    own = torch_dist.new_group(list(range(ws)))  # every rank creates it, in the same order
    first = torch.tensor([r + 1.0])
    results: dict = {}

    def slow_partner() -> None:
        results["first"] = _catch(hwdist.all_reduce, first)

    hwdist.barrier()
    if r == 0:
        a = threading.Thread(target=slow_partner)
        a.start()
        deadline = time.monotonic() + 10
        while 0 not in call_entry._in_flight and time.monotonic() < deadline:
            time.sleep(0.005)  # until thread a's all_reduce is in flight (rank 1 joins late)
        for name, call in {
            "all_reduce": lambda: hwdist.all_reduce(torch.ones(1)),
            "broadcast": lambda: hwdist.broadcast(torch.ones(1), 0),
            "all_reduce_dict": lambda: hwdist.all_reduce_dict({"a": torch.ones(1)}),
            "all_reduce_params": lambda: hwdist.all_reduce_params([torch.ones(1)]),
        }.items():
            out[name] = _catch(call)
        other = torch.tensor([10.0])
        hwdist.all_reduce(other, group=own)  # another group: allowed while the first is in flight
        out["other_group"] = other.item()
        a.join(60)
    else:
        time.sleep(1.0)  # rank 0's first thread waits in its all_reduce meanwhile
        hwdist.all_reduce(first)
        other = torch.tensor([10.0])
        hwdist.all_reduce(other, group=own)
        out["other_group"] = other.item()
        results["first"] = None
    out["first"] = (results["first"], first.item())
    # one thread after another (a hand-over) is fine
    t = threading.Thread(target=lambda: results.update(handover=_healthy()))
    t.start()
    t.join(60)
    out["handover"] = (results.get("handover"), _healthy())
    out["left_marked"] = dict(call_entry._in_flight)
    torch_dist.destroy_process_group(own)
    return out


def test_two_threads_on_one_group_are_refused(dist):
    for r, res in enumerate(dist(check_two_threads, 2, "gloo")):
        assert res["first"] == (None, 3.0)
        if r == 0:
            for name in ("all_reduce", "broadcast", "all_reduce_dict", "all_reduce_params"):
                kind, msg = res[name]
                assert kind == "ConcurrentGroupUse", (name, res[name])
                assert msg.startswith(f"{name}: another thread (ident ") and "one thread" in msg, msg
        assert res["other_group"] == 20.0
        assert res["handover"] == (2.0, 2.0)
        assert res["left_marked"] == {}


# ---------- the compat modules ----------
# One rank's bad or different argument in the compat modules: every rank raises, within seconds.



# The marks of this section's tests (slow ones are skipped by the fast lane, -m 'not slow').
_COMPAT_ONE_BAD_RANK_MARKS = pytest.mark.slow


def _cases(tmp: str, last: bool, r: int, ws: int) -> dict:
    f32 = torch.ones(2)
    return {
        "vis4d_ordered_vs_dict": lambda: vis4d.all_reduce_dict(
            OrderedDict(a=torch.ones(1)) if last else {"a": torch.ones(1)}
        ),
        "vis4d_unpicklable": lambda: vis4d.all_gather_object_cpu(
            threading.Lock() if last else {"r": r}, tmpdir=tmp, rank_zero_return_only=False
        ),
        "vis4d_pad_non_tensor": lambda: vis4d.pad_to_largest_tensor([1, 2] if last else torch.ones(2)),
        "vis4d_mean_non_tensor": lambda: vis4d.reduce_mean(1.0 if last else f32),
        "vis4d_mean_dtype": lambda: vis4d.reduce_mean(torch.ones(2, dtype=torch.float64) if last else f32),
        "vis4d_broadcast_src_range": lambda: vis4d.broadcast({"r": r}, src=ws if last else 0),
        "vis4d_broadcast_src_other": lambda: vis4d.broadcast({"r": r}, src=1 if last else 0),
        "vis4d_dict_dtype": lambda: vis4d.all_reduce_dict(
            {"a": torch.ones(2, dtype=torch.float64 if last else torch.float32)}, to_float=False
        ),
        "vis4d_dict_to_float": lambda: vis4d.all_reduce_dict(
            {"a": torch.ones(2, dtype=torch.int32)}, to_float=not last
        ),
        "legacy_broadcast_src": lambda: legacy.broadcast_multigpu([torch.ones(2)], 1 if last else 0),
        "megengine_group": lambda: meg.pack_allreduce_split(
            [torch.ones(2)], [(2,)], "x" if last else None, "sum"
        ),
    }


#: case -> (text every rank's message holds, the bad rank's exception type)
WANT = {
    "vis4d_ordered_vs_dict": (
        "passed an OrderedDict where rank 0 passed a dict",
        hwdist.CollectiveArgumentError,
    ),
    "vis4d_unpicklable": ("data cannot be pickled (TypeError", hwdist.CollectiveArgumentError),
    "vis4d_pad_non_tensor": ("tensor must be a torch.Tensor, got list", TypeError),
    "vis4d_mean_non_tensor": ("tensor must be a torch.Tensor, got float", TypeError),
    "vis4d_mean_dtype": ("reduce_mean: the ranks disagree on the tensor's shape and dtype", ValueError),
    "vis4d_broadcast_src_range": ("broadcast: src must be a rank in [0, ", ValueError),
    "vis4d_broadcast_src_other": ("broadcast: the ranks disagree on src", ValueError),
    "vis4d_dict_dtype": ("differ in shape or dtype", ValueError),
    "vis4d_dict_to_float": ("or their to_float or reduce_op differ", ValueError),
    "legacy_broadcast_src": ("broadcast_multigpu: the ranks disagree on src", ValueError),
    "megengine_group": ("group must be a torch.distributed.ProcessGroup or None (WORLD), got str", TypeError),
}


def _one_bad_rank(tmp: str) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    last = r == ws - 1
    out = {}
    for case in sorted(WANT):  # one after the other on the same ranks: each must leave the group usable
        start = time.monotonic()
        err = None
        try:
            _cases(f"{tmp}/{case}", last, r, ws)[case]()
        except Exception as exc:  # noqa: BLE001 - the test compares type and text
            err = (type(exc).__mro__, str(exc))
        took = time.monotonic() - start
        t = torch.ones(1)
        hwdist.all_reduce(t)  # the group is still usable
        out[case] = {"err": err, "took": took, "after": t.item()}
    return out


@_COMPAT_ONE_BAD_RANK_MARKS
@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("ws", [2, 3])
def test_one_bad_rank_in_the_compat_modules_raises_on_every_rank(dist, ws, backend, tmp_path):
    for r, per_case in enumerate(dist(_one_bad_rank, ws, backend, str(tmp_path))):
        for case, (text, bad_type) in WANT.items():
            res = per_case[case]
            assert res["err"] is not None, (case, r, res)
            mro, msg = res["err"]
            assert text in msg, (case, r, msg)  # the others' messages carry the bad rank's, or the difference
            assert (bad_type if r == ws - 1 else hwdist.CollectiveArgumentError) in mro, (case, r, mro)
            assert res["took"] < 10, (case, r, res["took"])
            assert res["after"] == ws, (case, r, res)


# ---------------------------------------------------------------- calls that cannot go on
TIMEOUT = float(os.environ.get("HWDIST_TEST_TIMEOUT", "240"))


class Nowhere:
    """A user type no allow-list names."""

    def __init__(self, x: int) -> None:
        self.x = x


# ------------------------------------------------------------------ collect_results(weights_only=True)


def _part(rank: int, bad: int, big: bool) -> list:
    """Rank ``rank``'s results; rank ``bad`` holds a ``Nowhere`` at its item 1 (global item 1 * W + bad)."""
    pad = bytes(5000) if big else b""  # big: the part does not fit its 1 KiB record
    return [{"i": rank, "pad": pad}, Nowhere(rank) if rank == bad else {"i": rank + 10}]


def _collect_refused(tmp: str) -> list:
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    bad = world - 1
    out = []
    for big in (False, True):
        for where in (None, os.path.join(tmp, f"shared-{big}")):
            part = _part(rank, bad, big)
            start = time.monotonic()
            try:
                hwdist.collect_results(part, 2 * world, tmpdir=where, weights_only=True)
                out.append(("no error", "", 0.0))
            except Exception as exc:  # noqa: BLE001 (the type and text are the result)
                right = isinstance(exc, (hwdist.WeightsOnlyRefused, pickle.UnpicklingError))
                out.append((type(exc).__name__ if right else f"wrong type {type(exc).__name__}", str(exc),
                            time.monotonic() - start))  # fmt: skip
            # the group still works, and a good collection after it is right
            good = hwdist.collect_results([rank], world, weights_only=True)
            assert good == (list(range(world)) if rank == 0 else None), good
    return out


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", [2, 3])
def test_collect_results_weights_only_refuses_a_type_allowed_nowhere_on_every_rank(
    dist, world_size, backend, tmp_path
):
    """Before the fix: rank 0 raised ``UnpicklingRefused`` while decoding, the others
    ``ObjectCollectiveError``."""
    per_rank = dist(_collect_refused, world_size, backend, str(tmp_path))
    bad = world_size - 1
    for seen in per_rank:
        assert len(seen) == 4
        for kind, msg, seconds in seen:
            assert kind == "WeightsOnlyRefused", (kind, msg)
            assert f"rank(s) {bad}" in msg and "result item 1 (of its part)" in msg, msg
            assert "Nowhere" in msg and "add_safe_globals" in msg, msg
            assert seconds < 30, msg
    for i in range(4):  # the same words on every rank
        assert len({seen[i][1] for seen in per_rank}) == 1, [seen[i][1] for seen in per_rank]


# ------------------------------------------------------------------ a backend for a device this machine lacks


@pytest.fixture(scope="module")
def ranks():
    """``run(fn, *args)``: ``fn`` on 2 live ranks without a process group (each ``fn`` makes its own)."""
    pool = None

    def run(fn, *args):
        nonlocal pool
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
            pool = RankPool(2, None, timeout=TIMEOUT, pg_timeout=60)
        return pool.run(fn, *args)

    yield run
    if pool is not None:
        pool.close()


MISSING_DEVICE_BACKEND = "hpuonly"


def _create(store, rank, size, timeout):
    return torch_dist.ProcessGroupGloo(store, rank, size, timeout)


def _error(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 (the type and text are the result)
        return type(exc).__name__, str(exc), time.monotonic() - start
    return None


def _every_op() -> dict:
    t = lambda: torch.ones(2)  # noqa: E731
    me = torch_dist.get_rank()
    calls = {
        "all_reduce": lambda: hwdist.all_reduce(t()),
        "broadcast": lambda: hwdist.broadcast(t(), src=0),
        "all_gather": lambda: hwdist.all_gather(t()),
        "barrier": hwdist.barrier,
        "all_reduce_dict": lambda: hwdist.all_reduce_dict({"loss": t()}),
        "all_gather_object": lambda: hwdist.all_gather_object(me),
        "gather_object": lambda: hwdist.gather_object(me),
        "broadcast_object_list": lambda: hwdist.broadcast_object_list([me]),
        "collect_results": lambda: hwdist.collect_results([me], 2),
        "sync_random_seed": hwdist.sync_random_seed,
    }
    return {op: _error(call) for op, call in calls.items()}


def _rank_missing_device(store: str) -> dict:
    if MISSING_DEVICE_BACKEND not in torch_dist.Backend.backend_list:
        torch_dist.Backend.register_backend(MISSING_DEVICE_BACKEND, _create, devices=["hpu"])
    rank = int(os.environ["RANK"])
    torch_dist.init_process_group(f"hpu:{MISSING_DEVICE_BACKEND}", init_method=f"file://{store}", rank=rank,
                            world_size=2)  # fmt: skip
    try:
        # rank 1 alone first: were anything sent, its first call would wait for rank 0 (60 s timeout)
        alone = _every_op() if rank == 1 else None
        return {"alone": alone, "both": _every_op()}
    finally:
        hwdist.destroy()


def test_a_group_whose_backend_serves_a_missing_device_is_refused_on_every_rank(ranks, tmp_path):
    """Before the fix: ``AttributeError: 'NoneType' object has no attribute 'current_device'`` from every
    operation, and torch's ``No backend type associated with device type cpu`` from ``barrier``."""
    if not _compat.REGISTER_BACKEND_HAS_DEVICES:
        pytest.skip(f"torch {torch.__version__}: register_backend has no devices= (torch >= 2.2)")
    if hasattr(torch, "hpu"):
        pytest.skip("this torch has a torch.hpu module: the device may be present")
    results = ranks(_rank_missing_device, str(tmp_path / "store"))
    ops = list(results[0]["both"])
    for res in (results[1]["alone"], results[0]["both"], results[1]["both"]):
        for op in ops:
            assert res[op] is not None, f"{op} ran on a group whose device is missing"
            kind, msg, seconds = res[op]
            assert kind == "BackendError", (op, kind, msg)
            assert msg.startswith("the default process group cannot be used here: "), (op, msg)
            assert f"goes to its backend '{MISSING_DEVICE_BACKEND}' on device 'hpu'" in msg, (op, msg)
            assert f"device-to-backend map 'hpu:{MISSING_DEVICE_BACKEND}'" in msg, (op, msg)
            assert "no hpu device is visible" in msg and "Fix: run where 'hpu' devices are visible" in msg
            assert f"init_process_group(backend='hpu:{MISSING_DEVICE_BACKEND},cpu:<backend>')" in msg
            assert seconds < 10, (op, seconds)
    for op in ops:  # the same words on every rank
        assert results[0]["both"][op][1] == results[1]["both"][op][1], op


# ------------------------------------------------------------------ broadcast_object_list's src


def _src_checks(store: str) -> dict:
    rank = int(os.environ["RANK"])
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        one = torch_dist.new_group([1])  # rank 0 is not a member
        both = torch_dist.new_group([0, 1])
        out = {}
        for name, src, group in (
            ("not in a group of one", 0, one),
            ("not in the group", 5, both),
            ("out of the world", 7, None),
            ("not an int", "0", None),
            ("a bool", True, None),
        ):
            data = ["kept"]
            bol = hwdist.broadcast_object_list
            out[name] = {
                "broadcast": _error(lambda: hwdist.broadcast(torch.ones(1), src=src, group=group)),
                "broadcast_object_list": _error(lambda: bol(data, src=src, group=group)),
                "broadcast_object": _error(lambda: hwdist.broadcast_object(rank, src=src, group=group)),
                "data": data,
            }
        box = [f"from {rank}"]
        # a good src in a group of one: nothing moves; outside the group: torch's error (docs/collectives.md)
        out["group of one"] = _error(lambda: hwdist.broadcast_object_list(box, src=1, group=one)), box
        out["after"] = hwdist.broadcast_object(f"from {rank}", src=1, group=both)
        return out
    finally:
        hwdist.destroy()


def test_broadcast_object_list_checks_src_as_broadcast_does(ranks, tmp_path):
    """Before: with a group of one that does not hold ``src`` the call returned with the list unchanged
    on the member and raised torch's ``Invalid process group specified`` on the other rank, while
    ``broadcast`` raised ``ValueError`` on both; other bad sources were reported in other words."""
    for rank, res in enumerate(ranks(_src_checks, str(tmp_path / "store"))):
        for name in ("not in a group of one", "not in the group", "out of the world", "not an int", "a bool"):
            case = res[name]
            kind, want, _ = case["broadcast"]
            assert kind in ("ValueError", "TypeError"), (name, case["broadcast"])
            for op in ("broadcast_object_list", "broadcast_object"):
                assert case[op] is not None, (rank, name, op)
                got_kind, got, _ = case[op]
                assert got_kind == "CollectiveArgumentError", (name, op, got)
                assert issubclass(hwdist.CollectiveArgumentError, getattr(builtins, kind))  # broadcast's kind
                # the same words as broadcast's, naming the call
                assert got == want.replace("broadcast:", "broadcast_object_list:", 1), (name, op, got, want)
            assert case["data"] == ["kept"]
        error, box = res["group of one"]
        assert box == [f"from {rank}"]
        if rank == 1:
            assert error is None
        else:
            # torch's own error: a ValueError (a RuntimeError on torch 2.1)
            assert error[0] in ("ValueError", "RuntimeError") and "Invalid process group" in error[1], error
        assert res["after"] == "from 1"
