"""hwdist's own small reductions: one flat buffer, reduced in place by one collective.

Used where hwdist itself decides what is sent on every rank (``all_reduce_dict``'s
buffers and layout check, verification mode's digest exchange), never for a
user's ``all_reduce``, which always issues torch's all_reduce so that it stays
interchangeable with raw ``torch.distributed`` calls.

A driver with ``reduce_by_gather_max_bytes`` (gloo) gets small buffers as one
all_gather plus a local reduction: every rank reduces the same rows in the
same order, so every rank gets the same bits.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as torch_dist

from .. import _compat

Tensor = torch.Tensor


def _bitwise(fn: Callable[..., Tensor]) -> Callable[[Tensor, Tensor], None]:
    def reduce(gathered: Tensor, out: Tensor) -> None:
        out.copy_(gathered[0])
        for row in gathered[1:]:
            fn(out, row, out=out)

    return reduce


#: Local reductions over the rows of an all_gather (dim 0), written into ``out`` in its own dtype.
_LOCAL: dict[str, Callable[[Tensor, Tensor], Any]] = {
    "sum": lambda g, out: torch.sum(g, 0, dtype=out.dtype, out=out),
    "product": lambda g, out: torch.prod(g, 0, dtype=out.dtype, out=out),
    "max": lambda g, out: torch.amax(g, 0, out=out),
    "min": lambda g, out: torch.amin(g, 0, out=out),
    "band": _bitwise(torch.bitwise_and),
    "bor": _bitwise(torch.bitwise_or),
    "bxor": _bitwise(torch.bitwise_xor),
}

_TORCH_OPS: dict[str, Any] = (
    {name: getattr(torch_dist.ReduceOp, name.upper()) for name in ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")}
    if torch_dist.is_available()
    else {}
)


def all_reduce_buffer(buf: Tensor, reduce_op: str, group: Any, world_size: int, driver: Any) -> None:
    """All-reduce the contiguous ``buf`` in place with ``reduce_op`` (an issued op name: 'sum', 'max', ...)."""
    limit = driver.reduce_by_gather_max_bytes
    local = _LOCAL.get(reduce_op) if limit else None
    if local is not None and buf.numel() * buf.element_size() * world_size <= limit:
        gathered = torch.empty(world_size * buf.numel(), dtype=buf.dtype, device=buf.device)
        if "all_gather" in driver.flat_ops:
            _compat.all_gather_into_tensor(gathered, buf.reshape(-1), group)
        else:  # no flat form on this backend/torch (gloo on torch 2.1)
            _compat.all_gather_into_tensor_by_list(gathered, buf.reshape(-1), group)
        local(gathered.view(world_size, *buf.shape), buf)
    else:
        torch_dist.all_reduce(buf, _TORCH_OPS[reduce_op], group)


_MAX_PLANS: dict[Any, Any] = {}


def max_and_min(values: list[int], group: Any, world_size: int, driver: Any) -> tuple[list[int], list[int]]:
    """Element-wise max and min over the ranks of 31-bit ints: one small MAX of ``values`` and their negations.

    Travels as int32, or as a lossless widening the driver plans, or as float64 (which holds 31-bit
    values exactly) where the driver has no integer MAX.
    """
    plan = _MAX_PLANS.get(driver)
    if plan is None:
        try:
            plan = driver.plan("all_reduce", torch.int32, "max")
        except TypeError:  # PlanError: no integer MAX here
            plan = driver.plan("all_reduce", torch.float64, "max")
        _MAX_PLANS[driver] = plan
    buf = torch.tensor(values + [-v for v in values], dtype=torch.int32)
    buf = buf.to(device=driver.comm_device(), dtype=plan.comm_dtype)
    all_reduce_buffer(buf, plan.reduce_op or "max", group, world_size, driver)
    got = [int(x) for x in buf.tolist()]
    n = len(values)
    return got[:n], [-x for x in got[n:]]
