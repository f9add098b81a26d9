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

A driver whose tuning has ``reduce_by_gather_max_bytes`` (gloo;
``hwdist.drivers.tuning``) gets small buffers as one all_gather plus a local
reduction: every rank reduces the same rows in the same order, so every rank gets the same bits.

Every exchange is issued by the collective engine
([`issue`][hwdist.collectives.engine.issue]); nothing here calls
torch.distributed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from .. import _state, registry
from ..drivers import tuning as _tuning
from ..drivers.base import byte_carrier
from ..drivers.tuning import tuning
from ..errors import PlanError
from .engine import issue, view, wire_call
from ._wire import byte_view, itemsize, retype

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
#: The same reductions of two rows as one binary op (``op(row0, row1, out=out)``): what two ranks need,
#: without a reduction over a dim (the same bits; cheaper per call: docs/collectives.md).
_PAIR: dict[str, Callable[..., Tensor]] = {
    "sum": torch.add,
    "product": torch.mul,
    "max": torch.maximum,
    "min": torch.minimum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


class FlatReducer:
    """Reduces buffers of one shape, dtype and device across a group in place, call after call.

    The route (one all_gather plus a local reduction, or one all_reduce: ``reduce_by_gather_max_bytes``),
    the gathered rows' buffer and the wire call are chosen and made once; each call then issues one
    collective (and the local reduction). What ``all_reduce_dict`` keeps per layout. A keeper checks
    ``current()`` before each call: False once ``set_tuning`` has changed the table the route was chosen
    from.

    With ``tail``, every buffer ends with check slots (``all_reduce_dict``'s): ``reduce_checked`` then
    tells in the same collective whether every rank sent this rank's ``tail``.

    Args:
        like: a buffer of the shape, dtype and device every call's buffer has (contiguous).
        reduce_op: an issued op name ('sum', 'max', ...).
        group: the process group.
        world_size: the group's size.
        driver: the group's driver.
        tail: the check slots this rank's buffers end with (1-D, ``like``'s dtype), or None.
    """

    __slots__ = ("call", "gathered", "flat", "generation", "values", "tails", "expect")

    def __init__(
        self,
        like: Tensor,
        reduce_op: str,
        group: Any,
        world_size: int,
        driver: Any,
        tail: Optional[Tensor] = None,
    ) -> None:
        #: the tuning table's generation the route was chosen under (a keeper remakes the reducer when
        #: ``set_tuning`` has run since: the route then follows the new table on every rank alike)
        self.generation = _tuning.generation
        limit = tuning(driver).reduce_by_gather_max_bytes
        local = _LOCAL.get(reduce_op) if limit else None
        #: the buffer is 1-D (it goes as it is; else as a flat view of it)
        self.flat = like.dim() == 1
        #: the gather route's local reduction of the gathered rows into a buffer; None: all_reduce
        self.gathered: Optional[Callable[[Tensor], Any]] = None
        #: with ``tail``: a new tensor of the values' reduction (the gather route; None: in place) ...
        self.values: Optional[Callable[[], Tensor]] = None
        #: ... every rank's check slots (gathered rows) or the reduced ones (a slice, cut per call) ...
        self.tails: Any = None
        #: ... and what they are when every rank sent ``tail``
        self.expect: Any = None
        cut = like.numel() - (tail.numel() if tail is not None else 0)  # the values' elements
        if local is not None and like.numel() * like.element_size() * world_size <= limit:
            recv = torch.empty(world_size * like.numel(), dtype=like.dtype, device=like.device)
            self.call = wire_call(group, "all_gather_flat", recv=recv, driver=driver)
            rows = recv.view(world_size, *like.shape)
            pair = _PAIR.get(reduce_op) if world_size == 2 else None
            if pair is not None:  # views of the two rows, made once (the buffer is reused)
                first, second = rows.unbind(0)
                self.gathered = lambda out: pair(first, second, out=out)
            else:
                self.gathered = lambda out: local(rows, out)
            if tail is not None:  # the values reduced into a new tensor; the slots compared as they came
                flat_rows = recv.view(world_size, -1)
                self.tails, self.expect = flat_rows[:, cut:], tail.expand(world_size, -1)
                kept = flat_rows[:, :cut]
                if pair is not None:
                    v0, v1 = kept.unbind(0)
                    self.values = lambda: pair(v0, v1)
                else:
                    dtype, device = like.dtype, like.device
                    self.values = lambda: _into(local, kept, torch.empty(cut, dtype=dtype, device=device))
        else:
            self.call = wire_call(group, "all_reduce", reduce_op=reduce_op)
            if tail is not None:  # a sum of equal slots is the group's size times them
                self.tails, self.expect = cut, tail * world_size if reduce_op == "sum" else tail

    def current(self) -> bool:
        """Whether the tuning table is still the one this reducer's route was chosen from."""
        return self.generation == _tuning.generation

    def __call__(self, buf: Tensor) -> None:
        """Reduce ``buf`` (the shape, dtype and device of ``like``, contiguous) in place."""
        gathered = self.gathered
        self._issue(buf if (gathered is None or self.flat) else buf.reshape(-1))
        if gathered is not None:
            gathered(buf)

    def _issue(self, send: Tensor) -> None:
        c = self.call
        c.send = send
        try:
            issue(c)
        finally:
            c.send = None  # the caller's buffer is not kept

    def reduce_checked(self, buf: Tensor) -> Optional[Tensor]:
        """Reduce ``buf`` (1-D, ending with check slots; a reducer made with ``tail``): the reduced values
        without the slots when every rank sent this rank's ``tail``; else None, with all of ``buf`` reduced
        in place (its slots then tell what differs).

        Every rank gets the same answer: on the gather route each compares every rank's slots with its
        own (equal everywhere or nowhere); on the all_reduce route the reduced slots are the same bits on
        every rank.
        """
        values = self.values
        if values is None:  # all_reduce: in place, then the reduced slots
            self(buf)
            cut = self.tails
            return buf[:cut] if torch.equal(buf[cut:], self.expect) else None
        self._issue(buf)
        if torch.equal(self.tails, self.expect):
            return values()
        self.gathered(buf)  # type: ignore[misc]
        return None


def _into(local: Callable[[Tensor, Tensor], Any], rows: Tensor, out: Tensor) -> Tensor:
    """``out``, with ``rows`` reduced into it by ``local`` (one of ``_LOCAL``)."""
    local(rows, out)
    return out


_MAX_PLANS: dict[Any, Any] = {}


def max_and_min(values: list[int], group: Any, world_size: int, driver: Any) -> tuple[list[int], list[int]]:
    """Element-wise max and min over the ranks of 31-bit ints: one small MAX of ``values`` and negations.

    Travels as int32, or as a lossless widening the driver plans, or as float64 (which holds 31-bit
    values exactly) where the driver has no integer MAX; where it has neither (a backend that reduces
    only float32 and bfloat16), every rank's values are gathered as bytes and reduced here.
    """
    plan: Any = _MAX_PLANS.get(driver)
    if plan is None:
        try:
            plan = driver.plan("all_reduce", torch.int32, "max")
        except TypeError:  # PlanError: no integer MAX here
            try:
                plan = driver.plan("all_reduce", torch.float64, "max")
            except TypeError:  # nor a float64 MAX: gather and reduce locally
                plan = False
        _MAX_PLANS[driver] = plan
    if plan is False:
        table = gather_ints(values, group, driver)
        return [max(col) for col in zip(*table)], [min(col) for col in zip(*table)]
    buf = torch.tensor(values + [-v for v in values], dtype=torch.int32)
    buf = buf.to(device=driver.comm_device(), dtype=plan.comm_dtype)
    # the group keeps one reducer per buffer shape (agree's exchange of a call site): no route, buffer
    # or wire call is made again on the next call
    kept = _state.of(group).reducers
    key = (driver, buf.numel(), buf.dtype, buf.device)
    reducer = kept.get(key)
    if reducer is None or not reducer.current():
        reducer = kept[key] = FlatReducer(buf, plan.reduce_op or "max", group, world_size, driver)
    reducer(buf)
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
    carrier = _carrier(driver, "all_gather")
    chunks = list(out.view(carrier).chunk(_world(group)))
    issue(wire_call(group, "all_gather", send=inp.view(carrier), recv=chunks))


def gather_equal(buf: Tensor, group: Any = None, driver: Any = None) -> Tensor:
    """Every rank's ``buf`` (uint8, the same length on every rank, a multiple of 8): one all_gather.

    No length exchange: the caller guarantees the length. Returns a ``(world, len)`` uint8 tensor on CPU.
    """
    driver = driver if driver is not None else registry.resolve(group)
    world = _world(group)
    dev = driver.comm_device()
    out = torch.empty(world * buf.numel(), dtype=torch.uint8, device=dev)
    _gather_padded(out, buf.reshape(-1).to(dev), group, driver)
    return out.cpu().view(world, buf.numel())


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
