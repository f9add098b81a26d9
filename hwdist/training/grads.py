"""demucs' ``sync_grad``: every gradient all-reduced on its own, after backward."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from .. import registry
from ..collectives.protocol import max_over_ranks
from ..collectives import tensor as _t
from ..collectives.call_entry import collective
from ..collectives.params import unique_tensors
from .arguments import check_same_tensors, distributed_size, grad_op, tensor_list

Tensor = torch.Tensor


@collective(2)
def sync_grad(params: Iterable[Tensor], op: Any = "mean", group: Optional[Any] = None) -> None:
    """All-reduce every gradient, one asynchronous collective per tensor, then average.

    demucs' ``sync_grad``, called after ``loss.backward()``: every
    ``.grad`` of ``params`` gets the mean (or sum) over the ranks. One tiny
    check collective comes first (same parameters and ``op`` on every rank, and
    whether any rank lacks a gradient); unused parameters follow
    [`GradientSynchronizer`][hwdist.training.GradientSynchronizer]'s rule (zeros where missing; still None
    where no rank has a gradient). For many small parameters
    [`GradientSynchronizer`][hwdist.training.GradientSynchronizer] is faster (buckets, overlap with backward).
    Non-distributed or a one-rank group: does nothing.

    Args:
        params: parameters (e.g. ``model.parameters()``); ``requires_grad=False`` ones are
            ignored, one listed twice is reduced once.
        op: ``'mean'`` (default) or ``'sum'``.
        group: process group (default group if None).

    Raises:
        TypeError: an item of ``params`` is not a tensor (on every rank).
        ValueError: bad ``op``, or the ranks passed different parameters or ops (on every rank).

    Examples:
        >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.full((2,), rank + 1.0)
        >>> # rank 0: w.grad [1., 1.]   rank 1: w.grad [2., 2.]
        >>> hwdist.sync_grad([w])
        >>> # rank 0: w.grad [1.5, 1.5]   rank 1: w.grad [1.5, 1.5]
    """
    fn = "sync_grad"
    problem: Optional[Exception] = None
    plist: list[Tensor] = []
    rop = "mean"
    try:
        rop = grad_op(op, fn)
        plist = unique_tensors(
            p for p in tensor_list(params, fn, "params") if p.requires_grad
        )  # [w, w]: once
        for i, p in enumerate(plist):
            if p.grad is not None and p.grad.layout != torch.strided:
                raise TypeError(
                    f"{fn}: sparse gradients are not supported (parameter {i} has a {p.grad.layout} gradient)"
                )
    except (TypeError, ValueError) as exc:
        problem = exc
    ws = distributed_size(group)
    if ws <= 1:
        if problem is not None:
            raise problem
        return
    has = [p.grad is not None for p in plist]
    any_missing = check_same_tensors(
        fn, plist, group, problem=problem, flag=int(not all(has)), config={"op": rop}
    )
    used = has
    if any_missing:  # someone lacks a gradient: learn which parameters any rank has
        driver = registry.resolve(group, plist[0].device)
        used = [bool(v) for v in max_over_ranks([int(h) for h in has], group, driver)]
    handles = []
    for p, u in zip(plist, used):
        if not u:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        handles.append(_t.all_reduce(p.grad, rop, group, async_op=True))
    for h in handles:
        h.wait()
