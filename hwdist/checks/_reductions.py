"""Check bodies of the tensor reductions: all_reduce, reduce, reduce_scatter, reduce_mean.

Each body runs on every rank with a ``Context``; inputs and expected values come
from ``hwdist.checks._data`` (rank numbers only). Every sub-case asks the
group's driver for a plan first (``Context.case``), so one body serves every
backend: what the capability table refuses must be refused, the rest must be right.
"""

from __future__ import annotations

from typing import Any, Union

import torch
import torch.distributed as torch_dist

import hwdist

from ._context import Context
from ._data import combine, contribution, reduce_ops

__all__ = ["check_all_reduce", "check_reduce", "check_reduce_scatter", "check_reduce_mean"]

#: torch.distributed.ReduceOp member for each hwdist reduce op name.
_TORCH_OPS = {
    "sum": "SUM", "mean": "AVG", "product": "PRODUCT", "min": "MIN", "max": "MAX",
    "band": "BAND", "bor": "BOR", "bxor": "BXOR",
}


def _reduced(ctx: Context, rop: str, shape: tuple[int, ...] = (2, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's input for ``rop`` (on its device) and the reduction over every rank (CPU)."""
    dt = ctx.dtype
    data = ctx.tensor(contribution(ctx.rank, rop, dt, shape))
    want = combine([contribution(q, rop, dt, shape) for q in range(ctx.world)], rop, dt)
    return data, want


def _in_place(
    ctx: Context, label: str, data: torch.Tensor, want: torch.Tensor, rop: str, **kwargs: Any
) -> None:
    """One all_reduce sub-case: ``data`` reduced in place with ``rop`` must equal ``want``."""

    def call() -> Any:
        handle = hwdist.all_reduce(data, rop, **kwargs)
        return handle.wait() if kwargs.get("async_op") else handle

    ctx.case(label, call, lambda _out: ctx.expect(label, data, want), op="all_reduce", reduce_op=rop)


def check_all_reduce(ctx: Context) -> None:
    """Every reduce op meaningful for the dtype, its other spellings, and the tensor forms
    (0-d, non-contiguous view, async, ``nn.Parameter``)."""
    ops = reduce_ops(ctx.dtype)
    for rop in ops:
        data, want = _reduced(ctx, rop)
        _in_place(ctx, rop, data, want, rop)
    _spellings(ctx, ops)
    rop = "mean" if "mean" in ops else "sum"
    data, want = _reduced(ctx, rop, ())
    _in_place(ctx, f"0-d {rop}", data, want, rop)
    data, want = _reduced(ctx, "sum")
    _in_place(ctx, "async", data, want, "sum", async_op=True)
    _non_contiguous(ctx)
    data, want = _reduced(ctx, rop, (2,))
    grad = ctx.dtype.is_floating_point or ctx.dtype.is_complex
    _in_place(ctx, f"Parameter {rop}", torch.nn.Parameter(data, requires_grad=grad), want, rop)


def _spellings(ctx: Context, ops: tuple[str, ...]) -> None:
    """Each planned op also given title-cased ('Sum') and as a ``torch.distributed.ReduceOp``."""
    planned = [rop for rop in ops if ctx.refusal("all_reduce", rop) is None]
    if not planned:
        return
    forms: list[tuple[str, Union[str, Any]]] = []
    for rop in planned:
        forms += [(rop, rop.title()), (rop, getattr(torch_dist.ReduceOp, _TORCH_OPS[rop]))]
    cases = [(spelled, *_reduced(ctx, rop)) for rop, spelled in forms]

    def call() -> None:
        for spelled, data, _want in cases:
            hwdist.all_reduce(data, spelled)

    def verify(_out: Any) -> None:
        for spelled, data, want in cases:
            ctx.expect(f"op={spelled!r}", data, want)

    ctx.case("spellings", call, verify, op="all_reduce", reduce_op=planned[0])


def _non_contiguous(ctx: Context) -> None:
    """A transposed view is reduced in place: same storage, same strides, right values."""
    base, want = _reduced(ctx, "sum", (3, 2))
    view = base.t()
    stride = view.stride()

    def verify(_out: Any) -> None:
        got = (view, view.data_ptr() == base.data_ptr(), view.stride())
        ctx.expect("non-contiguous", got, (want.t(), True, stride))

    ctx.case("non-contiguous", lambda: hwdist.all_reduce(view), verify, op="all_reduce", reduce_op="sum")


def check_reduce(ctx: Context) -> None:
    """sum, mean and max (where meaningful) onto the last rank, one to rank 0, one async."""
    ops = reduce_ops(ctx.dtype)
    last = ctx.world - 1
    for rop in ("sum", "mean", "max"):
        if rop in ops:
            _reduce_case(ctx, rop, rop, last)
    _reduce_case(ctx, "sum to rank 0", "sum", 0)
    _reduce_case(ctx, "async", "max" if "max" in ops else "sum", last, async_op=True)


def _reduce_case(ctx: Context, label: str, rop: str, dst: int, **kwargs: Any) -> None:
    data, want = _reduced(ctx, rop)

    def call() -> Any:
        handle = hwdist.reduce(data, dst=dst, op=rop, **kwargs)
        return handle.wait() if kwargs.get("async_op") else handle

    def verify(_out: Any) -> None:
        if ctx.rank == dst:  # the other ranks' buffers are unspecified, as in torch
            ctx.expect(f"{label} on rank {dst}", data, want)

    ctx.case(label, call, verify, op="reduce", reduce_op=rop)


def check_reduce_scatter(ctx: Context) -> None:
    """A list of chunks (sum, mean, max where meaningful), one flat input tensor, async."""
    ops = reduce_ops(ctx.dtype)
    for rop in ("sum", "mean", "max"):
        if rop in ops:
            _reduce_scatter_case(ctx, rop, rop, flat=False)
    _reduce_scatter_case(ctx, "flat input", "sum", flat=True)
    _reduce_scatter_case(ctx, "async", "max" if "max" in ops else "sum", flat=False, async_op=True)


def _reduce_scatter_case(ctx: Context, label: str, rop: str, *, flat: bool, **kwargs: Any) -> None:
    n, dt = ctx.world, ctx.dtype
    # Rank q contributes chunk c built from q*n + c; rank r keeps the reduction of chunk r.
    chunks = [ctx.tensor(contribution(ctx.rank * n + c, rop, dt, (3,))) for c in range(n)]
    want = combine([contribution(q * n + ctx.rank, rop, dt, (3,)) for q in range(n)], rop, dt)
    out = ctx.tensor(torch.zeros(3))
    inputs: Union[list[torch.Tensor], torch.Tensor] = torch.cat(chunks) if flat else chunks

    def call() -> Any:
        handle = hwdist.reduce_scatter(out, inputs, op=rop, **kwargs)
        return handle.wait() if kwargs.get("async_op") else handle

    ctx.case(label, call, lambda _out: ctx.expect(label, out, want), op="reduce_scatter", reduce_op=rop)


def check_reduce_mean(ctx: Context) -> None:
    """The mean over ranks, returned as a new tensor (vis4d's helper)."""
    data, want = _reduced(ctx, "mean")
    ctx.case(
        "mean",
        lambda: hwdist.reduce_mean(data),
        lambda out: ctx.expect("mean", out, want),
        op="all_reduce",
        reduce_op="mean",
    )
