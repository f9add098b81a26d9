"""Tensor collectives on real ranks with legal but unusual inputs: odd strides, integer means.

* Tensors torch calls contiguous whose flat view has a stride other than 1 (``x[:, 0]`` with a
  batch of one: shape ``(1,)``, stride ``(4,)``; an empty ``torch.from_numpy`` array: stride 0),
  0-d, non-contiguous and transposed tensors, in every tensor collective and object collective,
  for every dtype class (floating, half, integer, bool, complex), at 2 and 3 ranks on gloo and
  the emulated accelerator. Such a tensor used to raise on its own rank
  (``self.stride(-1) must be 1 to view Float as Byte``) while the others waited for the group
  timeout.
* An integer ``'mean'`` whose sum overflows its dtype is exact (int32 sums in a wider type, int64
  as quotients and remainders).
* ``reduce_scatter`` of an empty complex tensor on the emulated accelerator returns on every rank.

Every rank recomputes what each rank gave from the rank numbers and returns its mismatches; the
parent asserts there are none. Each case is a row of the fault table in docs/reliability.md; the
byte orders of numpy arrays in object collectives are in test_objects.py, ``all_reduce_dict``'s
``PlanError`` in test_params.py.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import pytest
import torch

import hwdist
from hwdist.testing.pytest_plugin import capture_error

pytestmark = pytest.mark.dist

COMBOS = [(2, "gloo"), (3, "gloo"), (2, "emu"), (3, "emu")]
IDS = [f"{ws}-{be}" for ws, be in COMBOS]

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
]
#: the shapes and strides under test (see ``make``)
KINDS = ["one", "one_2d", "empty", "empty_2d", "scalar", "strided", "transposed"]

#: A bad input on one rank must reach every rank well within this (the group timeout is minutes).
FAST = 10.0


def _values(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    """``n`` small values that depend on ``seed`` (exact in every dtype, sums of 3 fit int8)."""
    base = torch.arange(n, dtype=torch.float64) + seed
    if dtype == torch.bool:
        return (base.long() % 2 == 1)
    if dtype.is_complex:
        return torch.complex(base, base + 1).to(dtype)
    return base.to(dtype)


def make(dtype: torch.dtype, kind: str, seed: int) -> torch.Tensor:
    """A tensor of ``kind`` holding ``_values(dtype, numel, seed)`` in C order."""
    if kind == "one":  # x[:, 0] of a batch of one: shape (1,), stride (4,)
        big = torch.zeros(1, 4, dtype=dtype)
        big[:, 0] = _values(dtype, 1, seed)
        out = big[:, 0]
        assert out.stride() == (4,) and out.is_contiguous()
        return out
    if kind == "one_2d":  # one element at a storage offset, strides (7, 3)
        buf = torch.zeros(8, dtype=dtype)
        buf[1] = _values(dtype, 1, seed)[0]
        return buf.as_strided((1, 1), (7, 3), 1)
    if kind in ("empty", "empty_2d"):  # torch.from_numpy of an empty array: stride 0
        shape = (0,) if kind == "empty" else (0, 3)
        try:
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            out = torch.from_numpy(np.empty(shape, dtype=np_dtype))
        except TypeError:  # a dtype numpy lacks (bfloat16): the same strides by hand
            out = torch.empty(shape, dtype=dtype).as_strided(shape, (0,) * len(shape))
        assert set(out.stride()) == {0}
        return out
    if kind == "scalar":
        return _values(dtype, 1, seed).reshape(())
    if kind == "strided":
        return _values(dtype, 6, seed)[::2]
    if kind == "transposed":
        return _values(dtype, 6, seed).reshape(2, 3).t()
    raise KeyError(kind)


def _same(got: Any, want: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.dtype == want.dtype
        and got.shape == want.shape
        and torch.equal(got.contiguous(), want.contiguous())
    )


def _sum(ts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:  # bool reduces with 'max' here (any)
        return torch.stack([t.contiguous() for t in ts]).any(0)
    wide = torch.complex128 if dtype.is_complex else torch.float64
    return torch.stack([t.to(wide) for t in ts]).sum(0).to(dtype)


def check_odd_strides(dtypes: list[torch.dtype]) -> dict:
    """Every tensor and object collective with every kind and dtype; the mismatches by name."""
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    bad: dict[str, Any] = {}
    plan_errors: dict[str, Any] = {}
    slowest = 0.0

    def run(name: str, fn: Callable[[], Any], ok: Callable[[], bool]) -> None:
        nonlocal slowest
        start = time.monotonic()
        err = capture_error(fn)
        slowest = max(slowest, time.monotonic() - start)
        if err is not None:
            if err[0] == "PlanError":
                plan_errors[name] = err
            else:
                bad[name] = err
        elif not ok():
            bad[name] = "wrong result"

    for dtype in dtypes:
        rop = "max" if dtype == torch.bool else "sum"
        for k, kind in enumerate(KINDS):
            tag = f"{dtype}/{kind}"
            mine = make(dtype, kind, r)
            every = [make(dtype, kind, q) for q in range(ws)]
            out: dict[str, Any] = {}

            run(f"all_gather {tag}", lambda: out.update(ag=hwdist.all_gather(make(dtype, kind, r))),
                lambda: len(out["ag"]) == ws and all(_same(g, w) for g, w in zip(out["ag"], every)))
            run(f"all_gather same_shape {tag}",
                lambda: out.update(ags=hwdist.all_gather(make(dtype, kind, r), same_shape=True)),
                lambda: all(_same(g, w) for g, w in zip(out["ags"], every)))
            dst = ws - 1
            run(f"gather {tag}", lambda: out.update(g=hwdist.gather(make(dtype, kind, r), dst=dst)),
                lambda: (all(_same(g, w) for g, w in zip(out["g"], every)) and len(out["g"]) == ws)
                if r == dst else out["g"] == [])
            x = make(dtype, kind, r)
            run(f"broadcast {tag}", lambda: hwdist.broadcast(x, src=0), lambda: _same(x, every[0]))
            y = make(dtype, kind, 50)
            src = ws - 1
            pieces = [make(dtype, kind, 5 + q) for q in range(ws)] if r == src else None
            run(f"scatter {tag}", lambda: hwdist.scatter(y, pieces, src=src),
                lambda: _same(y, make(dtype, kind, 5 + r)))
            z = make(dtype, kind, r)
            run(f"all_reduce {tag}", lambda: hwdist.all_reduce(z, rop), lambda: _same(z, _sum(every, dtype)))
            z2 = make(dtype, kind, r)
            run(f"reduce {tag}", lambda: hwdist.reduce(z2, dst=dst, op=rop),
                lambda: _same(z2, _sum(every, dtype)) if r == dst else True)
            w = make(dtype, kind, 50)
            run(f"reduce_scatter {tag}",
                lambda: hwdist.reduce_scatter(w, [make(dtype, kind, r + j) for j in range(ws)], rop),
                lambda: _same(w, _sum([make(dtype, kind, q + r) for q in range(ws)], dtype)))
            # uneven all_to_all: the piece between ranks r and j has kind k + r + j; the outputs are odd too
            kinds = [KINDS[(k + r + j) % len(KINDS)] for j in range(ws)]  # to rank j, and from rank j
            send = [make(dtype, kinds[j], r) for j in range(ws)]
            recv = [make(dtype, kinds[j], 50) for j in range(ws)]
            run(f"all_to_all {tag}", lambda: hwdist.all_to_all(recv, send),
                lambda: all(_same(recv[j], make(dtype, kinds[j], j)) for j in range(ws)))
            if ws > 1:
                p = make(dtype, kind, r if r == 0 else 50)
                run(f"send/recv {tag}",
                    lambda: hwdist.send(p, 1) if r == 0 else (hwdist.recv(p, 0) if r == 1 else None),
                    lambda: r > 1 or _same(p, every[0]))
            run(f"all_gather_object {tag}", lambda: out.update(o=hwdist.all_gather_object({"t": mine})),
                lambda: all(_same(o["t"], w) for o, w in zip(out["o"], every)))
            box = [make(dtype, kind, r)]
            run(f"broadcast_object_list {tag}", lambda: hwdist.broadcast_object_list(box, src=0),
                lambda: _same(box[0], every[0]))
            if dtype != torch.bfloat16:  # numpy arrays of the same strides inside objects
                run(f"all_gather_object numpy {tag}",
                    lambda: out.update(n=hwdist.all_gather_object(make(dtype, kind, r).numpy())),
                    lambda: all(_same(torch.from_numpy(a.copy()), w) and a.shape == tuple(w.shape)
                                for a, w in zip(out["n"], every)))
    return {"bad": bad, "plan_errors": plan_errors, "slowest": slowest}


@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_odd_strides_work_in_every_collective(dist, combo):
    ws, backend = combo
    results = dist(check_odd_strides, ws, backend, DTYPES)
    for r, res in enumerate(results):
        assert res["bad"] == {}, f"rank {r}: {res['bad']}"
        # the only refusals: what the backend cannot reduce losslessly (emu has no int64 reduction)
        for name, (_, text) in res["plan_errors"].items():
            assert backend == "emu" and "int64" in name and "no lossless cast" in text, (name, text)
        assert res["plan_errors"] == results[0]["plan_errors"]
        assert res["slowest"] < FAST


def test_byte_helpers_accept_any_strides():
    from hwdist.collectives.wire import byte_view, dense_flat, retype

    for dtype in DTYPES:
        for kind in KINDS:
            t = make(dtype, kind, 3)
            flat = dense_flat(t)
            assert flat.dim() == 1 and flat.numel() == t.numel()
            assert flat.numel() == 0 or flat.stride() == (1,)
            assert torch.equal(flat, t.contiguous().reshape(-1))
            b = byte_view(t)
            assert b.dtype == torch.uint8 and b.numel() == t.numel() * t.element_size()
            assert torch.equal(retype(b, dtype), flat)
            if t.is_contiguous() and t.numel():
                assert b.data_ptr() == t.data_ptr()  # a view, no copy
    # an empty row at an odd offset of a buffer (reduce_scatter's rows): viewed as a wider dtype
    rows = torch.empty((3, 0), dtype=torch.float32)
    assert retype(rows[1], torch.complex64).numel() == 0


# ---------------------------------------------------------------------------
# an integer mean whose sum overflows the dtype
# ---------------------------------------------------------------------------
INT_CASES = {
    torch.int8: (127, -128),
    torch.uint8: (255, 0),
    torch.int16: (32767, -32768),
    torch.int32: (2**31 - 1, -(2**31)),
    torch.int64: (2**63 - 1, -(2**63)),
}


def _ints(dtype: torch.dtype, rank: int) -> list[int]:
    hi, lo = INT_CASES[dtype]
    # near the top, near the bottom, mixed signs whose sum overflows, small values
    mixed = hi - 10 if rank % 2 == 0 else (lo + 10 if lo else 3)
    return [hi - rank, lo + rank, mixed, 7 * rank - (3 if lo else 0), 0]


def _floor_mean(dtype: torch.dtype, ws: int) -> list[int]:
    cols = zip(*[_ints(dtype, q) for q in range(ws)])
    return [sum(c) // ws for c in cols]


def test_integer_mean_plans_sum_in_a_wider_type():
    from hwdist.collectives.wire import exact_mean
    from hwdist.drivers.base import Post

    emu, gloo = hwdist.get_driver("emu"), hwdist.get_driver("gloo")
    p = emu.plan("all_reduce", torch.int32, "mean")  # no int64 on emu: float64 holds the sum exactly
    assert (p.comm_dtype, p.post) == (torch.float64, Post.DIVIDE) and not exact_mean(p)
    p = emu.plan("all_reduce", torch.int16, "mean")
    assert p.comm_dtype in (torch.int32, torch.float64)
    p = gloo.plan("all_reduce", torch.int64, "mean")  # no wider type: quotients and remainders
    assert (p.comm_dtype, p.post) == (torch.int64, Post.DIVIDE) and exact_mean(p)
    assert not exact_mean(gloo.plan("all_reduce", torch.int32, "mean"))  # int64 on gloo


def check_integer_means() -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict = {}
    for dtype in INT_CASES:
        t = torch.tensor(_ints(dtype, r), dtype=dtype)
        out[f"all_reduce {dtype}"] = capture_error(hwdist.all_reduce, t, "mean") or t.tolist()
        t = torch.tensor(_ints(dtype, r), dtype=dtype)
        err = capture_error(hwdist.reduce, t, 0, "mean")
        out[f"reduce {dtype}"] = err or (t.tolist() if r == 0 else None)
        o = torch.zeros(5, dtype=dtype)
        ins = [torch.tensor(_ints(dtype, r), dtype=dtype) for _ in range(ws)]
        out[f"reduce_scatter {dtype}"] = capture_error(hwdist.reduce_scatter, o, ins, "mean") or o.tolist()
        t = torch.tensor(_ints(dtype, r), dtype=dtype).reshape(5, 1)[:, 0]  # strided too
        out[f"strided {dtype}"] = capture_error(hwdist.all_reduce, t, "mean") or t.tolist()
        ps = [torch.tensor(_ints(dtype, r), dtype=dtype), torch.tensor([0.5 + r], dtype=torch.float64)]
        out[f"params {dtype}"] = capture_error(hwdist.all_reduce_params, ps, op="mean") or ps[0].tolist()
        if dtype != torch.int64:  # all_reduce_dict sums int64 in int64 (docs/collectives.md)
            d = {"a": torch.tensor(_ints(dtype, r), dtype=dtype), "b": torch.tensor([0.5 + r])}
            out[f"dict {dtype}"] = capture_error(hwdist.all_reduce_dict, d, "mean") or d["a"].tolist()
            out[f"float {dtype}"] = (d["b"].item(), ps[1].item())
    return out


@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_integer_mean_does_not_overflow(dist, combo):
    ws, backend = combo
    for r, res in enumerate(dist(check_integer_means, ws, backend)):
        for dtype in INT_CASES:
            want = _floor_mean(dtype, ws)
            ops: tuple[str, ...] = ("params",)
            if dtype != torch.int64:
                ops = ("dict", "params")
                assert res[f"float {dtype}"] == (0.5 + (ws - 1) / 2, 0.5 + (ws - 1) / 2)
            for op in ("all_reduce", "reduce_scatter", "strided", "reduce") + ops:
                got = res[f"{op} {dtype}"]
                if backend == "emu" and dtype == torch.int64:  # emu reduces no int64: refused, never wrong
                    assert got[0] == "PlanError" and "no lossless cast" in got[1], got
                elif op == "reduce" and r != 0:
                    assert got is None
                else:
                    assert got == want, (op, dtype, got, want)


# ---------------------------------------------------------------------------
# the emulated accelerator: reduce_scatter of an empty complex tensor
# ---------------------------------------------------------------------------
def check_empty_complex_reduce_scatter() -> dict:
    ws = hwdist.get_world_size()
    out = {}
    for dtype in (torch.complex64, torch.complex128):
        for op in ("sum", "mean"):
            o = torch.empty(0, dtype=dtype)
            ins = [torch.empty(0, dtype=dtype) for _ in range(ws)]
            out[f"{dtype} {op}"] = capture_error(hwdist.reduce_scatter, o, ins, op) or o.shape
            o2 = torch.empty(0, 2, dtype=dtype)
            ins2 = [torch.empty(0, 2, dtype=dtype) for _ in range(ws)]
            out[f"{dtype} {op} 2d"] = capture_error(hwdist.reduce_scatter, o2, ins2, op) or o2.shape
    return out


@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_empty_complex_reduce_scatter(dist, combo):
    ws, backend = combo
    for res in dist(check_empty_complex_reduce_scatter, ws, backend):
        for name, got in res.items():
            assert got in (torch.Size([0]), torch.Size([0, 2])), (name, got)
