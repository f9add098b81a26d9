"""hwdist's own traffic: small ints, byte strings, header rows and flat buffers, in one place.

Every exchange hwdist makes for itself (the header round's rows, the object
collectives' payloads, ``all_reduce_dict``'s buffers, the launcher's node
table) goes through this
module, never through a user-facing op: a user's ``all_reduce`` always issues
torch's all_reduce so that it stays interchangeable with raw
``torch.distributed`` calls. Each function takes the group and finds its driver
through the registry; what travels is chosen by the driver's plan (a lossless
widening, a byte view), so it works on every backend that can move one integer
dtype.

Every exchange is issued by the collective engine
([`issue`][hwdist.collectives.engine.issue]); nothing here calls
torch.distributed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from .. import registry
from ..drivers.base import byte_carrier
from ..errors import PlanError
from .engine import issue, view, wire_call
from .wire import byte_view, itemsize, retype

Tensor = torch.Tensor


def reduce_flat(buf: Tensor, reduce_op: str, group: Any = None) -> None:
    """Reduce ``buf`` (on the comm device, in a dtype the driver reduces) in place: one all_reduce.

    ``reduce_op`` is an issued op name ('sum', 'max', ...).
    """
    issue(wire_call(group, "all_reduce", send=buf, reduce_op=reduce_op))


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
    carrier = _carrier(driver, "all_gather")
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
    carrier = _carrier(driver, "broadcast")
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


# ---- bytes of a size every rank already knows (object collectives, results collection) ----------

#: Waits for one issued work: ``wait(work, p2p)``. With no waiter the exchange is issued blocking.
Waiter = Callable[[Any, bool], None]


def _wire(data: np.ndarray, carrier: torch.dtype, dev: torch.device) -> Tensor:
    # uint8 bytes as a tensor of the carrier dtype on ``dev``, zero-padded to a whole carrier element
    t = torch.from_numpy(data)
    if carrier is not torch.uint8:
        pad = -t.numel() % itemsize(carrier)
        if pad:
            t = torch.cat([t, t.new_zeros(pad)])
        t = retype(t, carrier)
    return t if dev.type == "cpu" else t.to(dev)  # (from numpy: on the CPU)


def _room(n: int, carrier: torch.dtype, dev: torch.device) -> Tensor:
    return torch.empty(-(-n // itemsize(carrier)), dtype=carrier, device=dev)


def _host(t: Tensor, n: int) -> np.ndarray:
    # a received buffer's first ``n`` bytes on the host (no copy when it is a host uint8 buffer)
    host = t.numpy() if t.dtype is torch.uint8 and t.is_cpu and t.dim() == 1 else byte_view(t).cpu().numpy()
    return host if host.size == n else host[:n]


def _settle(work: Any, wait: Optional[Waiter], p2p: bool) -> None:
    if wait is not None:
        wait(work, p2p)
    elif work is not None:
        work.wait()


def carries(driver: Any, op: str) -> bool:
    """Whether ``driver`` moves bytes for ``op`` ('all_gather', 'broadcast', 'send', 'recv')."""
    try:
        _carrier(driver, op)
    except PlanError:
        return False
    return True


def _rows_in(data: np.ndarray, op: str, group: Any, driver: Any) -> tuple[Any, int, torch.dtype, Tensor]:
    """(driver, group size, byte carrier, ``data`` on the wire) for a gather of equal rows by ``op``."""
    driver = driver if driver is not None else registry.resolve(group)
    carrier = _carrier(driver, op)
    return driver, _world(group), carrier, _wire(data, carrier, driver.comm_device())


_CARRIERS: dict[tuple[Any, str], torch.dtype] = {}


def _carrier(driver: Any, op: str) -> torch.dtype:
    """``byte_carrier(driver, op)``, found once per driver and op (a PlanError is raised each time)."""
    found = _CARRIERS.get((driver, op))
    if found is None:
        found = _CARRIERS[(driver, op)] = byte_carrier(driver, op)
    return found


def gather_rows(
    data: np.ndarray, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> np.ndarray:
    """Every rank's ``data`` (uint8, the same length on every rank) as the rows of one array: one all_gather.

    Args:
        data: this rank's bytes.
        group: the process group (None: the default group).
        driver: the group's driver when the caller already has it.
        wait: waits for the issued work (None: issued blocking).

    Returns:
        A ``(world, len(data))`` uint8 array, rows in group-rank order.
    """
    driver, world, carrier, inp = _rows_in(data, "all_gather", group, driver)
    n = data.size
    out = torch.empty(inp.numel() * world, dtype=carrier, device=inp.device)
    # one receive tensor (the engine falls back to the list form where the driver has no flat one)
    work = issue(wire_call(group, "all_gather_flat", send=inp, recv=out, driver=driver), wait is not None)
    _settle(work, wait, False)
    width = inp.numel() * itemsize(carrier)
    rows = _host(out, width * world).reshape(world, width)
    return rows if width == n else rows[:, :n]


def gathers(driver: Any) -> bool:
    """Whether ``driver`` issues ``gather`` itself for bytes (not emulated with an all_gather)."""
    try:
        return driver.plan("gather", _carrier(driver, "gather")).native_op == "gather"
    except PlanError:
        return False


def gather_rows_to(
    data: np.ndarray, dst: int, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> Optional[list[np.ndarray]]:
    """Every rank's ``data`` (uint8, the same length on every rank) as rows on global rank ``dst``: a gather.

    Only the destination receives: the bytes of a gather to one rank cross the
    network once, where an all_gather moves every rank's to every rank. Use it
    where [`gathers`][hwdist.collectives.transport.gathers] says the driver issues gather itself.

    Returns:
        On ``dst``: one uint8 array per group rank, in group-rank order (each ``len(data)`` bytes, not
        copied out of what was received); elsewhere None.
    """
    driver, world, _, inp = _rows_in(data, "gather", group, driver)
    n = data.size
    root = view(group).rank == dst
    outs = (
        list(torch.empty((world, inp.numel()), dtype=inp.dtype, device=inp.device).unbind(0))
        if root
        else None
    )
    work = issue(wire_call(group, "gather", send=inp, recv=outs, root=dst, driver=driver), wait is not None)
    _settle(work, wait, False)
    return None if outs is None else [_host(t, n) for t in outs]


def broadcast_sized(
    data: Optional[np.ndarray],
    n: int,
    src: int,
    group: Any = None,
    driver: Any = None,
    wait: Optional[Waiter] = None,
) -> np.ndarray:
    """The ``n`` bytes of global rank ``src`` on every rank (every rank knows ``n``): one broadcast.

    Args:
        data: the bytes on ``src`` (``n`` of them; ignored elsewhere, pass None).
        n: their length.
        src: the global rank that sends.

    Returns:
        The bytes (``data`` itself on ``src``).
    """
    driver = driver if driver is not None else registry.resolve(group)
    dev = driver.comm_device()
    carrier = _carrier(driver, "broadcast")
    t = _wire(data, carrier, dev) if data is not None else _room(n, carrier, dev)
    work = issue(wire_call(group, "broadcast", send=t, root=src), wait is not None)
    _settle(work, wait, False)
    return data if data is not None else _host(t, n)


def send_bytes(
    data: np.ndarray, dst: int, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> None:
    """Send ``data`` (uint8) to global rank ``dst``, which receives it with ``recv_bytes(len(data), ...)``."""
    driver = driver if driver is not None else registry.resolve(group)
    t = _wire(data, _carrier(driver, "send"), driver.comm_device())
    _settle(issue(wire_call(group, "send", send=t, root=dst), True), wait, True)


def recv_bytes(
    n: int, src: int, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> np.ndarray:
    """``n`` bytes from global rank ``src``, sent with ``send_bytes``."""
    driver = driver if driver is not None else registry.resolve(group)
    t = _room(n, _carrier(driver, "recv"), driver.comm_device())
    _settle(issue(wire_call(group, "recv", send=t, root=src), True), wait, True)
    return _host(t, n)
