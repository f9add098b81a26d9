"""The ``*_multigpu`` calls of [`hwdist.compat.legacy`][hwdist.compat.legacy], for one device per process."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

import hwdist

from ..collectives.tensor import normalize_reduce_op
from ..errors import CollectiveArgumentError
from ._legacy_common import agree_or_raise, fingerprint, group, group_of, reduce_op, require_pg, shown

__all__ = ["broadcast_multigpu", "all_reduce_multigpu", "reduce_multigpu", "all_gather_multigpu"]


# ----------------------------------------------------------------------------- *_multigpu
def _device_list(fn: str, name: str, items: Any) -> Optional[BaseException]:
    if (
        not isinstance(items, (list, tuple))
        or not items
        or not all(isinstance(t, torch.Tensor) for t in items)
    ):
        return CollectiveArgumentError(
            f"{fn}: {name} must be a non-empty list of tensors, got {items!r:.80}"
        )
    return None


_LOCAL: dict[str, Callable[..., torch.Tensor]] = {
    "sum": torch.add,
    "product": torch.mul,
    "max": torch.maximum,
    "min": torch.minimum,
}


def _local_reduce(fn: str, tensors: Sequence[torch.Tensor], op: Any) -> torch.Tensor:
    name = normalize_reduce_op(op)
    combine = _LOCAL.get(name)
    if combine is None:
        raise CollectiveArgumentError(
            f"{fn}: op must be one of reduce_op.SUM/PRODUCT/MAX/MIN, got {op!r}"
        )
    acc = tensors[0].clone()
    for t in tensors[1:]:
        acc = combine(acc, t.to(acc.device))
    return acc


def broadcast_multigpu(tensor_list: list[torch.Tensor], src: int, group: Any = group.WORLD) -> None:
    """``broadcast`` of ``src``'s ``tensor_list[0]`` into every tensor of every rank's list.

    One device per process is what hwdist drives; a longer list is filled
    locally after one broadcast. Every rank must pass a non-empty list.

    Examples:
        >>> ts = [torch.tensor([float(rank)])]
        >>> dist.broadcast_multigpu(ts, 0)
        # rank 0: [tensor([0.])]   rank 1: [tensor([0.])]
    """
    require_pg("broadcast_multigpu")
    grp = group_of(group)
    problem = _device_list("broadcast_multigpu", "tensor_list", tensor_list)
    if problem is None and (isinstance(src, bool) or not isinstance(src, int) or src < 0):
        problem = ValueError(f"broadcast_multigpu: src must be a rank (an int >= 0), got {src!r}")
    # one rank's other src would pair broadcasts from different roots: every rank raises instead
    words = [len(tensor_list) if isinstance(tensor_list, list) else 0, 0 if problem else src]
    agree_or_raise("broadcast_multigpu", grp, problem, words, "src or len(tensor_list)", f"src={src!r}")
    hwdist.broadcast(tensor_list[0], src, grp)
    for t in tensor_list[1:]:
        t.copy_(tensor_list[0])


def _agreed_local_reduce(fn: str, tensor_list: list[torch.Tensor], op: Any, grp: Any) -> torch.Tensor:
    """Check ``tensor_list`` and reduce it locally; every rank raises together on a bad list."""
    problem = _device_list(fn, "tensor_list", tensor_list)
    acc: Optional[torch.Tensor] = None
    if problem is None:
        try:
            acc = _local_reduce(fn, tensor_list, op)
        except (TypeError, ValueError) as exc:
            problem = exc
        except RuntimeError as exc:  # torch's own words for tensors that do not combine
            problem = CollectiveArgumentError(f"{fn}: the tensors of tensor_list differ in shape ({exc})")
    words = [len(tensor_list), fingerprint(acc)]
    what = "len(tensor_list) or the result's shape and dtype"
    agree_or_raise(fn, grp, problem, words, what, f"{len(tensor_list)} tensors, {shown(acc)}")
    assert acc is not None
    return acc


def all_reduce_multigpu(
    tensor_list: list[torch.Tensor], op: Any = reduce_op.SUM, group: Any = group.WORLD
) -> None:
    """Reduce every tensor of every rank's list; each of them gets the result, in place.

    Examples:
        >>> ts = [torch.tensor([rank + 1.0])]
        >>> dist.all_reduce_multigpu(ts)
        # rank 0: [tensor([3.])]   rank 1: [tensor([3.])]
    """
    require_pg("all_reduce_multigpu")
    grp = group_of(group)
    acc = _agreed_local_reduce("all_reduce_multigpu", tensor_list, op, grp)
    hwdist.all_reduce(acc, op, grp)
    for t in tensor_list:
        t.copy_(acc)


def reduce_multigpu(
    tensor_list: list[torch.Tensor], dst: int, op: Any = reduce_op.SUM, group: Any = group.WORLD
) -> None:
    """Reduce every tensor of every rank's list into ``dst``'s ``tensor_list[0]``.

    Examples:
        >>> ts = [torch.tensor([rank + 1.0])]
        >>> dist.reduce_multigpu(ts, 0)
        # rank 0: [tensor([3.])]
    """
    require_pg("reduce_multigpu")
    grp = group_of(group)
    acc = _agreed_local_reduce("reduce_multigpu", tensor_list, op, grp)
    hwdist.reduce(acc, dst, op, grp)
    if hwdist.get_rank() == dst:
        tensor_list[0].copy_(acc)


def all_gather_multigpu(
    output_tensor_lists: list[list[torch.Tensor]],
    input_tensor_list: list[torch.Tensor],
    group: Any = group.WORLD,
) -> None:
    """Every rank's inputs into every output list: ``output_tensor_lists[i][r * k + j]`` is rank r's input j.

    ``k`` is ``len(input_tensor_list)`` (the same on every rank); each output
    list holds ``world_size * k`` tensors.

    Examples:
        >>> outs = [[torch.zeros(1) for _ in range(2)]]
        >>> dist.all_gather_multigpu(outs, [torch.tensor([float(rank)])])
        # rank 0: [[tensor([0.]), tensor([1.])]]   rank 1: the same
    """
    require_pg("all_gather_multigpu")
    grp = group_of(group)
    fn = "all_gather_multigpu"
    world = hwdist.get_world_size(grp)
    problem = _device_list(fn, "input_tensor_list", input_tensor_list)
    if problem is None and (
        not isinstance(output_tensor_lists, (list, tuple)) or not output_tensor_lists
    ):
        problem = CollectiveArgumentError(
            f"{fn}: output_tensor_lists must be a non-empty list of lists of tensors"
        )
    if problem is None:
        k = len(input_tensor_list)
        for i, outs in enumerate(output_tensor_lists):
            if not isinstance(outs, (list, tuple)) or len(outs) != world * k:
                problem = CollectiveArgumentError(
                    f"{fn}: output_tensor_lists[{i}] must hold world_size * len(input_tensor_list) ="
                    f" {world * k} tensors, got {len(outs) if isinstance(outs, (list, tuple)) else outs!r}"
                )
                break
    stacked: Optional[torch.Tensor] = None
    if problem is None:
        try:
            stacked = torch.stack([t.to(input_tensor_list[0].device) for t in input_tensor_list])
        except (RuntimeError, TypeError) as exc:
            problem = CollectiveArgumentError(f"{fn}: the inputs differ in shape or dtype ({exc})")
    fp = fingerprint(stacked) if stacked is not None else 0
    agree_or_raise(
        fn, grp, problem, [fp], "len(input_tensor_list) and the inputs' shape and dtype",
        f"{len(input_tensor_list)} x {shown(input_tensor_list[0])}" if problem is None else None,
    )
    assert stacked is not None
    parts = [row for got in hwdist.all_gather(stacked, grp, same_shape=True) for row in got]
    for outs in output_tensor_lists:
        for out, value in zip(outs, parts):
            out.copy_(value)
