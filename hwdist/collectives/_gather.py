"""The tensor gathers' strategy: ``all_gather`` / ``gather``, uneven shapes through the header round.

Without ``same_shape=True`` every rank may hold another shape, so the ranks must
agree on the sizes: [`Gather`][hwdist.collectives._gather.Gather] runs the one
header round ([`protocol`][hwdist.collectives.protocol]: each rank's byte size,
dtype and shape; with verification on, the call's fingerprint in the same
header), then moves exactly the padded data by the plan's native op: two
collectives. Every rank sees every header, so every rank reaches the same
verdict: go on, or raise the same error (the dtypes differ: a TypeError naming
each rank's; with verification on, a CollectiveMismatch). An all_gather of at
least the driver's ``gather_by_broadcast_min_bytes`` per rank (gloo's large
all_gather) moves as one broadcast per rank of exactly its bytes into one flat
buffer, ``same_shape=True`` included. The payload travels as bytes (the
driver's byte carrier), so a rank with another dtype never makes the collective
itself ill-formed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from ..drivers.base import Driver, Plan, byte_carrier
from ..drivers.tuning import tuning
from . import protocol, transport, verify
from .engine import Call, Strategy, issue, wire_call
from .protocol import Header
from ._wire import byte_view, comm_numel, copy_bytes, from_comm, itemsize, prepare

__all__ = ["Gather", "gathered_numels"]

Tensor = torch.Tensor
_GRANULE = 64  # the broadcasts' slots are multiples of this (any dtype's view stays aligned)

_REAL_OF_COMPLEX = {
    d: r
    for d, r in (
        (getattr(torch, "complex32", None), torch.float16),
        (torch.complex64, torch.float32),
        (torch.complex128, torch.float64),
    )
    if d is not None
}


def describe_dtype(t: Any) -> str:
    """``float32@cpu`` for a tensor (what an uneven gather's ranks must share), the type name otherwise."""
    return verify.describe_dtype(t)


def _raise_if_dtypes_differ(fn: str, headers: Sequence[Header]) -> None:
    """The dtypes differ: the same TypeError, naming each rank's dtype, on every rank."""
    if len({h.dtype for h in headers}) > 1:
        raise TypeError(
            f"{fn}: every rank must pass the same dtype; got "
            + ", ".join(f"rank {h.rank}: {protocol.dtype_name(h.dtype)}" for h in headers)
        )


def gathered_numels(data: Tensor, group: Any, driver: Driver, fn: str) -> list[int]:
    """Every rank's ``data.numel()`` (one header round); the same TypeError on every rank when the dtypes
    differ."""
    headers = protocol.exchange(Header.of_tensor(data, 0), group, driver)
    _raise_if_dtypes_differ(fn, headers)
    return [h.numel for h in headers]


def _shapes(headers: Sequence[Header], data: Tensor, group: Any, driver: Driver) -> list[torch.Size]:
    """Every rank's shape; a shape of more than 8 dims costs one more small exchange (rare)."""
    if all(h.shape is not None for h in headers):
        return [h.shape for h in headers]  # type: ignore[misc]
    width = max(h.ndim for h in headers)
    rows = transport.gather_ints((list(data.shape) + [0] * width)[:width], group, driver)
    return [torch.Size(rows[r][: h.ndim]) for r, h in enumerate(headers)]


def _words(h: Header) -> dict[str, Any]:
    return {"nbytes": h.nbytes, "dtype": h.dtype, "numel": h.numel, "ndim": h.ndim, "dims": h.dims}


def _bytes_of(buf: Tensor) -> Tensor:
    return byte_view(buf)


def _sized(b: Tensor, width: int) -> Tensor:
    """``b`` (uint8) itself when it has ``width`` bytes, else a zero-padded (or cut) copy."""
    if b.numel() == width:
        return b
    out = b.new_empty(width)
    n = min(b.numel(), width)
    copy_bytes(out[:n], b[:n])
    out[n:].zero_()
    return out


def _round(n: int, k: int) -> int:
    return max(-(-n // k) * k, k)


class Gather(Strategy):
    """all_gather (``root`` None) or gather to ``root``; uneven shapes through the size agreement.

    ``extra`` is ``(same_shape, async_op)``. With ``same_shape`` nothing is agreed
    (the caller's promise), as in mmengine.
    """

    def __init__(self, op: str, direct: bool = False) -> None:
        self.op = op
        self.direct = direct  # only with same_shape=True: no exchange, so a pass-through needs nothing else

    def plan(self, driver: Driver, data: Any, rop: Optional[str]) -> Plan:
        plan = driver.plan(self.op, data.dtype)
        if plan.native_op == "gather" and data.is_complex() and not plan.view:
            # torch.distributed.gather, unlike all_gather, does not view complex tensors as real pairs
            # (gloo: "Invalid scalar type"): travel as the real pairs' (planned) dtype, a byte-exact view
            real = driver.plan(self.op, _REAL_OF_COMPLEX[data.dtype])
            plan = dataclasses.replace(plan, comm_dtype=real.comm_dtype, view=True)
        return plan

    # -- to wire ---------------------------------------------------------------------------------
    def to_wire(self, c: Call) -> None:
        g, plan, data = c.view, c.plan, c.data
        ws = g.size
        if ws == 1:
            c.state = None
            return  # nothing to communicate: finish returns [data]
        same_shape, async_op = c.extra if isinstance(c.extra, tuple) else (bool(c.extra), False)
        buf, _ = prepare(data, plan, c.cdev)
        nbytes = buf.numel() * buf.element_size()
        big = tuning(c.driver).gather_by_broadcast_min_bytes if c.root is None else 0
        if same_shape:
            if big and nbytes >= big:
                self._broadcasts(c, buf, [nbytes] * ws, [data.shape] * ws)
            else:
                self._same_shape(c, buf)
            return
        head = Header.of_tensor(data, nbytes)
        fields: dict[str, Any] = {"data": describe_dtype(data), "same_shape": False}
        if c.root is not None:
            fields["dst"] = c.root
        st = verify.stamp(self.op, c.group, fields)
        if st is not None:
            head = verify.call_header(self.op, st, **_words(head))
        headers = protocol.exchange(head, c.group, c.driver)
        if st is not None:
            verify.raise_if_mismatch(self.op, headers, st, c.group, c.driver)
        _raise_if_dtypes_differ(self.op, headers)
        shapes = _shapes(headers, data, c.group, c.driver)
        sizes = [h.nbytes for h in headers]
        if big and max(sizes) >= big:
            self._broadcasts(c, buf, sizes, shapes)
        else:
            self._explicit(c, buf, sizes, shapes)

    def _data(self, c: Call, payload: Tensor, width: int, ws: int) -> Optional[Tensor]:
        """Fill ``c`` for the data's collective: every rank's ``width`` bytes, by the plan's native op.

        Returns the receive buffer (``(ws * width)`` bytes as the carrier), or None where this rank
        receives nothing; an all_gather receives into it as one tensor where the driver has the flat
        form (no list of views for hwdist to make, nor for torch to copy out).
        """
        g = c.view
        carrier = byte_carrier(c.driver, self.op)
        native = c.driver.plan(self.op, carrier).native_op
        keep = c.root is None or g.rank == c.root
        c.native = native
        c.send = payload.view(carrier)
        n = width // itemsize(carrier)
        if not (keep or native == "all_gather"):
            c.recv = None
            return None
        flat = torch.empty(ws * n, dtype=carrier, device=payload.device)
        if native == "all_gather":  # one receive tensor (the engine falls back to the list)
            c.native, c.recv = "all_gather_flat", flat
        else:
            c.recv = list(flat.chunk(ws))
        return flat

    def _explicit(self, c: Call, buf: Tensor, sizes: list[int], shapes: list[torch.Size]) -> None:
        carrier = byte_carrier(c.driver, self.op)
        width = _round(max(sizes), itemsize(carrier))
        flat = self._data(c, _sized(_bytes_of(buf), width), width, len(sizes))
        c.state = ("explicit", sizes, shapes, flat)

    def _same_shape(self, c: Call, buf: Tensor) -> None:
        g = c.view
        keep = c.root is None or g.rank == c.root
        c.native = c.plan.native_op
        c.send = buf
        c.recv = [torch.empty_like(buf) for _ in range(g.size)] if keep or c.native == "all_gather" else None
        c.state = ("same", keep)

    def _broadcasts(self, c: Call, buf: Tensor, sizes: list[int], shapes: Sequence[torch.Size]) -> None:
        """One broadcast per rank of exactly its bytes into one flat buffer (gloo's fast large all_gather)."""
        g = c.view
        carrier = byte_carrier(c.driver, "broadcast")
        widths = [_round(n, _GRANULE) for n in sizes]  # every slot aligned for any dtype's view
        flat = torch.empty(sum(widths), dtype=torch.uint8, device=buf.device)
        slots = list(flat.split(widths))
        me = g.index(g.rank)
        mine = _bytes_of(buf)
        copy_bytes(slots[me][: mine.numel()], mine)
        ranks = g.ranks()
        for r, slot in enumerate(slots):
            root = r if ranks is None else ranks[r]
            issue(wire_call(c.group, "broadcast", send=slot.view(carrier), root=root))
        c.native = None  # already moved
        c.state = ("broadcasts", sizes, list(shapes), slots)

    # -- finish ----------------------------------------------------------------------------------
    def finish(self, c: Call) -> list[Tensor]:
        if c.state is None:
            return [c.data]
        route = c.state[0]
        if route == "same":
            if not c.state[1]:
                return []
            plan, data = c.plan, c.data
            if not plan.cast and c.cdev is None:
                return c.recv  # type: ignore[no-any-return]
            return [from_comm(o, plan, data.shape, data.device) for o in c.recv]
        if route == "broadcasts":
            _, sizes, shapes, slots = c.state
            return self._results(c, [s[:n] for s, n in zip(slots, sizes)], shapes)
        _, sizes, shapes, flat = c.state  # explicit
        if flat is None or not (c.root is None or c.view.rank == c.root):
            return []
        rows = flat.view(torch.uint8).view(len(sizes), -1)
        return self._results(c, [row[:n] for row, n in zip(rows, sizes)], shapes)

    def _results(self, c: Call, payloads: Sequence[Tensor], shapes: Sequence[torch.Size]) -> list[Tensor]:
        plan, data = c.plan, c.data
        if plan.passthrough and c.cdev is None:  # the common case: views of the received bytes
            dtype = plan.dtype
            return [p.view(dtype).view(s) if p.numel() else torch.empty(s, dtype=dtype, device=p.device)
                    for p, s in zip(payloads, shapes)]
        out = []
        for p, s in zip(payloads, shapes):
            n = comm_numel(s, plan)
            wire = p.view(plan.comm_dtype) if n else torch.empty(0, dtype=plan.comm_dtype, device=p.device)
            out.append(from_comm(wire[:n], plan, s, data.device))
        return out

    def serial(self, data: Optional[Tensor], extra: Any) -> list[Tensor]:
        assert data is not None
        return [data]
