"""Broadcasting lists of tensors from one rank: MegEngine's ``bcast_list_``, demucs' ``broadcast_tensors``
and ``sync_buffer``."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
import torch.distributed as torch_dist

from .. import registry
from ..collectives import tensor as _t
from ..collectives.call_entry import collective
from ..collectives.params import bucket_tensors, copy_from_flat, flatten_tensors
from ..collectives.params import all_reduce_params
from ..info import is_distributed
from ..drivers.tuning import tuning
from .arguments import check_rank, check_same_tensors, distributed_size, tensor_list

Tensor = torch.Tensor
MiB = 1024 * 1024

#: Bucket limit for flattened broadcasts (bcast_list_, broadcast_tensors, sync_buffer).
_BROADCAST_BUCKET_BYTES = 32 * MiB


def broadcast_flat(tensors: Sequence[Tensor], src: int, group: Any) -> None:
    """Broadcast tensors in place, packed by dtype into flat buffers (big ones as they are)."""
    if not tensors:
        return
    driver = registry.resolve(group, tensors[0].device)
    cdev = driver.comm_device()
    data = [t.detach() for t in tensors]
    limit = tuning(driver).pack_max_bytes
    direct = [t for t in data if limit > 0 and t.numel() * t.element_size() >= limit]
    packed = [t for t in data if not (limit > 0 and t.numel() * t.element_size() >= limit)]
    is_src = torch_dist.get_rank() == src
    handles = [_t.broadcast(t, src, group, async_op=True) for t in direct]
    pending = []
    for bucket in bucket_tensors(packed, _BROADCAST_BUCKET_BYTES):
        members = [packed[i] for i in bucket]
        flat, layout = flatten_tensors(members, device=cdev)
        pending.append((_t.broadcast(flat, src, group, async_op=True), flat, members, layout))
    for handle, flat, members, layout in pending:
        handle.wait()
        if not is_src:
            copy_from_flat(flat, members, layout)
    for h in handles:
        h.wait()


def _broadcast_list(
    fn: str,
    tensors: list[Tensor],
    src: Any,
    group: Any,
    problem: Optional[Exception],
    config: Optional[dict[str, Any]] = None,
) -> None:
    """Check (the tensors, ``src`` and ``config`` agree across ranks) and broadcast from ``src``."""
    ws = distributed_size(group)
    if problem is None and is_distributed():
        try:
            src = check_rank(src, "src", fn, group)
        except (TypeError, ValueError) as exc:
            problem = exc
    if ws <= 1:
        if problem is not None:
            raise problem
        return
    check_same_tensors(fn, tensors, group, problem=problem, config={**(config or {}), "src": src})
    broadcast_flat(tensors, src, group)


@collective(2)
def bcast_list_(tensors: Iterable[Tensor], src: int = 0, group: Optional[Any] = None) -> None:
    """Broadcast a list of tensors from rank ``src``, in place (MegEngine's ``bcast_list_``).

    Any dtypes; tensors are packed by dtype into flat buffers (one broadcast
    per ~32 MiB bucket; on CPU backends tensors of at least the driver's
    ``pack_max_bytes`` go as they are), sent asynchronously and copied back.
    Parameters that require grad work (their ``.data`` changes). One tiny
    check collective first: when the ranks hold different numbers, shapes
    or dtypes of tensors, or name different ``src``, every rank raises instead of waiting.
    Non-distributed: does nothing.

    Args:
        tensors: a list or generator of tensors (e.g. ``model.parameters()``).
        src: global rank to broadcast from.
        group: process group (default group if None).

    Raises:
        TypeError: an item is not a tensor (on every rank).
        ValueError: bad ``src``, or the ranks' lists or ``src`` differ (on every rank).

    Examples:
        >>> ts = [torch.full((2,), rank + 1.0), torch.tensor([rank])]
        >>> # rank 0: [1., 1.], [0]   rank 1: [2., 2.], [1]
        >>> hwdist.bcast_list_(ts, src=0)
        >>> # rank 0: [1., 1.], [0]   rank 1: [1., 1.], [0]
    """
    _broadcast_checked("bcast_list_", tensors, src, group, floating_only=False)


# Args/Raises repeat bcast_list_'s on purpose: each public docstring stands alone.
@collective(2)
def broadcast_tensors(tensors: Iterable[Tensor], src: int = 0, group: Optional[Any] = None) -> None:
    """Broadcast the floating-point and complex tensors of a list from ``src``, in place.

    demucs' ``broadcast_tensors`` (e.g. ``broadcast_tensors(model.parameters())``
    before training): integer and bool tensors are skipped. Before any data
    moves, one tiny collective checks that every rank holds the same number
    of such tensors (and their shapes and dtypes) and names the same ``src``,
    so a mismatch raises on every rank instead of deadlocking. Same transport
    as [`bcast_list_`][hwdist.training.bcast_list_]. Non-distributed: does nothing.

    Args:
        tensors: a list or generator of tensors.
        src: global rank to broadcast from.
        group: process group (default group if None).

    Raises:
        TypeError: an item is not a tensor (on every rank).
        ValueError: bad ``src``, or the ranks' lists or ``src`` differ (on every rank).

    Examples:
        >>> ts = [torch.tensor([rank + 0.5]), torch.tensor([rank])]
        >>> # rank 0: [0.5], [0]   rank 1: [1.5], [1]
        >>> hwdist.broadcast_tensors(ts)
        >>> # rank 0: [0.5], [0]   rank 1: [0.5], [1]   (the int tensor is skipped)
    """
    _broadcast_checked("broadcast_tensors", tensors, src, group, floating_only=True)


@collective(3)
def sync_buffer(
    buffers: Iterable[Tensor], average: bool = True, src: int = 0, group: Optional[Any] = None
) -> None:
    """Make floating-point buffers (e.g. BatchNorm statistics) equal on every rank, in place.

    demucs' ``sync_buffer``: ``average=True`` replaces each buffer by its mean
    over the ranks (divided by the world size's *value*; the seed divided by
    the function ``world_size``); ``average=False`` broadcasts them from
    ``src``. Integer buffers (``num_batches_tracked``) are left alone. One
    tiny check collective first (same buffers, ``average`` and, to broadcast,
    ``src`` on every rank, else every rank raises). Non-distributed or a one-rank group: does nothing.

    Args:
        buffers: a list or generator of tensors (e.g. ``model.buffers()``).
        average: average (default) or broadcast from ``src``.
        src: global rank to broadcast from when ``average=False``.
        group: process group (default group if None).

    Raises:
        TypeError: an item is not a tensor (on every rank).
        ValueError: bad ``src``, or the ranks' buffers, ``average`` or ``src`` differ (on every rank).

    Examples:
        >>> bufs = [torch.tensor([1.0 + rank])]
        >>> # rank 0: [1.]   rank 1: [2.]
        >>> hwdist.sync_buffer(bufs)                  # rank 0: [1.5]   rank 1: [1.5]
        >>> hwdist.sync_buffer(bufs, average=False)   # everyone gets rank 0's value
    """
    fn = "sync_buffer"
    problem: Optional[Exception] = None
    items: list[Tensor] = []
    try:
        items = [t for t in tensor_list(buffers, fn, "buffers") if t.is_floating_point()]
    except TypeError as exc:
        problem = exc
    if not average:
        _broadcast_list(fn, items, src, group, problem, config={"average": False})
        return
    if distributed_size(group) <= 1:
        if problem is not None:
            raise problem
        return
    check_same_tensors(fn, items, group, problem=problem, config={"average": True})  # src: unused
    all_reduce_params(items, op="mean", group=group)


def _broadcast_checked(
    fn: str, tensors: Iterable[Tensor], src: int, group: Optional[Any], floating_only: bool
) -> None:
    """Check ``tensors`` (keeping only floating/complex ones if asked) and broadcast them from ``src``."""
    problem: Optional[Exception] = None
    items: list[Tensor] = []
    try:
        items = tensor_list(tensors, fn, "tensors")
        if floating_only:
            items = [t for t in items if t.is_floating_point() or t.is_complex()]
    except TypeError as exc:
        problem = exc
    _broadcast_list(fn, items, src, group, problem)
