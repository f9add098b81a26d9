"""The engine's strategies for the tensor collectives: each op's wire buffers and finish.

A strategy never calls torch.distributed: its ``to_wire`` names the torch op
(``call.native``) and fills the buffers, the engine issues it
(hwdist/collectives/engine.py), and its ``finish`` copies back and builds the
result. ``serial`` is the op without a process group (mmengine's semantics).
all_to_all's transports and the gathers' (the sizes agreed in the header round) are in
``_uneven.py``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..drivers.base import Driver, Plan
from ..drivers.tuning import gather_by_broadcast_floor
from . import wire as _wire
from .engine import Call, Strategy
from ._uneven import Gather as Gather  # the gathers' strategy lives with the size agreement
from .wire import (
    comm_numel,
    copy_source,
    exact_mean,
    finish_reduction,
    itemsize,
    prepare,
    reduction_send,
    restore,
    split_mean,
    torch_op,
)

Tensor = torch.Tensor


class AllReduce(Strategy):
    """all_reduce: in place; the mean's division and the copy back after it."""

    op = "all_reduce"
    direct = True

    def to_wire(self, c: Call) -> None:
        _reduction_wire(c)
        c.native = "all_reduce"

    def finish(self, c: Call) -> None:
        _finish(c)


def _reduction_wire(c: Call) -> None:
    """all_reduce's and reduce's send buffer (an int64 mean's as quotients and remainders)."""
    c.send, c.aliased = reduction_send(c.data, c.plan, c.cdev, c.view.size)
    c.torch_op = torch_op(c.plan)


def _finish(c: Call) -> None:
    finish_reduction(c.data, c.send, c.plan, c.view.size, c.aliased)


class Reduce(Strategy):
    """reduce to ``root``; an all_reduce where the backend has no reduce (the plan says so)."""

    op = "reduce"

    def to_wire(self, c: Call) -> None:
        _reduction_wire(c)
        c.native = c.plan.native_op

    def finish(self, c: Call) -> None:
        if c.view.rank == c.root:
            _finish(c)


class Broadcast(Strategy):
    """broadcast from ``root``, in place."""

    op = "broadcast"
    direct = True

    def to_wire(self, c: Call) -> None:
        c.send, c.aliased = prepare(c.data, c.plan, c.cdev)
        c.native = "broadcast"

    def finish(self, c: Call) -> None:
        if not c.aliased and c.view.rank != c.root:
            restore(c.data, c.send, c.plan)


class Scatter(Strategy):
    """scatter from ``root`` (``extra``: the scatter_list); where the backend has no scatter, one broadcast
    of every row.

    The root validates the list; when it is wrong the root still joins the
    collective with a failure flag in every row (a status slot as wide as one
    element of data, so byte views stay aligned), so every rank raises.
    """

    op = "scatter"

    def to_wire(self, c: Call) -> None:
        g, plan, data, cdev = c.view, c.plan, c.data, c.cdev
        ws = g.size
        device = cdev if cdev is not None else data.device
        n = comm_numel(data.shape, plan)
        h = itemsize(plan.dtype) // itemsize(plan.comm_dtype) if plan.view else 1
        error: Optional[Exception] = None  # src's own, raised there with its type once the others know
        rows: Optional[Tensor] = None
        if g.rank == c.root:
            items: list[Tensor] = []
            try:
                items = _wire.check_tensor_list(c.extra, "scatter_list", "scatter", ws, data)
                _wire.check_shapes(items, data, "scatter_list", "scatter")
            except (TypeError, ValueError) as exc:
                error = exc
            rows = torch.zeros((ws, h + n), dtype=plan.comm_dtype, device=device)
            if error is None:
                for i, t in enumerate(items):
                    rows[i, h:].copy_(copy_source(t, plan, cdev))
            else:
                rows[:, 0] = 1
        c.native = plan.native_op
        if c.native == "scatter":
            c.recv = torch.empty(h + n, dtype=plan.comm_dtype, device=device)
            c.send = list(rows.unbind(0)) if rows is not None else None
        else:  # emulated: one broadcast of every row
            whole = rows
            if whole is None:
                whole = torch.empty((ws, h + n), dtype=plan.comm_dtype, device=device)
            c.send, c.recv = whole, whole[g.index(g.rank)]
        c.state = (error, h)

    def finish(self, c: Call) -> None:
        error, h = c.state
        if error is not None:
            raise error
        if bool(c.recv[0].item()):
            raise ValueError(
                f"scatter: the scatter_list given on src rank {c.root} was invalid"
                f" (see the error on rank {c.root})"
            )
        restore(c.data, c.recv[h:], c.plan)

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        assert data is not None
        items = _wire.check_tensor_list(extra, "scatter_list", "scatter", 1, data)
        with torch.no_grad():
            data.copy_(items[0])


class ReduceScatter(Strategy):
    """reduce_scatter (``extra``: the checked input list); an all_reduce of the whole input plus a slice
    where the backend has no reduce_scatter."""

    op = "reduce_scatter"

    def to_wire(self, c: Call) -> None:
        g, plan, output, cdev = c.view, c.plan, c.data, c.cdev
        ws = g.size
        device = cdev if cdev is not None else output.device
        flat = torch.empty((ws, comm_numel(output.shape, plan)), dtype=plan.comm_dtype, device=device)
        for i, t in enumerate(c.extra):
            flat[i].copy_(copy_source(t, plan, cdev))
        c.native = plan.native_op
        c.torch_op = torch_op(plan)
        if exact_mean(plan):  # quotients and remainders (see split_mean): rows twice as wide
            flat = split_mean(flat, ws)
            if c.native == "reduce_scatter":
                c.send, c.recv, c.aliased = list(flat.unbind(0)), flat.new_empty(flat.shape[1]), False
                return
        if c.native == "reduce_scatter":
            out_buf, c.aliased = prepare(output, plan, cdev)
            c.send, c.recv = list(flat.unbind(0)), out_buf.reshape(-1)
        else:
            c.send, c.recv, c.aliased = flat, flat[g.index(g.rank)], False

    def finish(self, c: Call) -> None:
        finish_reduction(c.data, c.recv, c.plan, c.view.size, c.aliased)

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        assert data is not None
        with torch.no_grad():
            data.copy_(extra[0])


class Barrier(Strategy):
    """barrier: no data."""

    op = "barrier"

    def plan(self, driver: Driver, data: Any, rop: Optional[str]) -> Plan:
        return _BARRIER_PLAN

    def to_wire(self, c: Call) -> None:
        c.native = "barrier"


_BARRIER_PLAN = Plan("barrier", "barrier", torch.uint8, torch.uint8)


class PointToPoint(Strategy):
    """send / recv with ``root`` the partner (None: any sender); ``extra`` is (function name, tag)."""

    def __init__(self, op: str) -> None:
        self.op = op

    def to_wire(self, c: Call) -> None:
        c.send, c.aliased = prepare(c.data, c.plan, c.cdev)
        c.native = self.op
        c.tag = c.extra[1]

    def finish(self, c: Call) -> Optional[int]:
        if self.op == "send":
            return None
        if not c.aliased:
            restore(c.data, c.send, c.plan)
        if c.work is None:  # synchronous: torch's recv gave the sender
            return int(c.state)
        return int(c.root) if c.root is not None else int(c.work._source_rank())

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        raise RuntimeError(f"{extra[0]} needs a process group: call hwdist.init_dist(...) first")


ALL_REDUCE = AllReduce()
REDUCE = Reduce()
BROADCAST = Broadcast()
class AllGather(Gather):
    """``all_gather``: the size agreement, or with ``same_shape=True`` a pass-through where it can be one."""

    picks = True

    def pick(self, data: Any, extra: Any) -> Strategy:
        if not extra[0]:  # shapes may differ: agree on sizes
            return self
        if 0 < gather_by_broadcast_floor() <= data.numel() * data.element_size():
            return ALL_GATHER_SAME_SHAPE_LARGE  # no pass-through: the driver may take the broadcasts
        return ALL_GATHER_SAME_SHAPE


ALL_GATHER = AllGather("all_gather")  # extra: (same_shape, async_op)
ALL_GATHER_SAME_SHAPE = Gather("all_gather", direct=True)  # the engine may issue a pass-through directly
ALL_GATHER_SAME_SHAPE_LARGE = Gather("all_gather")  # same_shape=True at a size where broadcasts may win
GATHER = Gather("gather")
SCATTER = Scatter()
REDUCE_SCATTER = ReduceScatter()
BARRIER = Barrier()
SEND = PointToPoint("send")
RECV = PointToPoint("recv")
