"""The hwdist backend on real ranks: every collective torch issues, through an accelerator's limits.

The ranks run ``torch.distributed`` itself (never hwdist's own collectives) on a group created with
``hwdist.init_backend("hwdist:emu-strict")``: the emulated accelerator with no bfloat16, no int64, no MAX,
no AVG and no PREMUL_SUM (tests/backend/_strict.py), whose process group refuses anything outside that
table and counts what it receives. Expected values are computed in each rank from rank numbers alone.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist import _compat
from hwdist.errors import PlanError
from hwdist.testing.pytest_plugin import capture_error

from hwdist.launch.core import destroy, init_backend

from . import _strict

NEED = ".".join(map(str, _compat.PYTHON_BACKENDS_TORCH))
pytestmark = [
    pytest.mark.skipif(not _compat.PYTHON_BACKENDS, reason=f"needs torch >= {NEED} (Python backends)"),
    pytest.mark.timeout(240),
]
BACKEND = f"hwdist:{_strict.STRICT}"


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def _every_op(store: str) -> dict:
    """Every op DDP, FSDP2 and DTensor issue (and the rest), each as (got, expected, the strict calls)."""
    _strict.init(BACKEND, store)
    r, ws = torch_dist.get_rank(), torch_dist.get_world_size()
    ranks = range(ws)
    out: dict = {}

    def case(name, fn, expected):
        before = len(_strict.CALLS)
        got = fn()
        out[name] = (got, expected, _strict.calls()[before:])

    def all_reduce(values, dtype, op):
        t = _t(values, dtype)
        torch_dist.all_reduce(t, op=op)
        return t.tolist()

    base = [float(r + 1), 2.0 * r - 3.0]
    rows = [[float(q + 1), 2.0 * q - 3.0] for q in ranks]
    total = [sum(c) for c in zip(*rows)]
    case("sum fp32", lambda: all_reduce(base, torch.float32, torch_dist.ReduceOp.SUM), total)
    case(
        "avg fp32", lambda: all_reduce(base, torch.float32, torch_dist.ReduceOp.AVG), [v / ws for v in total]
    )
    premul = torch_dist._make_nccl_premul_sum(0.5)
    case("premul fp32", lambda: all_reduce(base, torch.float32, premul), [v * 0.5 for v in total])
    case("sum bf16", lambda: all_reduce(base, torch.bfloat16, torch_dist.ReduceOp.SUM), total)
    ints = [r * 7 - 5, 3 - r]
    irows = [[q * 7 - 5, 3 - q] for q in ranks]
    case(
        "max int32",
        lambda: all_reduce(ints, torch.int32, torch_dist.ReduceOp.MAX),
        [max(c) for c in zip(*irows)],
    )
    case(
        "min int64",
        lambda: all_reduce(ints, torch.int64, torch_dist.ReduceOp.MIN),
        [min(c) for c in zip(*irows)],
    )
    case(
        "max int64",
        lambda: all_reduce(ints, torch.int64, torch_dist.ReduceOp.MAX),
        [max(c) for c in zip(*irows)],
    )

    def coalesced():
        a, b = _t(base), _t(base[::-1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch_dist.all_reduce_coalesced([a, b], op=torch_dist.ReduceOp.AVG)
        return [a.tolist(), b.tolist()]

    case("all_reduce_coalesced avg", coalesced, [[v / ws for v in total], [v / ws for v in total[::-1]]])

    def reduce():
        t = _t(ints, torch.int32)
        torch_dist.reduce(t, dst=ws - 1, op=torch_dist.ReduceOp.MAX)
        return t.tolist() if r == ws - 1 else None

    case("reduce max int32", reduce, [max(c) for c in zip(*irows)] if r == ws - 1 else None)

    def all_gather(dtype):
        outs = [torch.empty(2, dtype=dtype) for _ in ranks]
        torch_dist.all_gather(outs, _t(ints, dtype))
        return [o.tolist() for o in outs]

    case("all_gather int64", lambda: all_gather(torch.int64), irows)

    def into_tensor(dtype):
        o = torch.empty(2 * ws, dtype=dtype)
        torch_dist.all_gather_into_tensor(o, _t(base, dtype))
        return o.tolist()

    case("all_gather_into_tensor bf16", lambda: into_tensor(torch.bfloat16), [v for row in rows for v in row])
    case("all_gather_into_tensor fp32", lambda: into_tensor(torch.float32), [v for row in rows for v in row])

    def into_tensor_coalesced():
        a, b = torch.empty(2 * ws), torch.empty(2 * ws, dtype=torch.int64)
        with torch_dist._coalescing_manager(async_ops=True) as cm:
            torch_dist.all_gather_into_tensor(a, _t(base))
            torch_dist.all_gather_into_tensor(b, _t(ints, torch.int64))
        cm.wait()
        return [a.tolist(), b.tolist()]

    flat_rows, flat_irows = [v for row in rows for v in row], [v for row in irows for v in row]
    case("all_gather_into_tensor_coalesced", into_tensor_coalesced, [flat_rows, flat_irows])

    scatter_in = [[float(10 * q + j + r) for j in range(2)] for q in ranks]  # rank r's piece for rank q

    def rs_expected(q):
        return [sum(10 * q + j + p for p in ranks) for j in range(2)]

    def reduce_scatter_list(op):
        o = torch.empty(2)
        torch_dist.reduce_scatter(o, [_t(p) for p in scatter_in], op=op)
        return o.tolist()

    case(
        "reduce_scatter avg",
        lambda: reduce_scatter_list(torch_dist.ReduceOp.AVG),
        [v / ws for v in rs_expected(r)],
    )

    def reduce_scatter_tensor(dtype, op):
        o = torch.empty(2, dtype=dtype)
        torch_dist.reduce_scatter_tensor(o, _t([v for p in scatter_in for v in p], dtype), op=op)
        return o.tolist()

    case(
        "reduce_scatter_tensor bf16 sum",
        lambda: reduce_scatter_tensor(torch.bfloat16, torch_dist.ReduceOp.SUM),
        rs_expected(r),
    )
    case(
        "reduce_scatter_tensor fp32 avg",
        lambda: reduce_scatter_tensor(torch.float32, torch_dist.ReduceOp.AVG),
        [v / ws for v in rs_expected(r)],
    )
    case(
        "reduce_scatter_tensor int32 max",
        lambda: reduce_scatter_tensor(torch.int32, torch_dist.ReduceOp.MAX),
        [max(10 * r + j + p for p in ranks) for j in range(2)],
    )

    def rs_coalesced():
        a, b = torch.empty(2), torch.empty(2)
        flat = _t([v for p in scatter_in for v in p])
        with torch_dist._coalescing_manager(async_ops=True) as cm:
            torch_dist.reduce_scatter_tensor(a, flat, op=torch_dist.ReduceOp.AVG)
            torch_dist.reduce_scatter_tensor(b, flat * 2, op=torch_dist.ReduceOp.AVG)  # one op per window
        cm.wait()
        return [a.tolist(), b.tolist()]

    avg = [v / ws for v in rs_expected(r)]
    case("reduce_scatter_tensor_coalesced", rs_coalesced, [avg, [2 * v for v in avg]])

    def broadcast():
        t = _t([2**40 + r, -r], torch.int64)
        torch_dist.broadcast(t, src=ws - 1)
        return t.tolist()

    case("broadcast int64", broadcast, [2**40 + ws - 1, -(ws - 1)])

    def a2a_even():
        o = torch.empty(2 * ws)
        torch_dist.all_to_all_single(o, _t([float(100 * r + k) for k in range(2 * ws)]))
        return o.tolist()

    case("all_to_all_single even", a2a_even, [float(100 * q + 2 * r + j) for q in ranks for j in range(2)])

    def a2a_uneven():  # rank q sends q + 1 rows to every rank; a row is 2 int64 values
        ins = _t(
            [[1000 * r + 10 * k + j for j in range(2)] for k in range(ws) for _ in range(r + 1)], torch.int64
        )
        o = torch.empty(sum(q + 1 for q in ranks), 2, dtype=torch.int64)
        torch_dist.all_to_all_single(o, ins, [q + 1 for q in ranks], [r + 1] * ws)
        return o.tolist()

    a2a_want = [[1000 * q + 10 * r + j for j in range(2)] for q in ranks for _ in range(q + 1)]
    case("all_to_all_single uneven int64", a2a_uneven, a2a_want)

    def a2a_list():
        outs = [torch.empty(1) for _ in ranks]
        torch_dist.all_to_all(outs, [_t([float(10 * r + q)]) for q in ranks])
        return [o.tolist() for o in outs]

    case("all_to_all list", a2a_list, [[float(10 * q + r)] for q in ranks])
    case("barrier", lambda: torch_dist.barrier(), None)

    def p2p():
        if r == 0:
            torch_dist.send(_t([2**40, 5], torch.int64), dst=ws - 1)
            return None
        if r == ws - 1:
            t = torch.empty(2, dtype=torch.int64)
            torch_dist.recv(t, src=0)
            return t.tolist()
        return None

    case("send/recv int64", p2p, [2**40, 5] if r == ws - 1 and ws > 1 else None)

    def gather():
        lst = [torch.empty(2, dtype=torch.int64) for _ in ranks] if r == 0 else None
        torch_dist.gather(_t(ints, torch.int64), lst, dst=0)
        return [x.tolist() for x in lst] if lst is not None else None

    case("gather int64", gather, irows if r == 0 else None)

    def scatter():
        o = torch.empty(2, dtype=torch.bfloat16)
        lst = [_t([float(q), -1.0], torch.bfloat16) for q in ranks] if r == 0 else None
        torch_dist.scatter(o, lst, src=0)
        return o.tolist()

    case("scatter bf16", scatter, [float(r), -1.0])
    _strict.done()
    return out


def test_every_collective_gives_the_plain_result_through_the_strict_table(dist, tmp_path):
    for rank_result in dist(_every_op, 2, None, str(tmp_path / "store")):
        for name, (got, expected, _) in rank_result.items():
            assert got == expected, (name, got, expected)


def test_spy_shows_each_plan_on_the_wrapped_backend(dist, tmp_path):
    result = dist(_every_op, 2, None, str(tmp_path / "store"))[0]
    calls = {name: c for name, (_, _, c) in result.items()}
    assert calls["sum fp32"] == [("all_reduce", "sum", "float32")]  # pass-through
    assert calls["avg fp32"] == [("all_reduce", "sum", "float32")]  # AVG as SUM, then / ws here
    assert calls["premul fp32"] == [("all_reduce", "sum", "float32")]  # PREMUL_SUM as a multiply, then SUM
    assert calls["sum bf16"] == [("all_reduce", "sum", "float32")]  # bfloat16 summed in float32
    assert calls["max int32"] == [("all_gather", None, "int32")]  # no MAX: all_gather, then max here
    assert calls["min int64"] == [("all_gather", None, "uint8")]  # no int64: its bytes, then min here
    assert calls["reduce_scatter_tensor fp32 avg"] == [("all_reduce", "sum", "float32")]  # no reduce_scatter
    assert calls["all_gather_into_tensor fp32"] == [("all_gather", None, "float32")]  # pass-through
    assert calls["all_gather_into_tensor bf16"] == [("all_gather", None, "uint8")]  # a byte view
    assert calls["broadcast int64"] == [("broadcast", None, "uint8")]
    assert [c[0] for c in calls["all_to_all_single uneven int64"]] == [
        "all_gather",
        "all_gather",
    ]  # sizes, data
    assert calls["gather int64"] == [("all_gather", None, "uint8")]
    assert calls["scatter bf16"] == [("broadcast", None, "uint8")]
    assert calls["all_reduce_coalesced avg"] == [("all_reduce", "sum", "float32")] * 2


def _plan_error_everywhere(store: str) -> dict:
    _strict.init(BACKEND, store)
    t = _t([2**40], torch.int64)
    err = capture_error(torch_dist.all_reduce, t)  # int64 SUM: no int64 and no lossless widening
    moved = len(_strict.CALLS)
    after = _t([1.0])
    torch_dist.all_reduce(after)  # the group is in step: nothing was sent
    _strict.done()
    return {"err": err, "moved": moved, "after": after.item(), "t": t.item()}


def test_no_plan_raises_plan_error_on_every_rank_before_any_data_moves(dist, tmp_path):
    results = dist(_plan_error_everywhere, 2, None, str(tmp_path / "store"))
    for res in results:
        kind, text = res["err"]
        assert kind == PlanError.__name__, res
        assert "int64" in text and "'hwdist'" in text and "HINT" in text, text
        assert res["moved"] == 0 and res["after"] == 2.0 and res["t"] == 2**40


def _work_types(store: str) -> dict:
    from hwdist.backend._work import ThenWork

    _strict.init(BACKEND, store)
    backend = torch_dist.group.WORLD._get_backend(torch.device("cpu"))
    opts = torch_dist.AllreduceOptions()
    opts.reduceOp = torch_dist.ReduceOp.SUM
    t32, t16 = _t([1.0]), _t([1.0], torch.bfloat16)
    passed, cast = backend.allreduce([t32], opts), backend.allreduce([t16], opts)
    cast.wait()
    passed.wait()
    out = {
        "backend": type(backend).__name__,
        "name": backend.getBackendName(),
        "passed": isinstance(passed, ThenWork),
        "cast": isinstance(cast, ThenWork),
        "values": (t32.item(), t16.item()),
        "inner_work": type(passed).__module__.startswith("torch"),
    }
    _strict.done()
    return out


def test_pass_through_returns_the_wrapped_backends_own_work(dist, tmp_path):
    for res in dist(_work_types, 2, None, str(tmp_path / "store")):
        assert res["backend"] == "HwdistBackend" and res["name"] == "hwdist", res
        assert not res["passed"] and res["inner_work"] and res["cast"], res
        assert res["values"] == (2.0, 2.0), res


def _flight(store: str) -> dict:
    _strict.init(BACKEND, store)
    t = _t([1.0, 2.0])
    torch_dist.all_reduce(t)  # SITE-raw
    o = torch.empty(4, dtype=torch.bfloat16)
    half = t.to(torch.bfloat16)  # kept alive: the ring holds a finished call's tensor weakly
    torch_dist.all_gather_into_tensor(o, half)
    hwdist.all_reduce(t)  # hwdist's own call: recorded once, as that call
    sub = torch_dist.new_group(backend="cpu:hwdist")  # made by torch directly, through the wrapper
    torch_dist.all_reduce(t, group=sub)
    torch_dist.all_reduce(t, group=sub, op=torch_dist.ReduceOp.AVG)  # a planned route: SUM then divide
    torch_dist.all_reduce(t, group=sub, op=torch_dist._make_nccl_premul_sum(0.5))  # never kept
    tg = sub._get_backend(torch.device("cpu"))._only
    routes = (
        sorted(k[0] for k in tg.passes),
        sorted((k[0], v[1]) for k, v in tg.routes.items()),
    )
    subs = [e for e in hwdist.flight.snapshot() if e["group"] != "default"]
    deadline = time.monotonic() + 10
    while True:  # calls through the backend are completed by a sweeper thread, off the call's path
        entries = [e for e in hwdist.flight.snapshot() if e["group"] == "default"][-3:]
        if all(e["state"] != "issued" for e in entries) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    _strict.done()
    return {
        "entries": [(e["op"], e["args"], e["state"], e["site"], e["seq"]) for e in entries],
        "backends": sorted({e["backend"] for e in entries} | {e["backend"] for e in subs}),
        "sub_ops": [e["op"] for e in subs],
        "routes": routes,
    }


def test_every_call_through_the_backend_enters_the_flight_recorder(dist, tmp_path):
    from pathlib import Path

    here = Path(__file__)
    line = next(i for i, ln in enumerate(here.read_text().splitlines(), 1) if ln.endswith("# SITE-raw"))
    for res in dist(_flight, 2, None, str(tmp_path / "store")):
        (op1, args1, st1, site1, s1), (op2, args2, st2, _, s2), (op3, _, st3, _, s3) = res["entries"]
        assert (op1, args1, st1) == ("all_reduce", "float32[2]", "completed"), res
        assert site1.endswith(f"{here.name}:{line}"), res
        assert (op2, args2, st2) == ("all_gather_into_tensor", "bfloat16[2]", "completed"), res
        assert (op3, st3) == ("all_reduce", "completed") and (s2, s3) == (s1 + 1, s1 + 2), res
        # the records name the wrapped backend, on the default group and on a group torch made itself
        assert res["backends"] == [f"hwdist:{_strict.STRICT}"], res
        assert res["sub_ops"] == ["all_reduce"] * 3, res
        # a pass-through and a planned route are kept per (op, dtype, reduce op, device); PREMUL_SUM never
        assert res["routes"] == (["allreduce"], [("allreduce", "mean")]), res


def _hwdist_calls_on_a_wrapper_group(store: str) -> dict:
    """hwdist's own collectives on a group of the hwdist backend, and a receive from any source."""
    _strict.init(BACKEND, store)
    r = torch_dist.get_rank()
    out: dict = {"driver": hwdist.registry.resolve().name}
    x = _t([r + 1], torch.bfloat16)  # no bfloat16 in the strict table: the wrapped driver's cast runs
    hwdist.all_reduce(x)
    out["sum"] = x.item()
    if r == 0:
        hwdist.send(_t([7.0]), dst=1)
    else:
        got = torch.empty(1)
        out["src"] = hwdist.recv(got, src=0)
        out["got"] = got.item()
        out["torch anysource"] = capture_error(torch_dist.recv, torch.empty(1))
        out["hwdist anysource"] = capture_error(hwdist.recv, torch.empty(1))
    after = _t([1.0])
    torch_dist.all_reduce(after)  # nothing was received or left half-done: the group is in step
    out["after"] = after.item()
    _strict.done()
    return out


def test_hwdist_collectives_on_a_wrapper_group_plan_as_the_wrapped_driver_and_any_source_is_refused(
    dist, tmp_path
):
    r0, r1 = dist(_hwdist_calls_on_a_wrapper_group, 2, None, str(tmp_path / "store"))
    for res in (r0, r1):
        assert res["driver"] == _strict.STRICT and res["sum"] == 3.0 and res["after"] == 2.0, res
    assert (r1["src"], r1["got"]) == (0, 7.0), r1
    for key in ("torch anysource", "hwdist anysource"):
        kind, text = r1[key]
        assert kind == "BackendError" and "src=None" in text and "HINT: pass src=" in text, (key, text)


def _gloo_reduce_scatters(store: str) -> dict:
    """Waited pass-through reduce_scatters through a wrapper of real gloo, whose own reduce_scatter Works
    never report completion: what the flight recorder holds afterwards."""
    from hwdist.backend import _inflight

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_backend("hwdist:gloo", rank=rank, world_size=ws, init_method=f"file://{store}", timeout=60)
    rows = torch.arange(ws * 4, dtype=torch.float32) + rank  # row q of rank r: 4q .. 4q + 3, plus r
    flat, listed = torch.empty(4), torch.empty(4)
    for _ in range(20):
        torch_dist.reduce_scatter_tensor(flat, rows, async_op=True).wait()
        torch_dist.reduce_scatter(listed, list(rows.chunk(ws)), async_op=True).wait()
    _inflight.sweep()
    ops = ("reduce_scatter_tensor", "reduce_scatter")
    out = {
        "rank": rank, "ws": ws, "flat": flat.tolist(), "listed": listed.tolist(),
        "states": sorted({e["state"] for e in hwdist.flight.snapshot() if e["op"] in ops}),
        "in flight": _inflight.sweep(),  # the calls the recorder still tracks after a sweep
    }  # fmt: skip
    destroy()
    return out


def test_waited_reduce_scatters_on_gloo_leave_nothing_in_flight(dist, tmp_path):
    # gloo's reduce_scatter Works say is_completed() False even after wait(): the wrapper hands them back in
    # a Work that reports completion once waited, so the recorder lets the calls and their buffers go
    for res in dist(_gloo_reduce_scatters, 2, None, str(tmp_path / "store")):
        r, ws = res["rank"], res["ws"]
        expected = [float(sum(4 * r + i + q for q in range(ws))) for i in range(4)]
        assert res["flat"] == expected and res["listed"] == expected, res
        assert res["states"] == ["completed"] and res["in flight"] == 0, res


def _gloo_gathers_in_quick_succession(store: str) -> dict:
    """Waited pass-through all_gathers through a wrapper of real gloo, six calls within a few milliseconds
    (the recorder's thread sweeps every 100 ms): what the recorder still holds after each call."""
    from hwdist.backend import _inflight

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_backend("hwdist:gloo", rank=rank, world_size=ws, init_method=f"file://{store}", timeout=60)
    shard = torch.full((3,), float(rank + 1))
    out = torch.empty(3 * ws)
    held = []
    for _ in range(6):
        torch_dist.all_gather_into_tensor(out, shard)
        held.append(_inflight.held())
    states = [e["state"] for e in hwdist.flight.snapshot() if e["op"] == "all_gather_into_tensor"][-6:]
    res = {"rank": rank, "ws": ws, "out": out.tolist(), "held": held, "states": states}
    destroy()
    return res


def test_a_waited_call_is_let_go_by_the_next_call_not_by_the_thread(dist, tmp_path):
    # the recorder holds each call's Work (and the buffers it keeps) until the call ends: the next call
    # through the backend ends the ones that completed, so the allocator can reuse their memory at once
    for res in dist(_gloo_gathers_in_quick_succession, 2, None, str(tmp_path / "store")):
        ws = res["ws"]
        assert res["out"] == [float(q + 1) for q in range(ws) for _ in range(3)], res
        # at most the call just made (ended already where gloo had finished it), however many came before
        assert all(n <= 1 for n in res["held"]), res
        assert res["states"][:-1] == ["completed"] * 5 and res["states"][-1] in ("issued", "completed"), res
