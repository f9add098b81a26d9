"""Check bodies of the collectives that move data: all_gather, gather, broadcast, scatter,
all_to_all and point to point.

Rank ``r``'s data is ``moved(r, ...)`` (distinct per rank); what each rank must
end with is computed from the other ranks' numbers. The tensor forms a user
hands over are covered too: shapes that differ across ranks, 0-d, eight
dimensions, non-contiguous views (filled in place), async handles.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import hwdist

from ._context import Context
from ._data import moved, on_cpu

__all__ = [
    "check_all_gather",
    "check_gather",
    "check_broadcast",
    "check_scatter",
    "check_all_to_all",
    "check_send_recv",
]

Shape = Callable[[int], tuple[int, ...]]


def _mine(ctx: Context, rank: int, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    """Rank ``rank``'s data on this rank's device."""
    return ctx.tensor(moved(rank, ctx.dtype, shape))


def _want(ctx: Context, rank: int, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    """Rank ``rank``'s data as every other rank must receive it (CPU)."""
    return on_cpu(moved(rank, ctx.dtype, shape), ctx.dtype)


def _wait(ret: Any, kwargs: dict[str, Any]) -> Any:
    return ret.wait() if kwargs.get("async_op") else ret


# ---- all_gather and gather -----------------------------------------------------------------------

_GATHER_SHAPES: tuple[tuple[str, Shape, dict[str, Any]], ...] = (
    ("equal shapes", lambda r: (2, 3), {}),
    ("same_shape=True", lambda r: (2, 3), {"same_shape": True}),
    ("uneven shapes", lambda r: (r + 1, 2), {}),
    ("ndim differs", lambda r: (1,) * r + (2,), {}),
    ("8 dims", lambda r: (1,) * 7 + (r + 1,), {}),
    ("0-d", lambda r: (), {}),
    ("async", lambda r: (r + 1,), {"async_op": True}),
)


def check_all_gather(ctx: Context) -> None:
    """Equal and uneven shapes, differing ndim, 8 dims, 0-d, non-contiguous, async; pad_to_largest_tensor."""
    for label, shape, kwargs in _GATHER_SHAPES:
        _all_gather_case(ctx, label, shape, kwargs)
    base = _mine(ctx, ctx.rank, (3, 2))
    want_t = [_want(ctx, q, (3, 2)).t() for q in range(ctx.world)]
    ctx.case(
        "non-contiguous",
        lambda: hwdist.all_gather(base.t()),
        lambda out: ctx.expect("non-contiguous", list(out), want_t),
        op="all_gather",
    )
    _pad_case(ctx)


def _all_gather_case(ctx: Context, label: str, shape: Shape, kwargs: dict[str, Any]) -> None:
    data = _mine(ctx, ctx.rank, shape(ctx.rank))
    want = [_want(ctx, q, shape(q)) for q in range(ctx.world)]
    ctx.case(
        label,
        lambda: _wait(hwdist.all_gather(data, **kwargs), kwargs),
        lambda out: ctx.expect(label, list(out), want),
        op="all_gather",
    )


def _pad_case(ctx: Context) -> None:
    """pad_to_largest_tensor: every rank's element count, and this rank's data flattened and zero-padded."""
    sizes = [2 * (q + 1) for q in range(ctx.world)]
    data = _mine(ctx, ctx.rank, (ctx.rank + 1, 2))
    flat = _want(ctx, ctx.rank, (ctx.rank + 1, 2)).reshape(-1)
    padded = torch.cat([flat, torch.zeros(max(sizes) - flat.numel(), dtype=ctx.dtype)])
    ctx.case(
        "pad_to_largest_tensor",
        lambda: hwdist.pad_to_largest_tensor(data),
        lambda out: ctx.expect("pad_to_largest_tensor", (list(out[0]), out[1]), (sizes, padded)),
    )  # no op to ask about: it exchanges the sizes (hwdist's own traffic) and pads locally


def check_gather(ctx: Context) -> None:
    """To the last rank (the others get ``[]``): equal and uneven shapes, async; same_shape=True to rank 0."""
    last = ctx.world - 1
    _gather_case(ctx, f"dst={last}", last, lambda r: (2, 3), {})
    _gather_case(ctx, "uneven shapes", last, lambda r: (r + 1,), {})
    _gather_case(ctx, "same_shape=True dst=0", 0, lambda r: (3,), {"same_shape": True})
    _gather_case(ctx, "async", last, lambda r: (2,), {"async_op": True})


def _gather_case(ctx: Context, label: str, dst: int, shape: Shape, kwargs: dict[str, Any]) -> None:
    data = _mine(ctx, ctx.rank, shape(ctx.rank))
    want = [_want(ctx, q, shape(q)) for q in range(ctx.world)] if ctx.rank == dst else []
    ctx.case(
        label,
        lambda: _wait(hwdist.gather(data, dst=dst, **kwargs), kwargs),
        lambda out: ctx.expect(label, list(out), want),
        op="gather",
    )


# ---- broadcast and scatter -----------------------------------------------------------------------


def check_broadcast(ctx: Context) -> None:
    """From the last rank: in place, a non-contiguous view (same storage), 0-d, async."""
    src = ctx.world - 1
    for label, shape, kwargs in (
        (f"src={src}", (2, 3), {}),
        ("0-d", (), {}),
        ("async", (4,), {"async_op": True}),
    ):
        _broadcast_case(ctx, label, src, shape, kwargs)
    base = _mine(ctx, ctx.rank, (3, 2))
    view = base.t()
    want = (_want(ctx, src, (3, 2)).t(), True, view.stride())

    def verify(_out: Any) -> None:
        ctx.expect("non-contiguous", (view, view.data_ptr() == base.data_ptr(), view.stride()), want)

    ctx.case("non-contiguous", lambda: hwdist.broadcast(view, src=src), verify, op="broadcast")


def _broadcast_case(
    ctx: Context, label: str, src: int, shape: tuple[int, ...], kwargs: dict[str, Any]
) -> None:
    data = _mine(ctx, ctx.rank, shape)
    want = _want(ctx, src, shape)
    ctx.case(
        label,
        lambda: _wait(hwdist.broadcast(data, src=src, **kwargs), kwargs),
        lambda _out: ctx.expect(label, data, want),
        op="broadcast",
    )


def check_scatter(ctx: Context) -> None:
    """Each rank's chunk, from the last rank and from rank 0 (async)."""
    last = ctx.world - 1
    _scatter_case(ctx, f"src={last}", last, {})
    _scatter_case(ctx, "async src=0", 0, {"async_op": True})


def _scatter_case(ctx: Context, label: str, src: int, kwargs: dict[str, Any]) -> None:
    # Chunk q of the source is moved(q + 7): distinct from any rank's own data.
    chunks = [_mine(ctx, q + 7) for q in range(ctx.world)] if ctx.rank == src else None
    out = ctx.tensor(torch.zeros(2, 3))
    want = _want(ctx, ctx.rank + 7)
    ctx.case(
        label,
        lambda: _wait(hwdist.scatter(out, chunks, src=src, **kwargs), kwargs),
        lambda _out: ctx.expect(label, out, want),
        op="scatter",
    )


# ---- all_to_all ----------------------------------------------------------------------------------


def check_all_to_all(ctx: Context) -> None:
    """Equal chunks, chunks whose sizes differ per pair of ranks, async."""
    _all_to_all_case(ctx, "chunks", lambda src, dst: (2,), {})
    # Rank j sends j + k + 1 values to rank k.
    _all_to_all_case(ctx, "uneven sizes", lambda src, dst: (src + dst + 1,), {})
    _all_to_all_case(ctx, "async", lambda src, dst: (2, 2), {"async_op": True})


def _all_to_all_case(
    ctx: Context, label: str, shape: Callable[[int, int], tuple[int, ...]], kwargs: dict[str, Any]
) -> None:
    n, r = ctx.world, ctx.rank
    # Rank r sends chunk c (built from r*n + c) to rank c and receives chunk r of every rank.
    send = [_mine(ctx, r * n + c, shape(r, c)) for c in range(n)]
    want = [_want(ctx, q * n + r, shape(q, r)) for q in range(n)]
    outs = [ctx.tensor(torch.zeros(shape(q, r))) for q in range(n)]
    ctx.case(
        label,
        lambda: _wait(hwdist.all_to_all(outs, send, **kwargs), kwargs),
        lambda _out: ctx.expect(label, outs, want),
        op="all_to_all",
    )


# ---- point to point ------------------------------------------------------------------------------


def check_send_recv(ctx: Context) -> None:
    """A ring (rank r sends to r+1, receives from r-1): isend/irecv, send/recv, irecv from any source."""
    n, r = ctx.world, ctx.rank
    if n == 1:
        ctx.covered.append("(one rank: nothing to send)")
        return
    dst, src = (r + 1) % n, (r - 1) % n

    def nonblocking(data: torch.Tensor, box: torch.Tensor) -> Any:
        if r % 2:  # odd ranks post the receive first, even ranks the send
            handles = [hwdist.irecv(box, src=src), hwdist.isend(data, dst=dst)]
        else:
            handles = [hwdist.isend(data, dst=dst), hwdist.irecv(box, src=src)]
        return [h.wait() for h in handles]

    def blocking(data: torch.Tensor, box: torch.Tensor) -> Any:
        if r % 2 == 0:  # even ranks send first, odd ranks receive first: no cycle of blocking sends
            hwdist.send(data, dst=dst)
            return hwdist.recv(box, src=src)
        sender = hwdist.recv(box, src=src)
        hwdist.send(data, dst=dst)
        return sender

    def any_source(data: torch.Tensor, box: torch.Tensor) -> Any:
        handle = hwdist.isend(data, dst=dst, tag=3)
        sender = hwdist.irecv(box, None, tag=3).wait()
        handle.wait()
        return sender

    _ring_case(ctx, "isend/irecv ring", nonblocking, None)
    _ring_case(ctx, "send/recv ring", blocking, src)
    _ring_case(ctx, "irecv any source", any_source, src)


def _ring_case(
    ctx: Context, label: str, run: Callable[[torch.Tensor, torch.Tensor], Any], sender: Any
) -> None:
    """One ring exchange; ``sender`` is what the receive must report (None: not checked)."""
    n, r = ctx.world, ctx.rank
    data = _mine(ctx, r)
    box = ctx.tensor(torch.zeros(2, 3))
    want = _want(ctx, (r - 1) % n)

    def verify(got_sender: Any) -> None:
        ctx.expect(label, box, want)
        if sender is not None:
            ctx.expect(f"{label}: sender", got_sender, sender)

    ctx.case(label, lambda: run(data, box), verify, op="send")
