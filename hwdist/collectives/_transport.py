"""hwdist's own traffic: small ints, byte strings, max/min and flat buffers, in one place.

Every exchange hwdist makes for itself (shape and size exchanges, the agreement
primitive, verification mode's digests, the object collectives' records,
``all_reduce_dict``'s buffers, the launcher's node table) goes through this
module, never through a user-facing op: a user's ``all_reduce`` always issues
torch's all_reduce so that it stays interchangeable with raw
``torch.distributed`` calls. Each function takes the group and finds its driver
through the registry; what travels is chosen by the driver's plan (a lossless
widening, a byte view), so it works on every backend that can move one integer
dtype.

A driver with ``reduce_by_gather_max_bytes`` (gloo) gets small buffers as one
all_gather plus a local reduction: every rank reduces the same rows in the
same order, so every rank gets the same bits.

Every exchange is issued by the collective engine
([`issue`][hwdist.collectives._engine.issue]); nothing here calls
torch.distributed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from .. import registry
from ..drivers.base import byte_carrier
from ._engine import issue, view, wire_call

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

def reduce_buffer(buf: Tensor, reduce_op: str, group: Any, world_size: int, driver: Any) -> None:
    """All-reduce the contiguous ``buf`` in place with ``reduce_op`` (an issued op name: 'sum', 'max', ...).
    """
    limit = driver.reduce_by_gather_max_bytes
    local = _LOCAL.get(reduce_op) if limit else None
    if local is not None and buf.numel() * buf.element_size() * world_size <= limit:
        gathered = torch.empty(world_size * buf.numel(), dtype=buf.dtype, device=buf.device)
        issue(wire_call(group, "all_gather_flat", send=buf.reshape(-1), recv=gathered, driver=driver))
        local(gathered.view(world_size, *buf.shape), buf)
    else:
        issue(wire_call(group, "all_reduce", send=buf, reduce_op=reduce_op))


_MAX_PLANS: dict[Any, Any] = {}


def max_and_min(values: list[int], group: Any, world_size: int, driver: Any) -> tuple[list[int], list[int]]:
    """Element-wise max and min over the ranks of 31-bit ints: one small MAX of ``values`` and negations.

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
    reduce_buffer(buf, plan.reduce_op or "max", group, world_size, driver)
    got = [int(x) for x in buf.tolist()]
    n = len(values)
    return got[:n], [-x for x in got[n:]]


def _world(group: Any) -> int:
    return int(view(group).size)


def gather_ints(values: Sequence[int], group: Any = None, driver: Any = None) -> list[list[int]]:
    """Every rank's ``values`` (int64, the same length on every rank): one small all_gather.

    Args:
        values: this rank's integers.
        group: the process group (None: the default group).
        driver: the group's driver when the caller already has it.

    Returns:
        One list per group rank, in group-rank order.
    """
    driver = driver if driver is not None else registry.resolve(group)
    plan = driver.plan("all_gather", torch.int64)
    mine = torch.tensor(list(values), dtype=torch.int64)
    wire = mine.view(plan.comm_dtype) if plan.view else mine.to(plan.comm_dtype)
    wire = wire.to(driver.comm_device())
    outs = [torch.empty_like(wire) for _ in range(_world(group))]
    issue(wire_call(group, "all_gather", send=wire, recv=outs))
    stacked = torch.stack(outs).cpu()
    back = stacked.view(torch.int64) if plan.view else stacked.to(torch.int64)
    return back.tolist()


def _gather_padded(out: torch.Tensor, inp: torch.Tensor, group: Any, driver: Any) -> None:
    # Lengths are multiples of 8, so the bytes fit any integer carrier up to int64.
    carrier = byte_carrier(driver, "all_gather")
    chunks = list(out.view(carrier).chunk(_world(group)))
    issue(wire_call(group, "all_gather", send=inp.view(carrier), recv=chunks))


def gather_bytes(data: bytes, group: Any = None, driver: Any = None) -> list[bytes]:
    """Every rank's ``data`` (any lengths): the lengths first, then one padded all_gather.

    Returns:
        One byte string per group rank, in group-rank order.
    """
    driver = driver if driver is not None else registry.resolve(group)
    world = _world(group)
    dev = driver.comm_device()
    lengths = [row[0] for row in gather_ints([len(data)], group, driver)]
    width = max(8, (max(lengths) + 7) // 8 * 8)
    padded = bytearray(data) + bytearray(width - len(data))
    buf = torch.empty(world * width, dtype=torch.uint8, device=dev)
    _gather_padded(buf, torch.frombuffer(padded, dtype=torch.uint8).to(dev), group, driver)
    host = buf.cpu().numpy().tobytes()
    return [host[i * width : i * width + lengths[i]] for i in range(world)]


def broadcast_bytes(data: Optional[bytes], src: int, group: Any = None, driver: Any = None) -> bytes:
    """``data`` of global rank ``src`` on every rank: its length first, then the bytes.

    Args:
        data: the bytes on ``src`` (ignored elsewhere).
        src: the global rank that sends.
    """
    driver = driver if driver is not None else registry.resolve(group)
    dev = driver.comm_device()
    me = view(group).rank
    head = torch.tensor([len(data or b"") if me == src else 0], dtype=torch.int64)
    carrier = byte_carrier(driver, "broadcast")
    head_wire = head.view(torch.uint8).to(dev)
    issue(wire_call(group, "broadcast", send=head_wire.view(carrier), root=src))
    n = int(head_wire.cpu().view(torch.int64)[0])
    width = max(8, (n + 7) // 8 * 8)
    if me == src:
        buf = torch.frombuffer(bytearray(data or b"") + bytearray(width - n), dtype=torch.uint8).to(dev)
    else:
        buf = torch.empty(width, dtype=torch.uint8, device=dev)
    issue(wire_call(group, "broadcast", send=buf.view(carrier), root=src))
    return buf.cpu().numpy().tobytes()[:n]
