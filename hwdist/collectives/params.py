"""Many tensors in few collectives: metric dicts and model parameters.

Both functions pack their tensors into flat buffers (hwdist.collectives.flat),
one per communication dtype, so a dict of twenty metrics or a whole model
costs about one all_reduce. Dispatch goes through the group's driver exactly
as in [`hwdist.collectives.tensor`][hwdist.collectives.tensor].
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Optional

import torch
import torch.distributed as torch_dist

from .. import registry
from .verify import describe_tensor
from ..drivers.base import Post
from ..drivers.tuning import tuning
from . import tensor as _t
from ._args import not_dense, op_field
from ._dicts import all_reduce_dict, check_same_dicts  # noqa: F401 (re-exported)
from .call_entry import collective
from .engine import check
from .flat import FlatLayout, bucket_tensors, copy_from_flat, flatten_tensors, unique_tensors

__all__ = ["all_reduce_dict", "all_reduce_params"]

# all_reduce_dict lives in _dicts (its layouts and check); this module is where users import it from

Tensor = torch.Tensor


MiB = 1024 * 1024


def mib_bytes(value: Any, argname: str, fn: str) -> int:
    """A size in MiB as bytes (``<= 0`` -> -1); TypeError for anything but a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{fn}: {argname} must be a number of MiB, got {value!r}")
    return int(value * MiB) if value > 0 else -1


@collective(4)
def all_reduce_params(
    params: Iterable[Tensor],
    coalesce: bool = True,
    bucket_size_mb: float = -1,
    op: _t.ReduceOpLike = "sum",
    group: Optional[Any] = None,
) -> None:
    """All-reduce parameters (or buffers, or any tensors) in place.

    ``coalesce=True`` packs the tensors into flat buffers, one per dtype (and device), split into buckets of
    at most ``bucket_size_mb`` MiB when it is positive, and reduces each buffer with one all_reduce; buckets
    are issued asynchronously so packing the next one overlaps the communication of the previous. Tensors of
    at least the driver's ``pack_max_bytes`` (1 MiB on CPU backends, where a packing copy costs as much as
    the wire; 0 = pack everything on accelerators) are reduced in place, asynchronously, instead of being
    copied. Results are written back into the tensors (``.data``, so parameters that require grad work).
    ``coalesce=False`` runs one [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce] per tensor. Same
    ops, casts and mean rule as [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce]. Every rank must
    pass the same tensors (shapes, dtypes, order). A tensor given twice (``[p, p]``, or tied weights seen
    twice through ``state_dict().values()``) is reduced once. Non-distributed or a one-rank group: does
    nothing.

    Args:
        params: a list or generator of tensors (e.g. ``model.parameters()``).
        coalesce: pack into flat buffers (default) or reduce one by one.
        bucket_size_mb: bucket limit in MiB; ``<= 0``: one bucket per dtype.
        op: the reduce op.
        group: process group.

    Raises:
        TypeError: an item of ``params`` is not a tensor, or
            ``bucket_size_mb`` is not a number (on every rank).

    Examples:
        >>> params = [torch.tensor([1.0, 2.0]) + rank, torch.tensor([3.0]) + rank]
        >>> # rank 0: [1., 2.], [3.]   rank 1: [2., 3.], [4.]
        >>> dist.all_reduce_params(params)
        >>> # rank 0: [3., 5.], [7.]   rank 1: [3., 5.], [7.]
    """
    items = params if isinstance(params, (list, tuple)) else list(params)
    check(
        "all_reduce_params",
        group,
        lambda: (
            next((p for p in items if isinstance(p, torch.Tensor)), None),
            {
                "params": [describe_tensor(p) for p in items],
                "reduce_op": op_field(op),
                "coalesce": bool(coalesce),
                "bucket_size_mb": bucket_size_mb,
            },
        ),
    )
    rop = _t.normalize_reduce_op(op, "op", "all_reduce_params")
    bucket_bytes = mib_bytes(bucket_size_mb, "bucket_size_mb", "all_reduce_params")
    tensors: list[Tensor] = []
    for i, p in enumerate(items):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"all_reduce_params: params[{i}] must be a torch.Tensor, got {type(p).__name__}")
        if p.layout is not torch.strided:
            not_dense(p, f"params[{i}]", "all_reduce_params")
        tensors.append(p.data)
    if not torch_dist.is_initialized() or not tensors:
        return
    # a tensor given twice (or tied weights from state_dict().values()) is reduced once
    tensors = unique_tensors(tensors, same_memory=True)
    ws = torch_dist.get_world_size(group)
    if ws == 1:
        return
    if not coalesce:
        for t in tensors:
            _t.all_reduce(t, rop, group)
        return
    driver = registry.resolve(group, tensors[0].device)
    cdev = driver.comm_device()
    # Big tensors go as they are (asynchronously) where the driver says packing costs more than it saves.
    limit = tuning(driver).pack_max_bytes
    big = [limit > 0 and t.numel() * t.element_size() >= limit for t in tensors]
    if any(big) and len(tensors) > 1:
        # in place only over memory no other tensor views: overlapping in-place reductions count twice,
        # while packing reads every value before any result is written back
        counts = Counter((t.device, t.untyped_storage().data_ptr()) for t in tensors)
        big = [b and counts[(t.device, t.untyped_storage().data_ptr())] == 1 for b, t in zip(big, tensors)]
    direct = [t for t, b in zip(tensors, big) if b]
    packed = [t for t, b in zip(tensors, big) if not b]
    buckets = bucket_tensors(packed, bucket_bytes)
    plans = [driver.plan("all_reduce", packed[b[0]].dtype, rop) for b in buckets]
    for t in direct:  # errors before any communication
        driver.plan("all_reduce", t.dtype, rop)
    handles = [_t.all_reduce(t, rop, group, async_op=True) for t in direct]
    pending: list[tuple[Any, Tensor, list[Tensor], FlatLayout]] = []
    for bucket, plan in zip(buckets, plans):
        members = [packed[i] for i in bucket]
        # packed straight into the dtype the backend reduces (bf16 -> fp32 where needed): one copy;
        # an integer mean in its own dtype (all_reduce's mean rule: a wider sum, then the floor)
        own = plan.view or (plan.post is Post.DIVIDE and not plan.dtype.is_floating_point)
        flat, layout = flatten_tensors(members, dtype=plan.dtype if own else plan.comm_dtype, device=cdev)
        pending.append((_t.all_reduce(flat, rop, group, async_op=True), flat, members, layout))
    for handle, flat, members, layout in pending:
        handle.wait()
        copy_from_flat(flat, members, layout)
    for h in handles:
        h.wait()
