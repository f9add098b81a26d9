"""The tensor gathers' strategy: ``all_gather`` / ``gather`` with sizes agreed by prediction.

Without ``same_shape=True`` every rank may hold another shape, so the ranks must
agree on the sizes. [`Gather`][hwdist.collectives._gather.Gather] does it with the
one size-agreement mechanism of [`_sizes`][hwdist.collectives._sizes]: every rank
predicts the call's capacity from the group's history for the op (the key is
the op, its root and ``async_op``: what every rank passes alike) and the call
takes one of four routes, the same on every rank:

- ``in_band`` (capacity up to ``IN_BAND_MAX_BYTES``): a header and the payload
  in one slot, one all_gather;
- ``beside`` (above it, up to the limit): the header's small all_gather issued
  async just before the data's own collective (the native op, the payload
  sent as it is when its size is the capacity);
- ``explicit`` (no prediction, backing off, ``async_op=True``, or above the
  limit): the headers first, then exactly the padded data (the native op);
- ``broadcasts`` (an all_gather of at least the driver's
  ``gather_by_broadcast_min_bytes`` per rank): after the explicit headers (or
  without any with ``same_shape=True``), one broadcast per rank of exactly its
  bytes into one flat buffer.

Every rank sees every header, so every rank reaches the same verdict: the data
is good, or the ranks over the capacity send the rest (one more collective), or
the dtypes differ and every rank raises the same error. The payload travels as
bytes (the driver's byte carrier), so a rank with another dtype never makes
the collective itself ill-formed. Measured costs: docs/benchmarks.md ("Tensor
gathers").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np
import torch

from .. import _state
from ..drivers.base import Driver, Plan, byte_carrier
from ..drivers.tuning import tuning
from . import _sizes, transport
from .engine import Call, Strategy, issue, wire_call
from ._sizes import HEADER_BYTES, Header, Verdict
from ._wire import byte_view, comm_numel, copy_bytes, from_comm, itemsize, prepare, retype

__all__ = ["Gather", "exchange_headers", "header_of", "gathered_numels"]

Tensor = torch.Tensor

_REAL_OF_COMPLEX = {
    d: r
    for d, r in (
        (getattr(torch, "complex32", None), torch.float16),
        (torch.complex64, torch.float32),
        (torch.complex128, torch.float64),
    )
    if d is not None
}


def header_of(data: Tensor, wire_bytes: int) -> Header:
    """``data``'s header: its dtype and shape, with the size it has on the wire (``wire_bytes``)."""
    return Header(wire_bytes, data.numel(), _sizes.dtype_code(data.dtype), data.dim(), 0, wire_bytes,
                  tuple(data.shape[: _sizes.HEADER_DIMS]))


def exchange_headers(head: Header, group: Any, driver: Driver) -> list[Header]:
    """Every rank's header, with nothing else (one small all_gather): the mechanism's explicit exchange."""
    rows = transport.gather_equal(_sizes.pack(head), group, driver)
    return [_sizes.unpack(row) for row in rows]


def gathered_numels(data: Tensor, group: Any, driver: Driver, fn: str) -> list[int]:
    """Every rank's ``data.numel()``; the same TypeError on every rank when the dtypes differ."""
    headers = exchange_headers(header_of(data, 0), group, driver)
    _raise_if_error(_sizes.verdict(fn, headers, None))
    return [h.numel for h in headers]


def _raise_if_error(v: Verdict) -> None:
    """The dtypes differ: the same TypeError, naming each rank's dtype, on every rank."""
    if v.outcome is _sizes.Outcome.ERROR:
        raise TypeError(v.reason)


def _shapes(v: Verdict, data: Tensor, group: Any, driver: Driver) -> list[torch.Size]:
    """Every rank's shape; a shape longer than the header costs one more small exchange (rare)."""
    if not v.long_shapes:
        return [h.shape for h in v.headers]  # type: ignore[misc]
    width = max(h.ndim for h in v.headers)
    rows = transport.gather_ints((list(data.shape) + [0] * width)[:width], group, driver)
    return [torch.Size(rows[r][: h.ndim]) for r, h in enumerate(v.headers)]


class _Site:
    """One (group, op, root, async) call site: its size history and what this rank reuses per call."""

    __slots__ = (
        "hist", "driver", "carrier", "dev", "slot", "words", "body", "send", "hsend", "framed", "last",
        "same",
    )  # fmt: skip

    def __init__(self, hist: _sizes.SizeHistory) -> None:
        self.hist = hist
        self.driver: Any = None
        self.carrier = torch.uint8
        self.dev = torch.device("cpu")
        self.slot: Optional[Tensor] = None  # the in-band send slot (sync calls only: free on return)
        self.words: Any = None  # its header words, as an int64 numpy view
        self.body: Any = None  # its payload bytes (uint8) and, when they fit, as int64 words
        self.send: Optional[Tensor] = None  # the slot as sent: on the comm device, as the byte carrier
        self.hsend: Any = None  # (steady tuple, packed header as sent) for the header beside the data
        self.framed: Optional[Header] = None  # the header whose words the slot holds
        self.last: Any = None  # (dtype, shape, wire bytes, header, strides) of the last call: reused
        self.same: Any = None  # (header, capacity, world, verdict): the verdict when every rank sent it

    def header(self, data: Tensor, nbytes: int) -> Header:
        """``header_of(data, nbytes)``, the same object while the dtype, shape and size repeat."""
        last = self.last
        if last is not None and last[2] == nbytes and last[0] == data.dtype and last[1] == data.shape:
            return last[3]  # type: ignore[no-any-return]
        head = header_of(data, nbytes)
        self.last = (data.dtype, data.shape, nbytes, head, _contiguous_strides(data.shape))
        return head

    def byte_carrier(self, driver: Driver) -> torch.dtype:
        """``byte_carrier(driver, 'all_gather')``, and ``self.dev`` its comm device, kept per driver."""
        if driver is not self.driver:
            self.carrier, self.dev = byte_carrier(driver, "all_gather"), driver.comm_device()
            self.driver, self.slot = driver, None  # a new carrier and comm device: a new slot
        return self.carrier

    def steady(self, head: Header, cap: int, ws: int, op: str) -> tuple[Any, ...]:
        """``(head, cap, ws, verdict, all ranks' header bytes, packed head)`` when all ranks send ``head``."""
        same = self.same
        if same is None or same[0] is not head or same[1] != cap or same[2] != ws:
            mine = _sizes.pack(head)
            verdict = _sizes.verdict(op, [head] * ws, cap)
            same = self.same = (head, cap, ws, verdict, mine.numpy().tobytes() * ws, mine)
        return same  # type: ignore[no-any-return]

    def head_send(self, head: Header, cap: int, ws: int, op: str) -> Tensor:
        """This rank's packed header on the comm device, as the byte carrier (kept while it repeats)."""
        same = self.steady(head, cap, ws, op)
        sent = self.hsend
        if sent is None or sent[0] is not same or sent[1].device != self.dev:
            packed = same[5] if same[5].device == self.dev else same[5].to(self.dev)
            sent = self.hsend = (same, packed.view(self.carrier))
        return sent[1]  # type: ignore[no-any-return]

    def all_mine(self, rows: np.ndarray, head: Header, cap: int, ws: int, op: str) -> Optional[Verdict]:
        """The verdict when every rank's header bytes are this rank's (the steady state), else None.

        ``rows``: the ``(world, >= HEADER_BYTES)`` received bytes, a numpy array.
        """
        same = self.steady(head, cap, ws, op)
        if rows[:, :HEADER_BYTES].tobytes() != same[4]:
            return None
        return same[3]  # type: ignore[no-any-return]

    def frame(self, buf: Tensor, nbytes: int, head: Header, cap: int) -> Tensor:
        """``_sizes.frame`` of ``buf``'s bytes into a slot reused from call to call; the slot as sent.

        The slot lives on the comm device: the payload is copied there once (no staging through
        the host on a GPU), and the header is written only when it changes (through numpy on the
        host, else as one small copy).
        """
        slot = self.slot
        if slot is None or slot.numel() != HEADER_BYTES + cap or slot.device != self.dev:
            slot = self.slot = torch.zeros(HEADER_BYTES + cap, dtype=torch.uint8, device=self.dev)
            self.words = slot[:HEADER_BYTES].numpy().view(np.int64) if slot.is_cpu else None
            body = slot[HEADER_BYTES:]
            self.body = (body, body.view(torch.int64))  # cap is a multiple of 64
            self.framed = None
            self.send = slot.view(self.carrier)
        if self.framed is not head:
            if self.words is not None:
                self.words[:] = head.words()
            else:
                slot[:HEADER_BYTES].copy_(torch.tensor(head.words(), dtype=torch.int64).view(torch.uint8))
            self.framed = head
        body, words = self.body
        aligned = not nbytes % 8 and not buf.storage_offset() * buf.element_size() % 8
        if nbytes == cap and aligned and buf.is_contiguous():
            words.copy_(retype(buf, torch.int64))  # the steady state: the payload fills the slot
        else:
            n = min(nbytes, cap)
            src = _bytes_of(buf)
            copy_bytes(body[:n], src[:n])
            if n < cap:
                body[n:].zero_()
        return self.send  # type: ignore[return-value]


def _site(group: Any, op: str, key: tuple[Any, ...]) -> _Site:
    table: dict[tuple[Any, ...], _Site] = _state.of(group).gathers
    site = table.get((op,) + key)
    if site is None:
        site = table[(op,) + key] = _Site(_sizes.history(group, op, key))
    return site


def _headers(rows: Tensor) -> list[Header]:
    """Every rank's header from the ``(world, >= HEADER_BYTES)`` uint8 rows (CPU), in one conversion."""
    words = rows[:, :HEADER_BYTES].numpy().view(np.int64).tolist()
    return [Header.from_words(w) for w in words]


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


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
        site = _site(c.group, "tensor." + self.op, (c.root, bool(async_op)))
        hist = site.hist
        limit = big or _sizes.PREDICT_MAX_BYTES
        cap = None if async_op else hist.predict(limit)
        head = site.header(data, nbytes)
        route = _sizes.route(cap)
        if route == "explicit":
            v = _sizes.verdict(self.op, exchange_headers(head, c.group, c.driver), None)
            hist.record(v)
            _raise_if_error(v)
            shapes = _shapes(v, data, c.group, c.driver)
            sizes = [h.nbytes for h in v.headers]
            if big and v.largest >= big:
                self._broadcasts(c, buf, sizes, shapes)
            else:
                self._explicit(c, buf, sizes, shapes)
            return
        assert cap is not None
        if route == "in_band":
            carrier = site.byte_carrier(c.driver)
            c.send = site.frame(buf, nbytes, head, cap)
            flat = torch.empty(ws * (HEADER_BYTES + cap), dtype=torch.uint8, device=site.dev)
            # one receive tensor (the engine falls back to the list form where the driver has no flat one)
            c.native, c.recv = "all_gather_flat", flat.view(carrier)
            c.state = ("in_band", site, cap, buf, flat, head, ws)
            return
        # beside: the header's small all_gather async, then the data's own collective
        hcarrier = site.byte_carrier(c.driver)
        hsend = site.head_send(head, cap, ws, self.op)
        hrecv = torch.empty(ws * HEADER_BYTES, dtype=torch.uint8, device=site.dev)
        hcall = wire_call(c.group, "all_gather_flat", send=hsend, recv=hrecv.view(hcarrier), driver=c.driver)
        hwork = issue(hcall, c.driver.supports_async)
        received = self._data(c, _sized(_bytes_of(buf), cap), cap, ws)
        c.state = ("beside", site, cap, buf, hrecv, (hwork, head, received), ws)

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
        widths = [_round(n, _sizes.GRANULE) for n in sizes]  # every slot aligned for any dtype's view
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
        if route == "explicit":
            _, sizes, shapes, flat = c.state
            if flat is None or not (c.root is None or c.view.rank == c.root):
                return []
            rows = flat.view(torch.uint8).view(len(sizes), -1)
            return self._results(c, [row[:n] for row, n in zip(rows, sizes)], shapes)
        return self._predicted(c)

    def _predicted(self, c: Call) -> list[Tensor]:
        route, site, cap, buf, got, extra, ws = c.state
        g, hist = c.view, site.hist
        if route == "in_band":
            # the headers are read on the host; the payloads stay where they arrived (the comm device)
            rows = got.view(ws, -1)
            host = rows.numpy() if got.is_cpu else rows[:, :HEADER_BYTES].cpu().numpy()
            same = site.all_mine(host, extra, cap, ws, self.op)
            if same is not None and same.held:  # the steady state: every rank sent this rank's header
                hist.record(same)
                if c.root is not None and g.rank != c.root:
                    return []
                plan = c.plan
                if plan.passthrough and c.cdev is None and extra.nbytes and extra.shape is not None:
                    # every rank's payload as one strided view of the received bytes
                    size = itemsize(plan.dtype)
                    step = (HEADER_BYTES + cap) // size
                    shape, strides = site.last[1], site.last[4]
                    return list(
                        got.view(plan.dtype)
                        .as_strided((ws, *shape), (step, *strides), HEADER_BYTES // size)
                        .unbind(0)
                    )
                body = got.view(ws, -1)[:, HEADER_BYTES : HEADER_BYTES + extra.nbytes]
                return self._results(c, list(body.unbind(0)), [c.data.shape] * ws)
            headers = _headers(torch.from_numpy(host))
            end = [HEADER_BYTES + min(h.nbytes, cap) for h in headers]
            payloads = [row[HEADER_BYTES:e] for row, e in zip(rows, end)]
        else:
            hwork, extra_head, flat = extra
            if hwork is not None:
                hwork.wait()  # the header's all_gather
            hrows = (got if got.is_cpu else got.cpu()).numpy().reshape(ws, HEADER_BYTES)
            same = site.all_mine(hrows, extra_head, cap, ws, self.op)
            if same is not None and same.held:  # the steady state: every rank sent this rank's header
                hist.record(same)
                if flat is None or (c.root is not None and g.rank != c.root):
                    return []
                data = c.data
                if c.plan.passthrough and c.cdev is None and extra_head.nbytes == cap and data.numel():
                    return list(flat.view(data.dtype).view(ws, *data.shape).unbind(0))  # one view, unbound
                rows = flat.view(torch.uint8).view(ws, -1)
                return self._results(c, list(rows[:, : extra_head.nbytes].unbind(0)), [data.shape] * ws)
            headers = _headers(torch.from_numpy(hrows))
            payloads = []
            if flat is not None:
                rows = flat.view(torch.uint8).view(ws, -1)
                payloads = [row[: min(h.nbytes, cap)] for row, h in zip(rows, headers)]
        v = _sizes.verdict(self.op, headers, cap)
        hist.record(v)
        _raise_if_error(v)
        keep = c.root is None or g.rank == c.root
        if v.over:  # every rank sends what was over the capacity (or nothing), the same width everywhere
            tail = _bytes_of(buf)[cap:]
            tails = transport.gather_equal(_sized(tail.cpu(), v.tail_width), c.group, c.driver)
            if keep:  # the tails arrive on the host: each whole payload goes back to the comm device
                payloads = [
                    torch.cat([p.cpu(), tails[r][: h.nbytes - cap]]).to(p.device) if r in v.over else p
                    for r, (p, h) in enumerate(zip(payloads, headers))
                ]
        shapes = _shapes(v, c.data, c.group, c.driver)
        if not keep:
            return []
        return self._results(c, payloads, shapes)

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
