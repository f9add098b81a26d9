"""Tensor collectives on real ranks: gloo and the emulated accelerator, world sizes 1, 2, 3.

Each rank function bundles many checks and returns plain data; the test
compares it with values computed here from rank numbers alone. On 'emu' the
process group itself refuses whatever its driver declares unsupported, so
every cast, byte view and emulation path is exercised for real.
"""

from __future__ import annotations

import math

import pytest
import torch

import hwdist
from hwdist.testing.pytest_plugin import capture_error as _catch

R = torch.distributed.ReduceOp




# ---------------------------------------------------------------------------
# all_reduce and reduce
# ---------------------------------------------------------------------------
def check_all_reduce() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}

    def run(t, op="sum"):
        hwdist.all_reduce(t, op)
        return t.tolist()

    out["f32"] = {op: run(torch.tensor([r + 1.0, -2.0 * r]), op) for op in ("sum", "mean", "product", "min", "max")}
    out["names"] = [
        run(torch.tensor([r + 1.0]), "SUM"),
        run(torch.tensor([r + 1.0]), "Mean"),
        run(torch.tensor([r + 1.0]), R.SUM),
        run(torch.tensor([r + 1.0]), R.AVG),
        run(torch.tensor([r + 1.0]), R.MAX),
    ]
    # integer mean: sum in a wider int (100+r overflows int8 when summed), floor division
    i8 = torch.tensor([100 + r, -r - 1], dtype=torch.int8)
    out["i8_mean"] = (run(i8, "mean"), str(i8.dtype))
    out["i32_bits"] = {}
    for op in ("band", "bor", "bxor", "sum"):
        t = torch.tensor([1 << r, 7], dtype=torch.int32)
        out["i32_bits"][op] = _catch(hwdist.all_reduce, t, op) or t.tolist()
    out["i64"] = _catch(hwdist.all_reduce, torch.tensor([2**40 + r]))
    if out["i64"] is None:
        t = torch.tensor([2**40 + r])
        hwdist.all_reduce(t)
        out["i64"] = t.tolist()
    out["bool"] = {op: run(torch.tensor([r == 0, True, False]), op) for op in ("sum", "min", "max", "product")}
    bf = torch.tensor([r + 1.0, 0.5], dtype=torch.bfloat16)
    out["bf16_mean"] = (run(bf, "mean"), str(bf.dtype))
    out["f16"] = run(torch.tensor([r + 0.5], dtype=torch.float16))
    c = torch.tensor([complex(r, -r)], dtype=torch.complex64)
    hwdist.all_reduce(c)
    out["c64"] = [(z.real, z.imag) for z in c.tolist()]
    base = torch.arange(6.0).reshape(2, 3) + r
    nc = base.t()
    hwdist.all_reduce(nc)
    out["noncontig"] = (nc.tolist(), nc.data_ptr() == base.data_ptr(), nc.stride())
    z = torch.tensor(r + 1.0)
    hwdist.all_reduce(z, "mean")
    out["zero_d"] = (z.item(), tuple(z.shape))
    a = torch.tensor([r + 1.0], dtype=torch.bfloat16)
    h = hwdist.all_reduce(a, "mean", async_op=True)
    h.wait()
    out["async_cast"] = a.tolist()
    b = torch.tensor([r + 1.0])
    hwdist.all_reduce(b, async_op=True).wait()
    out["async_pass"] = b.tolist()
    p = torch.nn.Parameter(torch.full((2,), r + 1.0, dtype=torch.bfloat16))
    hwdist.all_reduce(p, "mean")
    out["param"] = p.tolist()
    out["reduce_mean"] = (hwdist.reduce_mean(torch.tensor([r * 2.0])).tolist(), hwdist.reduce_mean(torch.tensor([3.0])).tolist())
    # reduce to the last rank
    dst = ws - 1
    t = torch.tensor([r + 1.0, 2.0])
    hwdist.reduce(t, dst=dst)
    m = torch.tensor([r + 1], dtype=torch.int32)
    hwdist.reduce(m, dst=dst, op="mean")
    bfr = torch.tensor([r + 1.0], dtype=torch.bfloat16)
    hwdist.reduce(bfr, dst=dst, op="max", async_op=True).wait()
    out["reduce"] = (t.tolist(), m.tolist(), bfr.tolist()) if r == dst else None
    return out


def test_all_reduce_and_reduce(dist, combo):
    ws, backend = combo
    vals = [r + 1.0 for r in range(ws)]
    neg = [-2.0 * r for r in range(ws)]
    for r, got in enumerate(dist(check_all_reduce, ws, backend)):
        f = got["f32"]
        assert f["sum"] == [sum(vals), sum(neg)]
        assert f["mean"] == pytest.approx([sum(vals) / ws, sum(neg) / ws])
        assert f["product"] == [math.prod(vals), math.prod(neg)]
        assert f["min"] == [min(vals), min(neg)] and f["max"] == [max(vals), max(neg)]
        assert got["names"] == [[sum(vals)], [pytest.approx(sum(vals) / ws)], [sum(vals)], [pytest.approx(sum(vals) / ws)], [max(vals)]]
        # floor of the exact mean, no int8 overflow, dtype kept
        assert got["i8_mean"] == ([sum(100 + i for i in range(ws)) // ws, sum(-i - 1 for i in range(ws)) // ws], "torch.int8")
        bits = [1 << i for i in range(ws)]
        band, bor, bxor = bits[0], 0, 0
        for b in bits:
            band &= b
            bor |= b
            bxor ^= b
        if "band" not in hwdist.get_driver(backend).reduce_ops:  # emu, nccl: PlanError on every rank, no collective
            for op in ("band", "bor", "bxor"):
                kind, msg = got["i32_bits"][op]
                assert kind == "PlanError" and f"op='{op}'" in msg and "not supported" in msg
        else:
            assert got["i32_bits"]["band"] == [band, 7] and got["i32_bits"]["bor"] == [bor, 7]
            assert got["i32_bits"]["bxor"] == [bxor, 7 if ws % 2 else 0]
        assert got["i32_bits"]["sum"] == [sum(bits), 7 * ws]
        if backend == "emu":  # no int64 on the wire and no lossless cast: a clear error, every rank
            kind, msg = got["i64"]
            assert kind == "PlanError" and "int64" in msg and "lossless" in msg
        else:
            assert got["i64"] == [ws * 2**40 + sum(range(ws))]
        any0 = [True, True, False]  # rank 0 has True in slot 0
        all0 = [ws == 1, True, False]
        assert got["bool"] == {"sum": any0, "max": any0, "min": all0, "product": all0}
        assert got["bf16_mean"] == ([sum(vals) / ws, 0.5], "torch.bfloat16")
        assert got["f16"] == [sum(i + 0.5 for i in range(ws))]
        assert got["c64"] == [(float(sum(range(ws))), -float(sum(range(ws))))]
        expect_nc = (torch.arange(6.0).reshape(2, 3) * ws + sum(range(ws))).t().tolist()
        assert got["noncontig"] == (expect_nc, True, (1, 3))
        assert got["zero_d"] == (pytest.approx(sum(vals) / ws), ())
        assert got["async_cast"] == [sum(vals) / ws] and got["async_pass"] == [sum(vals)]
        assert got["param"] == [sum(vals) / ws] * 2
        assert got["reduce_mean"] == ([pytest.approx(sum(2.0 * i for i in range(ws)) / ws)], [3.0])
        if r == ws - 1:
            assert got["reduce"] == ([sum(vals), 2.0 * ws], [sum(i + 1 for i in range(ws)) // ws], [max(vals)])


# ---------------------------------------------------------------------------
# all_gather, gather, pad_to_largest_tensor
# ---------------------------------------------------------------------------
def _item(r: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([r % 2 == 0, True])
    if dtype.is_complex:
        return torch.tensor([complex(r, 1)], dtype=dtype)
    if dtype == torch.int64:
        return torch.tensor([2**40 + r, -r])
    return torch.tensor([r + 0.5, 1.0], dtype=dtype)


GATHER_DTYPES = (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex128, torch.int16)


def check_gathers() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    out["dtypes"] = {str(dt): [t.tolist() for t in hwdist.all_gather(_item(r, dt))] for dt in GATHER_DTYPES}
    out["same_shape"] = [t.tolist() for t in hwdist.all_gather(_item(r, torch.int64), same_shape=True)]
    # uneven shapes, different ndim, one with more dims than the first exchange carries
    uneven = torch.arange((r + 1) * 2, dtype=torch.int64).reshape(r + 1, 2) + 2**40
    got = hwdist.all_gather(uneven)
    out["uneven"] = [(tuple(t.shape), t.tolist(), str(t.dtype)) for t in got]
    nd = torch.full((1,) * r + (2,), float(r))
    out["ndim"] = [tuple(t.shape) for t in hwdist.all_gather(nd)]
    deep = torch.zeros((1,) * 7 + (r + 1,), dtype=torch.int32) + r
    out["deep"] = [(tuple(t.shape), int(t.sum())) for t in hwdist.all_gather(deep)]
    out["zero_d"] = [t.item() for t in hwdist.all_gather(torch.tensor(r * 10))]
    nc = (torch.arange(6.0).reshape(2, 3) + r).t()
    out["noncontig"] = [t.tolist() for t in hwdist.all_gather(nc)]
    h = hwdist.all_gather(torch.tensor([r], dtype=torch.bfloat16), async_op=True)
    out["async"] = [t.tolist() for t in h.wait()]
    dst = ws - 1
    g = hwdist.gather(torch.arange(r + 1, dtype=torch.int64) + 2**40, dst=dst)
    out["gather"] = [t.tolist() for t in g]
    out["gather_bool"] = [t.tolist() for t in hwdist.gather(torch.tensor([r == 1]), dst=0, same_shape=True)]
    sizes, padded = hwdist.pad_to_largest_tensor(torch.ones(r + 1, 2, dtype=torch.uint8))
    out["pad"] = (sizes, padded.tolist())
    if ws > 1:  # a dtype mismatch is found by the shape exchange and raised on every rank
        out["dtype_mismatch"] = _catch(hwdist.all_gather, torch.ones(2, dtype=torch.float64 if r == 1 else torch.float32))
    return out


def test_all_gather_gather_any_dtype_and_shape(dist, combo):
    ws, backend = combo
    for r, got in enumerate(dist(check_gathers, ws, backend)):
        for dt in GATHER_DTYPES:
            assert got["dtypes"][str(dt)] == [_item(i, dt).tolist() for i in range(ws)], dt
        assert got["same_shape"] == [[2**40 + i, -i] for i in range(ws)]
        assert got["uneven"] == [
            ((i + 1, 2), (torch.arange((i + 1) * 2).reshape(i + 1, 2) + 2**40).tolist(), "torch.int64") for i in range(ws)
        ]
        assert got["ndim"] == [(1,) * i + (2,) for i in range(ws)]
        assert got["deep"] == [((1,) * 7 + (i + 1,), i * (i + 1)) for i in range(ws)]
        assert got["zero_d"] == [10 * i for i in range(ws)]
        assert got["noncontig"] == [(torch.arange(6.0).reshape(2, 3) + i).t().tolist() for i in range(ws)]
        assert got["async"] == [[float(i)] for i in range(ws)]
        if r == ws - 1:
            assert got["gather"] == [[2**40 + k for k in range(i + 1)] for i in range(ws)]
        else:
            assert got["gather"] == []
        assert got["gather_bool"] == ([[i == 1] for i in range(ws)] if r == 0 else [])
        width = ws * 2
        assert got["pad"] == ([2 * (i + 1) for i in range(ws)], [1] * (2 * (r + 1)) + [0] * (width - 2 * (r + 1)))
        if ws > 1:
            kind, msg = got["dtype_mismatch"]
            assert kind == "TypeError" and "rank 1: float64" in msg and "rank 0: float32" in msg


# ---------------------------------------------------------------------------
# broadcast, scatter, reduce_scatter, all_to_all, point to point, seed
# ---------------------------------------------------------------------------
def check_movers() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    src = ws - 1
    out: dict = {}
    b = torch.tensor([2**40 + r, r])
    hwdist.broadcast(b, src=src)
    base = torch.arange(6.0).reshape(2, 3) + r
    nc = base.t()
    hwdist.broadcast(nc, src=src)
    flag = torch.tensor(r == src)
    hwdist.broadcast(flag, src=src, async_op=True).wait()
    bf = torch.tensor([r + 0.25], dtype=torch.bfloat16)
    hwdist.broadcast(bf, src=src)
    out["broadcast"] = (b.tolist(), nc.tolist(), nc.data_ptr() == base.data_ptr(), flag.item(), bf.tolist())
    out["seed"] = hwdist.sync_random_seed()
    # scatter: int64 (byte view on emu), from the last rank
    data = torch.zeros(2, dtype=torch.int64)
    lst = [torch.tensor([2**40 + i, -i]) for i in range(ws)] if r == src else None
    hwdist.scatter(data, lst, src=src)
    f = torch.zeros(1, 2)
    flst = [torch.full((1, 2), i + 0.5) for i in range(ws)] if r == src else None
    hwdist.scatter(f, flst, src=src, async_op=True).wait()
    out["scatter"] = (data.tolist(), f.tolist())
    bad = [torch.zeros(3, dtype=torch.int64)] * ws if r == src else None  # wrong shape on src only
    out["scatter_bad"] = _catch(hwdist.scatter, torch.zeros(2, dtype=torch.int64), bad, src)
    # reduce_scatter: list form and flat-tensor form, sum and mean, bf16 (widened on emu)
    o = torch.zeros(2)
    hwdist.reduce_scatter(o, [torch.tensor([i + 1.0, r + 1.0]) for i in range(ws)])
    o2 = torch.zeros(1, dtype=torch.bfloat16)
    hwdist.reduce_scatter(o2, torch.arange(ws, dtype=torch.bfloat16) + r, op="mean")
    o3 = torch.zeros(1, dtype=torch.int32)
    hwdist.reduce_scatter(o3, [torch.tensor([r + i], dtype=torch.int32) for i in range(ws)], op="max", async_op=True).wait()
    out["reduce_scatter"] = (o.tolist(), o2.tolist(), o3.tolist())
    # all_to_all with pieces of different sizes: rank j sends j + k + 1 values to rank k
    ins = [torch.full((r + k + 1,), 100 * r + k, dtype=torch.int64) for k in range(ws)]
    outs = [torch.empty(j + r + 1, dtype=torch.int64) for j in range(ws)]
    hwdist.all_to_all(outs, ins)
    out["all_to_all"] = [t.tolist() for t in outs]
    # point to point ring: send to the next rank, receive from the previous
    if ws > 1:
        nxt, prv = (r + 1) % ws, (r - 1) % ws
        h = hwdist.isend(torch.tensor([2**40 + r, r]), nxt)
        got = torch.zeros(2, dtype=torch.int64)
        sender = hwdist.recv(got, prv)
        h.wait()
        h2 = hwdist.isend(torch.tensor([r + 0.5], dtype=torch.bfloat16), nxt, tag=3)
        got2 = torch.zeros(1, dtype=torch.bfloat16)
        sender2 = hwdist.irecv(got2, None, tag=3).wait()
        h2.wait()
        if r == 0:
            hwdist.send(torch.tensor([True, False]), 1)
            got3 = None
        elif r == 1:
            got3 = torch.zeros(2, dtype=torch.bool)
            hwdist.recv(got3, 0)
            got3 = got3.tolist()
        else:
            got3 = None
        out["p2p"] = (got.tolist(), sender, got2.tolist(), sender2, got3)
    return out


def test_broadcast_scatter_reduce_scatter_all_to_all_p2p(dist, combo):
    ws, backend = combo
    src = ws - 1
    results = dist(check_movers, ws, backend)
    assert len({got["seed"] for got in results}) == 1
    for r, got in enumerate(results):
        assert got["broadcast"] == (
            [2**40 + src, src],
            (torch.arange(6.0).reshape(2, 3) + src).t().tolist(),
            True,
            True,
            [src + 0.25],
        )
        assert got["scatter"] == ([2**40 + r, -r], [[r + 0.5, r + 0.5]])
        kind, msg = got["scatter_bad"]
        assert kind == "ValueError"
        assert ("scatter_list[0] has shape (3,)" in msg) if r == src else (f"src rank {src} was invalid" in msg)
        assert got["reduce_scatter"][0] == [ws * (r + 1.0), sum(i + 1.0 for i in range(ws))]
        assert got["reduce_scatter"][1] == [pytest.approx(sum(r + i for i in range(ws)) / ws, rel=1e-2)]
        assert got["reduce_scatter"][2] == [ws - 1 + r]
        assert got["all_to_all"] == [[100 * j + r] * (j + r + 1) for j in range(ws)]
        if ws > 1:
            prv = (r - 1) % ws
            assert got["p2p"] == ([2**40 + prv, prv], prv, [prv + 0.5], prv, [True, False] if r == 1 else None)


# ---------------------------------------------------------------------------
# bad input: a clear error on every rank, and the group still works afterwards
# ---------------------------------------------------------------------------
def check_bad_inputs() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    t = torch.ones(2)
    cases = {
        "op": _catch(hwdist.all_reduce, t, "average"),
        "op_obj": _catch(hwdist.all_reduce, t, 3.5),
        "dict_op": _catch(hwdist.all_reduce_dict, {"a": t}, "nope"),
        "data": _catch(hwdist.all_reduce, [1.0, 2.0]),
        "gather_data": _catch(hwdist.all_gather, "x"),
        "src": _catch(hwdist.broadcast, t, ws),
        "src_type": _catch(hwdist.broadcast, t, "0"),
        "dst": _catch(hwdist.gather, t, -1),
        "reduce_dst": _catch(hwdist.reduce, t, ws + 5),
        "scatter_src": _catch(hwdist.scatter, t, None, ws),
        "rs_len": _catch(hwdist.reduce_scatter, t, [t] * (ws + 1)),
        "rs_numel": _catch(hwdist.reduce_scatter, t, torch.ones(ws * 2 + 1)),
        "a2a_len": _catch(hwdist.all_to_all, [t], [t] * (ws + 1)),
        "send_self": _catch(hwdist.send, t, r),
    }
    healthy = torch.tensor([1.0])
    hwdist.all_reduce(healthy)
    cases["healthy"] = healthy.item()
    return cases


def test_bad_input_raises_on_every_rank(dist, combo):
    ws, backend = combo
    for got in dist(check_bad_inputs, ws, backend):
        assert got["op"][0] == "ValueError" and "op must be one of 'sum', 'mean'" in got["op"][1] and "'average'" in got["op"][1]
        assert got["op_obj"][0] == "ValueError" and "3.5" in got["op_obj"][1]
        assert got["dict_op"][0] == "ValueError"
        assert got["data"] == ("TypeError", "all_reduce: data must be a torch.Tensor, got list: [1.0, 2.0]")
        assert got["gather_data"][0] == "TypeError" and "got str" in got["gather_data"][1]
        assert got["src"] == ("ValueError", f"broadcast: src must be a rank in 0..{ws - 1} (world size {ws}), got {ws}")
        assert got["src_type"][0] == "TypeError" and "src must be an int rank" in got["src_type"][1]
        assert got["dst"][0] == "ValueError" and "dst must be a rank" in got["dst"][1]
        assert got["reduce_dst"][0] == "ValueError" and "reduce: dst" in got["reduce_dst"][1]
        assert got["scatter_src"][0] == "ValueError" and "scatter: src" in got["scatter_src"][1]
        assert got["rs_len"] == ("ValueError", f"reduce_scatter: input_list must hold {ws} tensors (one per rank), got {ws + 1}")
        assert got["rs_numel"][0] == "ValueError" and f"{ws} * 2 elements" in got["rs_numel"][1]
        assert got["a2a_len"][0] == "ValueError" and "input_list must hold" in got["a2a_len"][1]
        assert got["send_self"][0] == "ValueError" and "another rank" in got["send_self"][1]
        assert got["healthy"] == ws
