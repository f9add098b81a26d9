"""Tensor collectives with mmengine.dist's names: thin operations on the collective engine.

Each public function checks its arguments (on every rank, before any communication) and makes one call of the
engine (hwdist/collectives/engine.py: resolve, plan, wire format, issue, finish; docs/architecture.md).
Without a process group every function has mmengine's single-process result. ``src``/``dst`` are global ranks,
as in torch.distributed.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from . import wire as _wire
from ._strategies import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, GATHER, RECV, REDUCE
from ._strategies import REDUCE_SCATTER, SCATTER, SEND, gathered_numels
from .call_entry import CollectiveHandle, collective
from .engine import view
from .verify import TensorFields as _fields
from .wire import REDUCE_OP_NAMES as REDUCE_OP_NAMES  # tests and callers read it here
from .wire import ReduceOpLike, normalize_reduce_op

__all__ = [
    "all_reduce", "all_gather", "gather", "broadcast", "reduce", "scatter", "reduce_scatter", "all_to_all",
    "barrier", "send", "recv", "isend", "irecv", "sync_random_seed", "reduce_mean", "pad_to_largest_tensor",
    "CollectiveHandle", "all_gather_single", "all_gather_into_tensor", "gather_single", "gather_into_tensor",
    "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single",
]  # fmt: skip

Tensor = torch.Tensor
_check_tensor = _wire.check_tensor


# ---- all_reduce / reduce -----------------------------------------------------------------------------
@collective(2, describe=_fields.all_reduce)
def all_reduce(
    data: Tensor, op: ReduceOpLike = "sum", group: Optional[Any] = None, *, async_op: bool = False
) -> Any:
    """Reduce ``data`` across all ranks so that every rank gets the result, in place.

    ``op`` is one of ``'sum', 'mean', 'product', 'min', 'max', 'band', 'bor', 'bxor'`` (case-insensitive) or a
    ``torch.distributed.ReduceOp`` (``ReduceOp.AVG`` means ``'mean'``). An integer mean keeps the dtype and
    floors (mmengine truncates toward zero); its sum is taken in a wider integer where the backend has one.
    Dtypes the backend cannot reduce are widened losslessly; without a lossless plan
    [`hwdist.PlanError`][hwdist.drivers.base.PlanError] is raised on every rank before any communication (the
    rules: docs/architecture.md). Non-distributed: does nothing.

    Args:
        data: input and output, modified in place (any device the group's driver can reach; it is moved to the
            comm device and back only when needed).
        op: the reduce op.
        group: process group (default group if None).
        async_op: return a [`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle] whose ``wait()``
            also finishes the copy back (always a handle, whatever the plan and backend).

    Returns:
        None, or a handle when ``async_op`` is True.

    Raises:
        ValueError: unknown ``op`` (a plain int such as ``5`` included).
        TypeError: ``data`` is not a dense tensor.
        hwdist.PlanError: no correct plan for this dtype/op on this backend.

    Examples:
        >>> data = torch.arange(2) + 1 + 2 * rank
        >>> # rank 0: tensor([1, 2])   rank 1: tensor([3, 4])
        >>> dist.all_reduce(data)
        >>> # rank 0: tensor([4, 6])   rank 1: tensor([4, 6])
        >>> dist.all_reduce(data, op="mean")
        >>> # rank 0: tensor([2, 3])   rank 1: tensor([2, 3])
    """
    rop = normalize_reduce_op(op, "op", "all_reduce")
    _check_tensor(data, "data", "all_reduce")
    return view(group).run(ALL_REDUCE, data, async_op, rop)


@collective(3, describe=_fields.reduce)
def reduce(
    data: Tensor,
    dst: int = 0,
    op: ReduceOpLike = "sum",
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Reduce ``data`` across ranks into rank ``dst``'s tensor, in place.

    Same ops, casts and mean rule as [`all_reduce`][hwdist.collectives.tensor.all_reduce]. Backends without a
    native reduce get it as an all_reduce (the driver's plan says so). On ranks other than ``dst``, ``data``
    is unspecified afterwards (torch's rule; hwdist leaves it unchanged when a cast was needed).
    Non-distributed: does nothing.

    Args:
        data: input everywhere; the result on ``dst``.
        dst: global rank that receives the result.
        op: the reduce op.
        group: process group.
        async_op: return a handle.

    Raises:
        ValueError: unknown ``op`` or ``dst`` out of range (on every rank).

    Examples:
        >>> data = torch.tensor([1.0 + rank])
        >>> # rank 0: tensor([1.])   rank 1: tensor([2.])
        >>> dist.reduce(data, dst=0)
        >>> # rank 0: tensor([3.])   rank 1: (unspecified)
    """
    rop = normalize_reduce_op(op, "op", "reduce")
    _check_tensor(data, "data", "reduce")
    g = view(group)
    dst = g.check_rank(dst, "dst", "reduce")
    return g.run(REDUCE, data, async_op, rop, dst)


# ---- all_gather / gather -----------------------------------------------------------------------------
@collective(1, describe=_fields.all_gather)
def all_gather(
    data: Tensor, group: Optional[Any] = None, *, same_shape: bool = False, async_op: bool = False
) -> Any:
    """Gather ``data`` from every rank into a list, on every rank.

    Shapes may differ across ranks (any ndim): the ranks agree on the sizes in the one header round, then the
    data moves at the largest rank's size (two collectives). ``same_shape=True`` skips the header round when
    every rank passes the same shape (as in mmengine). Every rank raises the same TypeError when the dtypes
    differ. Dtypes the backend cannot move travel as a byte view, exactly. Costs and routes (one broadcast per
    rank for large tensors where the driver says so): docs/collectives.md.

    Non-distributed or a one-rank group: returns ``[data]``.

    Args:
        data: this rank's tensor.
        group: process group (default group if None).
        same_shape: promise that every rank's ``data`` has the same shape.
        async_op: return a [`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle]; ``wait()``
            returns the list.

    Returns:
        ``list[Tensor]`` in rank order, in ``data``'s dtype and device.

    Examples:
        >>> data = torch.arange(rank + 1)
        >>> # rank 0: tensor([0])   rank 1: tensor([0, 1])
        >>> dist.all_gather(data)
        >>> # rank 0: [tensor([0]), tensor([0, 1])]
        >>> # rank 1: [tensor([0]), tensor([0, 1])]
    """
    _check_tensor(data, "data", "all_gather")
    return view(group).run(ALL_GATHER, data, async_op, extra=(same_shape, async_op))


@collective(2, describe=_fields.gather)
def gather(
    data: Tensor,
    dst: int = 0,
    group: Optional[Any] = None,
    *,
    same_shape: bool = False,
    async_op: bool = False,
) -> Any:
    """Gather ``data`` from every rank into a list on rank ``dst``.

    Shapes may differ across ranks (see [`all_gather`][hwdist.collectives.tensor.all_gather] for the cost and
    ``same_shape``). Backends without a native gather (the driver's plan says so) run it as an all_gather,
    keeping the result on ``dst`` only. The data is always the comm-ready (moved/cast) tensor.

    Non-distributed or a one-rank group: returns ``[data]``.

    Args:
        data: this rank's tensor.
        dst: global rank that receives the list.
        group: process group.
        same_shape: skip the size agreement.
        async_op: return a [`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle]; ``wait()``
            returns the list.

    Returns:
        On ``dst``: ``list[Tensor]`` in rank order; on other ranks: ``[]``.

    Raises:
        ValueError: ``dst`` out of range (on every rank).
        TypeError: ``dst`` is not an int rank (``None`` included), before any communication.

    Examples:
        >>> data = torch.tensor([rank])
        >>> # rank 0: tensor([0])   rank 1: tensor([1])
        >>> dist.gather(data, dst=0)
        >>> # rank 0: [tensor([0]), tensor([1])]   rank 1: []
    """
    _check_tensor(data, "data", "gather")
    g = view(group)
    dst = g.check_rank(dst, "dst", "gather")  # before anything else: dst=None must not pass for an all_gather
    return g.run(GATHER, data, async_op, root=dst, extra=(same_shape, async_op))


@collective(1, describe=_fields.pad_to_largest_tensor)
def pad_to_largest_tensor(tensor: Tensor, group: Optional[Any] = None) -> tuple[list[int], Tensor]:
    """Flatten ``tensor`` and pad it with zeros to the largest element count of any rank.

    The building block of uneven gathers (vis4d's helper, any ndim and dtype). Costs one header round (every
    rank's size, one small all_gather); every rank raises the same TypeError when the dtypes differ.

    Returns:
        ``(numels, padded)``: every rank's ``tensor.numel()`` in rank order,
        and this rank's flattened tensor padded to ``max(numels)``.
        Non-distributed: ``([tensor.numel()], tensor.reshape(-1))``.

    Examples:
        >>> t = torch.ones(rank + 1, dtype=torch.uint8)
        >>> # rank 0: tensor([1])   rank 1: tensor([1, 1])
        >>> dist.pad_to_largest_tensor(t)
        >>> # rank 0: ([1, 2], tensor([1, 0]))   rank 1: ([1, 2], tensor([1, 1]))
    """
    _check_tensor(tensor, "tensor", "pad_to_largest_tensor")
    flat = tensor.reshape(-1)
    g = view(group)
    if g.size == 1:
        return [flat.numel()], flat
    driver, _ = g.target(tensor)
    numels = gathered_numels(tensor, group, driver, "pad_to_largest_tensor")
    width = max(numels)
    if flat.numel() < width:
        flat = torch.cat([flat, flat.new_zeros(width - flat.numel())])
    return numels, flat


# ---- broadcast / scatter / reduce_scatter / all_to_all -----------------------------------------------
@collective(2, describe=_fields.broadcast)
def broadcast(data: Tensor, src: int = 0, group: Optional[Any] = None, *, async_op: bool = False) -> Any:
    """Broadcast ``data`` from rank ``src`` to every rank, in place.

    ``data`` must have the same shape on every rank. Non-contiguous tensors and dtypes the backend cannot move
    (byte view) are handled; the caller's tensor keeps its dtype and device. Non-distributed: does nothing.

    Args:
        data: sent from ``src``, overwritten elsewhere.
        src: global rank to broadcast from.
        group: process group.
        async_op: return a handle whose ``wait()`` also copies back.

    Raises:
        ValueError: ``src`` out of range (on every rank).

    Examples:
        >>> data = torch.arange(2) + 1 + 2 * rank
        >>> # rank 0: tensor([1, 2])   rank 1: tensor([3, 4])
        >>> dist.broadcast(data, src=0)
        >>> # rank 0: tensor([1, 2])   rank 1: tensor([1, 2])
    """
    _check_tensor(data, "data", "broadcast")
    g = view(group)
    src = g.check_rank(src, "src", "broadcast")
    return g.run(BROADCAST, data, async_op, root=src)


@collective(3, describe=_fields.scatter)
def scatter(
    data: Tensor,
    scatter_list: Optional[Sequence[Tensor]] = None,
    src: int = 0,
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Send ``scatter_list[i]`` from rank ``src`` to rank ``i``'s ``data``, in place.

    torch's signature. Backends without a native scatter run it as one broadcast of the whole list (the
    driver's plan says so). When ``scatter_list`` is wrong on ``src`` (one tensor per rank, each of ``data``'s
    shape and dtype), ``src`` still joins the collective with a failure flag (one extra element per rank on
    the wire), so EVERY rank raises instead of waiting forever.

    Non-distributed: ``data`` gets ``scatter_list[0]``.

    Args:
        data: output on every rank (same shape on every rank).
        scatter_list: on ``src``, one tensor per rank of the group; ignored elsewhere.
        src: global rank that scatters.
        group: process group.
        async_op: return a handle whose ``wait()`` also copies back.

    Raises:
        ValueError: bad ``src`` (every rank); bad ``scatter_list`` on ``src`` (every rank, after the
            collective; ranks other than ``src`` raise ValueError naming ``src`` whatever its error was).
        TypeError: non-tensor ``data``; non-tensor ``scatter_list`` items (on ``src``).

    Examples:
        >>> data = torch.zeros(2)
        >>> lst = [torch.full((2,), float(i)) for i in range(2)] if rank == 0 else None
        >>> dist.scatter(data, lst, src=0)
        >>> # rank 0: tensor([0., 0.])   rank 1: tensor([1., 1.])
    """
    _check_tensor(data, "data", "scatter")
    g = view(group)
    src = g.check_rank(src, "src", "scatter")
    return g.run(SCATTER, data, async_op, root=src, extra=scatter_list)  # src checks the list (status slot)


@collective(3, describe=_fields.reduce_scatter)
def reduce_scatter(
    output: Tensor,
    input_list: Union[Sequence[Tensor], Tensor],
    op: ReduceOpLike = "sum",
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Reduce ``input_list[i]`` across ranks into rank ``i``'s ``output``, in place.

    ``input_list`` is a list of one tensor per rank (each of ``output``'s shape and dtype), or one tensor
    holding them concatenated along dim 0 (torch's ``reduce_scatter_tensor`` layout). Same ops, casts and mean
    rule as [`all_reduce`][hwdist.collectives.tensor.all_reduce]. Backends without reduce_scatter get it as an
    all_reduce of the whole input followed by a slice (world-size times the traffic; the driver's plan says
    when). ``input_list`` is not modified.

    Non-distributed: ``output`` gets ``input_list[0]``.

    Raises:
        ValueError: unknown ``op``, wrong number/shape/dtype of inputs (on every rank, before any
            communication).
        TypeError: non-tensor inputs (on every rank).

    Examples:
        >>> out = torch.zeros(1)
        >>> inp = [torch.tensor([1.0 + rank]), torch.tensor([10.0 * (1 + rank)])]
        >>> # rank 0: [1.], [10.]   rank 1: [2.], [20.]
        >>> dist.reduce_scatter(out, inp)
        >>> # rank 0: tensor([3.])   rank 1: tensor([30.])
    """
    rop = normalize_reduce_op(op, "op", "reduce_scatter")
    _check_tensor(output, "output", "reduce_scatter")
    g = view(group)
    items = _wire.split_input(input_list, output, g.size, "reduce_scatter")
    return g.run(REDUCE_SCATTER, output, async_op, rop, extra=items)


@collective(2, describe=_fields.all_to_all)
def all_to_all(
    output_list: Sequence[Tensor],
    input_list: Sequence[Tensor],
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Send ``input_list[j]`` to rank ``j``; receive rank ``j``'s piece into ``output_list[j]``.

    torch's signature; pieces may have different sizes. Backends without all_to_all get it through one
    exchange of the piece sizes plus one all_gather of every rank's pieces (world-size times the traffic; the
    driver's plan says when); there, size mismatches raise on every rank.

    Non-distributed: ``output_list[0]`` gets ``input_list[0]``.

    Examples:
        >>> inp = [torch.tensor([10 * rank + j]) for j in range(2)]
        >>> # rank 0: [0], [1]   rank 1: [10], [11]
        >>> out = [torch.empty(1, dtype=torch.int64) for _ in range(2)]
        >>> dist.all_to_all(out, inp)
        >>> # rank 0: [0], [10]   rank 1: [1], [11]
    """
    g = view(group)
    ws = g.size
    if not isinstance(input_list, (list, tuple)) or not input_list:
        raise TypeError(
            f"all_to_all: input_list must be a list of {ws} tensors, got {type(input_list).__name__}"
        )
    _check_tensor(input_list[0], "input_list[0]", "all_to_all")
    ins = _wire.check_tensor_list(input_list, "input_list", "all_to_all", ws, input_list[0])
    outs = _wire.check_tensor_list(output_list, "output_list", "all_to_all", ws, input_list[0])
    return g.run(ALL_TO_ALL, ins[0], async_op, extra=(ins, outs))


@collective(0, describe=_fields.barrier)
def barrier(group: Optional[Any] = None) -> None:
    """Block until every rank of ``group`` arrives; no-op when not distributed.

    In verification mode a rank that meets another collective instead raises
    [`hwdist.CollectiveMismatch`][hwdist.collectives.verify.CollectiveMismatch] on every rank.

    Examples:
        >>> dist.barrier()   # every rank returns once the last one has arrived
    """
    view(group).run(BARRIER, None)


# ---- point to point (not fingerprinted in verification mode: one partner, not the group) -------------
@collective(2)
def send(data: Tensor, dst: int, group: Optional[Any] = None, tag: int = 0) -> None:
    """Send ``data`` to rank ``dst`` (blocking), through the driver's dtype/device plan.

    Examples:
        >>> if rank == 0: dist.send(torch.tensor([7]), dst=1)
        >>> if rank == 1: t = torch.empty(1, dtype=torch.int64); dist.recv(t, src=0)  # t: tensor([7])
    """
    _check_tensor(data, "data", "send")
    g = view(group)
    dst = g.check_peer(dst, "dst", "send")
    g.run(SEND, data, root=dst, extra=("send", tag))


@collective(2)
def recv(data: Tensor, src: Optional[int] = None, group: Optional[Any] = None, tag: int = 0) -> int:
    """Receive into ``data`` from rank ``src`` (any rank if None); returns the sender's rank.

    Examples:
        >>> t = torch.empty(1, dtype=torch.int64)
        >>> dist.recv(t, src=0)   # rank 1: returns 0, t holds what rank 0 sent
    """
    _check_tensor(data, "data", "recv")
    g = view(group)
    src = g.check_peer(src, "src", "recv")
    return g.run(RECV, data, root=src, extra=("recv", tag))  # type: ignore[no-any-return]


@collective(2)
def isend(data: Tensor, dst: int, group: Optional[Any] = None, tag: int = 0) -> CollectiveHandle:
    """Start sending ``data`` to ``dst``; returns a handle (``wait()`` completes it).

    On a driver without async support the send completes before returning.
    """
    _check_tensor(data, "data", "isend")
    g = view(group)
    dst = g.check_peer(dst, "dst", "isend")
    return g.run(SEND, data, True, root=dst, extra=("isend", tag))  # type: ignore[no-any-return]


@collective(2)
def irecv(
    data: Tensor, src: Optional[int] = None, group: Optional[Any] = None, tag: int = 0
) -> CollectiveHandle:
    """Start receiving into ``data``; the handle's ``wait()`` copies back and returns the sender rank.

    Examples:
        >>> h = dist.irecv(t, src=0); ...; sender = h.wait()
    """
    _check_tensor(data, "data", "irecv")
    g = view(group)
    src = g.check_peer(src, "src", "irecv")
    return g.run(RECV, data, True, root=src, extra=("irecv", tag))  # type: ignore[no-any-return]


# ---- helpers from mmengine / vis4d -------------------------------------------------------------------
@collective(0)
def sync_random_seed(group: Optional[Any] = None) -> int:
    """A random seed drawn on the group's first rank and shared with every rank.

    Travels as an int32 on the driver's comm device. Non-distributed: a fresh random int in ``[0, 2**31)``.

    Examples:
        >>> dist.sync_random_seed()
        >>> # rank 0: 587791752   rank 1: 587791752
    """
    seed = int(np.random.randint(2**31))
    g = view(group)
    if g.size == 1:
        return seed
    ranks = g.ranks()
    src = 0 if ranks is None else ranks[0]
    device = g.target(None)[0].comm_device()
    t = torch.tensor(seed if g.rank == src else 0, dtype=torch.int32, device=device)
    broadcast(t, src=src, group=group)
    return int(t.item())


@collective(1)
def reduce_mean(tensor: Tensor, group: Optional[Any] = None) -> Tensor:
    """The mean of ``tensor`` over the ranks, as a new tensor (the input is unchanged).

    vis4d's helper; integer tensors get the floor of the mean (see
    [`all_reduce`][hwdist.collectives.tensor.all_reduce]). Non-distributed: returns ``tensor`` itself.

    Examples:
        >>> dist.reduce_mean(torch.tensor([1.0 + rank]))
        >>> # rank 0: tensor([1.5000])   rank 1: tensor([1.5000])
    """
    _check_tensor(tensor, "tensor", "reduce_mean")
    if view(group).size == 1:
        return tensor
    out = tensor.detach().clone()
    all_reduce(out, "mean", group)
    return out


# ---- torch's one-tensor spellings (torch 2.15 names ``*_single`` first; ``*_into_tensor`` and --------
# ``reduce_scatter_tensor`` stay as aliases, neither warning): the same calls on the functions above
def _into(output: Tensor, pieces: Any, name: str) -> None:
    """Copy the gathered ``pieces`` (one per rank) into torch's single output tensor: ``ws * n`` along dim
    0, or stacked ``(ws, *shape)``."""
    rows = list(pieces)
    need = sum(p.numel() for p in rows)
    if output.numel() != need:
        raise ValueError(
            f"{name}: output_tensor must hold every rank's input ({need} elements: {len(rows)} x"
            f" {rows[0].numel()}), got shape {tuple(output.shape)}"
        )
    with torch.no_grad():
        output.view(-1).copy_(torch.cat([p.reshape(-1) for p in rows]))


def _flat(output: Tensor, handle: Any, name: str, async_op: bool) -> Any:
    if not async_op:
        _into(output, handle, name)
        return None
    return CollectiveHandle(handle, lambda _: _into(output, handle.wait(), name))


def all_gather_single(
    output_tensor: Tensor, input_tensor: Tensor, group: Optional[Any] = None, async_op: bool = False
) -> Any:
    """torch's ``all_gather_single`` (``all_gather_into_tensor``): every rank's ``input_tensor`` into
    ``output_tensor`` (``ws * n`` along dim 0, or stacked), through
    [`all_gather`][hwdist.collectives.tensor.all_gather]'s plan."""
    _check_tensor(output_tensor, "output_tensor", "all_gather_single")
    got = all_gather(input_tensor, group, same_shape=True, async_op=async_op)
    return _flat(output_tensor, got, "all_gather_single", async_op)


def gather_single(
    tensor: Tensor,
    gather_tensor: Optional[Tensor] = None,
    dst: Optional[int] = None,
    group: Optional[Any] = None,
    async_op: bool = False,
    group_dst: Optional[int] = None,
) -> Any:
    """torch's ``gather_single`` (``gather_into_tensor``): every rank's ``tensor`` into ``gather_tensor``
    on ``dst`` (global rank; ``group_dst`` the rank within ``group``), through
    [`gather`][hwdist.collectives.tensor.gather]'s plan."""
    if dst is not None and group_dst is not None:
        raise ValueError(f"gather_single: give dst or group_dst, not both (got {dst=}, {group_dst=})")
    g = view(group)
    if group_dst is not None:
        ranks = g.ranks()
        dst = group_dst if ranks is None else ranks[group_dst]
    root = 0 if dst is None else dst
    if g.rank == root and not isinstance(gather_tensor, Tensor):
        raise ValueError(
            f"gather_single: gather_tensor must be a tensor on the destination rank {root}, got"
            f" {type(gather_tensor).__name__}"
        )
    got = gather(tensor, root, group, same_shape=True, async_op=async_op)
    if g.rank != root or gather_tensor is None:
        return got if async_op else None
    return _flat(gather_tensor, got, "gather_single", async_op)


def reduce_scatter_single(
    output: Tensor,
    input: Tensor,
    op: ReduceOpLike = "sum",
    group: Optional[Any] = None,
    async_op: bool = False,
) -> Any:
    """torch's ``reduce_scatter_single`` (``reduce_scatter_tensor``):
    [`reduce_scatter`][hwdist.collectives.tensor.reduce_scatter] of ``input``'s ``ws`` pieces along
    dim 0 into ``output``."""
    return reduce_scatter(output, input, op, group, async_op=async_op)


def all_to_all_single(
    output: Tensor,
    input: Tensor,
    output_split_sizes: Optional[Sequence[int]] = None,
    input_split_sizes: Optional[Sequence[int]] = None,
    group: Optional[Any] = None,
    async_op: bool = False,
) -> Any:
    """torch's ``all_to_all_single``: ``input`` split along dim 0 (equally, or by ``input_split_sizes``),
    piece ``j`` to rank ``j``, received into ``output`` split the same way, through
    [`all_to_all`][hwdist.collectives.tensor.all_to_all]'s plan."""
    ws = view(group).size
    _check_tensor(output, "output", "all_to_all_single")
    _check_tensor(input, "input", "all_to_all_single")
    ins = list(input.split(list(input_split_sizes)) if input_split_sizes else input.chunk(ws))
    outs = list(output.split(list(output_split_sizes)) if output_split_sizes else output.chunk(ws))
    return all_to_all(outs, ins, group, async_op=async_op)


all_gather_into_tensor = all_gather_single
"""torch's older name of [`all_gather_single`][hwdist.collectives.tensor.all_gather_single] (no warning)."""
gather_into_tensor = gather_single
"""torch's older name of [`gather_single`][hwdist.collectives.tensor.gather_single] (no warning)."""
reduce_scatter_tensor = reduce_scatter_single
"""torch's older name of [`reduce_scatter_single`][hwdist.collectives.tensor.reduce_scatter_single]."""
