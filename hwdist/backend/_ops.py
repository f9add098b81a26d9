"""What the wrapper does around the wrapped backend when a plan is not a pass-through.

Each function takes the wrapper's [`Target`][hwdist.backend.wrapper.Target] (the driver and the wrapped
backend for one device type), the caller's arguments as torch hands them to a backend, and the plan;
it issues the wrapped backend's call(s) on wire buffers (cast, byte view, on the comm device) and
returns a Work that completes once the result is in the caller's tensors
(hwdist/backend/_work.py). The wire helpers are the engine's (hwdist/collectives/wire.py), so a
call through the backend travels exactly as the same hwdist call would.

Emulations: the mean as SUM then divide (integers floor-divided; int64 as quotients and remainders),
PREMUL_SUM as a local multiply then SUM, MIN/MAX the backend lacks (or on a dtype it cannot reduce
losslessly) as an all_gather and a local reduction, reduce_scatter as an all_reduce and a slice,
reduce as an all_reduce, gather as an all_gather, scatter as a broadcast of every row, all_to_all as
an all_gather of every rank's input (uneven splits agree on the sizes first).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as torch_dist

from ..collectives import wire as _wire
from ..collectives.wire import comm_numel, exact_mean, finish_reduction, from_comm, prepare
from ..collectives.wire import reduction_send, restore, split_mean, torch_op
from ..drivers.base import Plan
from . import _work

Tensor = torch.Tensor

#: The "plan" of a MIN/MAX the driver has no plan for: an all_gather and a local reduction.
GATHER_REDUCE = "gather-reduce"


def _opts(cls: Any, src: Any, **fields: Any) -> Any:
    """New options of ``cls`` with the caller's timeout and async flag, and ``fields``."""
    out = cls()
    for name in ("timeout", "asyncOp"):
        if hasattr(src, name):
            setattr(out, name, getattr(src, name))
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def _buf(shape: Sequence[int], plan: Plan, like: Tensor, cdev: Optional[torch.device]) -> Tensor:
    """An empty wire buffer for a tensor of ``shape`` in the caller's dtype."""
    return torch.empty(comm_numel(shape, plan), dtype=plan.comm_dtype, device=cdev or like.device)


def _premul(send: Tensor, factor: Any) -> None:
    """PREMUL_SUM's local multiply (``factor``: a float or a one-element tensor; None: nothing)."""
    if factor is not None:
        with torch.no_grad():
            send.mul_(factor)


def _local_reduce(stacked: Tensor, rop: str) -> Tensor:
    """Reduce ``stacked`` (ranks along dim 0) here: the gather-reduce emulation's last step."""
    if rop == "max":
        return stacked.amax(0)
    if rop == "min":
        return stacked.amin(0)
    raise AssertionError(rop)


# ---------------------------------------------------------------------------------------------- reductions
def all_reduce(tg: Any, tensors: list[Tensor], opts: Any, plan: Any, rop: str, factor: Any) -> Any:
    """all_reduce as the plan says (cast, mean, PREMUL_SUM, or MIN/MAX by all_gather)."""
    if plan == GATHER_REDUCE:
        return _gather_reduce(tg, tensors, rop, keep=True)
    ws = tg.size  # closures keep numbers, never the target: the last reference to a wrapped backend
    # must not be dropped on that backend's own worker thread (its destructor would join itself)
    sends, aliased = _reduction_sends(tg, tensors, plan, factor)
    work = tg.inner.allreduce(sends, _opts(torch_dist.AllreduceOptions, opts, reduceOp=torch_op(plan)))

    def finish() -> None:
        for t, send, alias in zip(tensors, sends, aliased):
            finish_reduction(t, send, plan, ws, alias)

    return _work.then([work], finish, tensors)


def _reduction_sends(
    tg: Any, tensors: list[Tensor], plan: Plan, factor: Any
) -> tuple[list[Tensor], list[bool]]:
    """A reduction's wire buffers (``wire.reduction_send``, then PREMUL_SUM's factor: it comes with
    ``sum``, never with the int64 mean that splits a buffer) and whether each is the caller's tensor."""
    sends: list[Tensor] = []
    aliased: list[bool] = []
    for t in tensors:
        send, alias = reduction_send(t, plan, tg.cdev(t), tg.size)
        _premul(send, factor)
        sends.append(send)
        aliased.append(alias)
    return sends, aliased


def _gather_reduce(tg: Any, tensors: list[Tensor], rop: str, keep: bool, root: Optional[int] = None) -> Any:
    """MIN/MAX through an all_gather of every rank's tensor and a local reduction (exact)."""
    works, rows, me = [], [], tg.rank
    for t in tensors:
        plan = tg.plan("all_gather", t.dtype)
        cdev = tg.cdev(t)
        send, _ = prepare(t, plan, cdev)
        outs = [torch.empty_like(send) for _ in range(tg.size)]
        works.append(tg.inner.allgather([outs], [send]))
        rows.append((t, plan, outs))

    def finish() -> None:
        if not keep and me != root:
            return
        for t, plan, outs in rows:
            stacked = torch.stack([from_comm(o, plan, t.shape, t.device) for o in outs])
            with torch.no_grad():
                t.copy_(_local_reduce(stacked, rop))

    return _work.then(works, finish, tensors)


def reduce(tg: Any, tensors: list[Tensor], opts: Any, plan: Any, rop: str, factor: Any) -> Any:
    """reduce to ``opts.rootRank``: natively on wire buffers, or as an all_reduce the plan names."""
    root, ws, me = opts.rootRank, tg.size, tg.rank
    if plan == GATHER_REDUCE:
        return _gather_reduce(tg, tensors, rop, keep=False, root=root)
    sends, aliased = _reduction_sends(tg, tensors, plan, factor)
    if plan.native_op == "reduce":
        work = tg.inner.reduce(
            sends, _opts(torch_dist.ReduceOptions, opts, reduceOp=torch_op(plan), rootRank=root)
        )
    else:
        work = tg.inner.allreduce(sends, _opts(torch_dist.AllreduceOptions, opts, reduceOp=torch_op(plan)))

    def finish() -> None:
        if me == root:
            for t, send, alias in zip(tensors, sends, aliased):
                finish_reduction(t, send, plan, ws, alias)

    return _work.then([work], finish, tensors)


def reduce_scatter(tg: Any, output: Tensor, rows: Tensor, opts: Any, plan: Any, rop: str, factor: Any) -> Any:
    """reduce_scatter of ``rows`` (one row per rank, the caller's dtype) into ``output``."""
    ws, me = tg.size, tg.rank
    if plan == GATHER_REDUCE:
        return _gather_reduce_scatter(tg, output, rows, rop)
    cdev = tg.cdev(output)
    rs_opts = _opts(torch_dist.ReduceScatterOptions, opts, reduceOp=torch_op(plan))
    if (
        plan.native_op == "reduce_scatter"
        and not plan.cast
        and factor is None
        and not exact_mean(plan)
        and cdev is None
        and rows.is_contiguous()
        and output.is_contiguous()
    ):  # only the mean's division: the caller's rows in, its output out, no copy
        flat_out = output.reshape(-1)
        ins = rows.reshape(ws, -1)
        if tg.flat("reduce_scatter"):
            work = tg.inner.reduce_scatter_single(flat_out, ins.reshape(-1), rs_opts)
        else:
            work = tg.inner.reduce_scatter([flat_out], [list(ins.unbind(0))], rs_opts)
        return _work.then([work], lambda: finish_reduction(output, flat_out, plan, ws, True), [output])
    flat = torch.empty(
        (ws, comm_numel(output.shape, plan)), dtype=plan.comm_dtype, device=cdev or rows.device
    )
    for i in range(ws):
        flat[i].copy_(_wire.copy_source(rows[i], plan, cdev))
    _premul(flat, factor)
    if exact_mean(plan):
        flat = split_mean(flat, ws)
    if plan.native_op == "reduce_scatter":
        recv = flat.new_empty(flat.shape[1])
        if tg.flat("reduce_scatter"):
            work = tg.inner.reduce_scatter_single(recv, flat.reshape(-1), rs_opts)
        else:
            work = tg.inner.reduce_scatter([recv], [list(flat.unbind(0))], rs_opts)
    else:  # an all_reduce of every row, then this rank's row
        work = tg.inner.allreduce([flat], _opts(torch_dist.AllreduceOptions, opts, reduceOp=torch_op(plan)))
        recv = flat[me]

    def finish() -> None:
        finish_reduction(output, recv, plan, ws, False)

    return _work.then([work], finish, [output])


def _gather_reduce_scatter(tg: Any, output: Tensor, rows: Tensor, rop: str) -> Any:
    plan, me = tg.plan("all_gather", rows.dtype), tg.rank
    # every rank needs only its own row of every rank's input: an all_to_all would move less, but the
    # all_gather of the whole input is the one move every backend has
    full, _ = prepare(rows.contiguous(), plan, tg.cdev(output))
    outs = [torch.empty_like(full) for _ in range(tg.size)]
    work = tg.inner.allgather([outs], [full])

    def finish() -> None:
        mine = [from_comm(o, plan, rows.shape, output.device)[me] for o in outs]
        with torch.no_grad():
            output.copy_(_local_reduce(torch.stack(mine), rop).reshape(output.shape))

    return _work.then([work], finish, [output])


# ---------------------------------------------------------------------------------------------- moves
def broadcast(tg: Any, tensors: list[Tensor], opts: Any, plan: Plan) -> Any:
    """broadcast from ``opts.rootRank`` on wire buffers (a byte view, the comm device)."""
    sends = [prepare(t, plan, tg.cdev(t)) for t in tensors]
    work = tg.inner.broadcast([s for s, _ in sends], opts)
    me, root = tg.rank, opts.rootRank

    def finish() -> None:
        if me != root:
            for t, (s, alias) in zip(tensors, sends):
                if not alias:
                    restore(t, s, plan)

    return _work.then([work], finish, tensors)


def all_gather(tg: Any, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any, plan: Plan) -> Any:
    """all_gather's list form on wire buffers, copied into the caller's output list."""
    t = inputs[0]
    cdev = tg.cdev(t)
    send, _ = prepare(t, plan, cdev)
    outs = [torch.empty_like(send) for _ in range(tg.size)]
    work = tg.inner.allgather([outs], [send], opts)

    def finish() -> None:
        for dst, buf in zip(outputs[0], outs):
            restore(dst, buf, plan)

    return _work.then([work], finish, outputs)


def all_gather_single(tg: Any, output: Tensor, input: Tensor, opts: Any, plan: Plan) -> Any:
    """all_gather into one tensor: the flat form on a wire buffer, or the list form (into ``output``'s rows
    themselves when nothing is cast)."""
    ws = tg.size
    cdev = tg.cdev(input)
    if plan.passthrough and cdev is None and output.is_contiguous() and input.is_contiguous():
        rows = list(output.view(ws, -1).unbind(0))  # the backend writes the caller's tensor: no copy
        return tg.inner.allgather([rows], [input.reshape(-1)], opts)
    send, _ = prepare(input, plan, cdev)
    send = send.reshape(-1)
    if tg.flat("all_gather"):
        buf = send.new_empty(ws * send.numel())
        work = tg.inner.all_gather_single(buf, send, opts)
        bufs = list(buf.view(ws, -1).unbind(0))
    else:
        bufs = [torch.empty_like(send) for _ in range(ws)]
        work = tg.inner.allgather([bufs], [send], opts)

    def finish() -> None:
        for dst, buf in zip(output.view(ws, -1).unbind(0) if output.is_contiguous() else [], bufs):
            restore(dst, buf, plan)
        if not output.is_contiguous():
            with torch.no_grad():
                output.copy_(
                    torch.cat([from_comm(b, plan, input.shape, output.device) for b in bufs]).view(
                        output.shape
                    )
                )

    return _work.then([work], finish, [output])


def gather(tg: Any, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any, plan: Plan) -> Any:
    """gather to ``opts.rootRank``: natively on wire buffers, or as an all_gather the plan names."""
    t, root, me = inputs[0], opts.rootRank, tg.rank
    send, _ = prepare(t, plan, tg.cdev(t))
    bufs: list[Tensor] = []
    if plan.native_op == "gather":
        bufs = [torch.empty_like(send) for _ in range(tg.size)] if tg.rank == root else []
        work = tg.inner.gather([bufs] if bufs else [], [send], opts)
    else:
        bufs = [torch.empty_like(send) for _ in range(tg.size)]
        work = tg.inner.allgather([bufs], [send])

    def finish() -> None:
        if me == root:
            for dst, buf in zip(outputs[0], bufs):
                restore(dst, buf, plan)

    return _work.then([work], finish, outputs)


def scatter(tg: Any, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any, plan: Plan) -> Any:
    """scatter from ``opts.rootRank``: natively on wire buffers, or one broadcast of every row."""
    out, root, ws = outputs[0], opts.rootRank, tg.size
    cdev = tg.cdev(out)
    n = comm_numel(out.shape, plan)
    device = cdev or out.device
    rows = torch.empty((ws, n), dtype=plan.comm_dtype, device=device)
    if tg.rank == root:
        for i, piece in enumerate(inputs[0]):
            rows[i].copy_(_wire.copy_source(piece, plan, cdev))
    if plan.native_op == "scatter":
        recv = rows.new_empty(n)
        work = tg.inner.scatter([recv], [list(rows.unbind(0))] if tg.rank == root else [], opts)
    else:
        work = tg.inner.broadcast([rows], _opts(torch_dist.BroadcastOptions, opts, rootRank=root))
        recv = rows[tg.rank]

    def finish() -> None:
        restore(out, recv, plan)

    return _work.then([work], finish, outputs)


def point_to_point(tg: Any, kind: str, tensors: list[Tensor], peer: int, tag: int, plan: Plan) -> Any:
    """send / recv on wire buffers (``kind``: ``'send'``, ``'recv'``)."""
    bufs = [prepare(t, plan, tg.cdev(t)) for t in tensors]
    wire = [b for b, _ in bufs]
    if kind == "send":
        work = tg.inner.send(wire, peer, tag)
    else:
        work = tg.inner.recv(wire, peer, tag)

    def finish() -> None:
        if kind == "recv":
            for t, (b, alias) in zip(tensors, bufs):
                if not alias:
                    restore(t, b, plan)

    return _work.then([work], finish, tensors)


# ---------------------------------------------------------------------------------------------- all_to_all
def all_to_all_single(
    tg: Any, output: Tensor, input: Tensor, out_splits: list[int], in_splits: list[int], opts: Any, plan: Plan
) -> Any:
    """all_to_all_single: the list form on wire pieces, or an all_gather of every rank's input."""
    ws = tg.size
    ins = list(input.split(in_splits)) if in_splits else list(input.chunk(ws)) if input.numel() else []
    outs = list(output.split(out_splits)) if out_splits else list(output.chunk(ws)) if output.numel() else []
    if len(ins) != ws or len(outs) != ws:  # an empty tensor, or fewer rows than ranks
        ins = list(input.split(in_splits or [input.shape[0] // ws] * ws))
        outs = list(output.split(out_splits or [output.shape[0] // ws] * ws))
    return all_to_all(tg, outs, ins, opts, plan, uneven=bool(in_splits or out_splits))


def all_to_all(
    tg: Any, outs: list[Tensor], ins: list[Tensor], opts: Any, plan: Plan, uneven: bool = True
) -> Any:
    """all_to_all of pieces: the list form on wire pieces, or the all_gather emulation."""
    cdev = tg.cdev(ins[0]) if ins else None
    if plan.native_op == "all_to_all":
        sends = [prepare(p.contiguous(), plan, cdev)[0] for p in ins]
        recvs = [_buf(o.shape, plan, o, cdev) for o in outs]
        work = tg.inner.alltoall(recvs, sends, opts)

        def finish() -> None:
            for o, r in zip(outs, recvs):
                restore(o, r, plan)

        return _work.then([work], finish, outs)
    return _all_to_all_by_gather(tg, outs, ins, plan, cdev, uneven)


def _all_to_all_by_gather(
    tg: Any, outs: list[Tensor], ins: list[Tensor], plan: Plan, cdev: Optional[torch.device], uneven: bool
) -> Any:
    ws, me = tg.size, tg.rank
    sizes = [comm_numel(p.shape, plan) for p in ins]
    if uneven:  # every rank's piece sizes first (a small exchange the data round waits for)
        table = _exchange_sizes(tg, sizes, cdev or (ins[0].device if ins else torch.device("cpu")))
    else:
        table = [sizes] * ws
    width = max(sum(row) for row in table)
    device = cdev or (ins[0].device if ins else outs[0].device)
    mine = torch.zeros(width, dtype=plan.comm_dtype, device=device)
    at = 0
    for p, n in zip(ins, sizes):
        if n:
            mine[at : at + n].copy_(_wire.copy_source(p, plan, cdev))
        at += n
    bufs = [torch.empty_like(mine) for _ in range(ws)]
    work = tg.inner.allgather([bufs], [mine])

    def finish() -> None:
        for j in range(ws):
            start = sum(table[j][:me])
            piece = bufs[j][start : start + table[j][me]]
            if outs[j].numel():
                restore(outs[j], piece, plan)

    return _work.then([work], finish, outs)


def _exchange_sizes(tg: Any, sizes: list[int], device: torch.device) -> list[list[int]]:
    """Every rank's piece sizes (waits: the data round needs them)."""
    plan = tg.plan("all_gather", torch.int64)
    mine = torch.tensor(sizes, dtype=torch.int64, device=device)
    send, _ = prepare(mine, plan, None)
    bufs = [torch.empty_like(send) for _ in range(tg.size)]
    tg.inner.allgather([bufs], [send]).wait()
    return [from_comm(b, plan, mine.shape, device).tolist() for b in bufs]


def coalesced(works: list[Any], result: Any) -> Any:
    """One Work over the works of a coalesced call issued one by one."""
    return _work.then(works, lambda: None, result)
