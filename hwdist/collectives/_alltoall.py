"""all_to_all's transports, as engine strategies, with the piece sizes agreed by prediction.

On a backend with a native all_to_all, outside verification mode, a call is
torch's own: the list form when every piece has one size, else one flat
buffer each way with split sizes (each rank's outputs give what it receives,
as torch requires; one collective, nothing framed). The routes below serve a
backend without all_to_all (which must learn every rank's split table) and
verification mode.

``ALL_TO_ALL`` picks one route per call (``choose``), the same on every rank,
because it depends only on the group's size history for ``all_to_all``
([`_sizes.history`][hwdist.collectives._sizes.history]), which every rank moves
with the same verdicts:

* **predicted** (the history predicts a capacity for the largest piece, at most
  ``IN_BAND_MAX_BYTES``): every piece travels in a slot of the predicted capacity
  behind a [`Header`][hwdist.collectives._sizes.Header] (its size, the dtype, the
  sender's largest piece as ``span``, and the sender's share of a checksum of the
  whole split table as ``layout``): one ``all_to_all_single`` of equal slots (on a
  backend without all_to_all, one all_gather of every rank's slots). Every rank
  receives one header from every rank, so the verdict is the same everywhere:
  held (one collective); a piece over the capacity (the redo moves only the bytes
  past it, the same width everywhere: two collectives); different dtypes, or
  split tables that do not match (the checksum: rank ``j`` adds
  ``h(j, r, sent to r)`` and subtracts ``h(s, j, expected from s)``, so the sum over
  the ranks is 0 exactly when every send size is what its receiver expects, up to
  a 2**-61 chance) raise the same error on every rank, after one exchange of the
  table that names the ranks.
* **explicit** (no prediction: the first call, a backoff after misses, pieces
  over ``IN_BAND_MAX_BYTES``, or verification mode): one small all_gather of every
  rank's dtype and split table, checked on every rank, then the data exactly:
  torch's list form when every piece of every rank has one size, else one flat
  buffer each way with split sizes (``all_to_all_single``), or on a backend
  without all_to_all one all_gather of every rank's pieces (world-size times the
  traffic).

Mismatched piece sizes raise on every rank on a backend without all_to_all (a
ValueError naming the ranks) and in verification mode on any backend (the
mode's ``CollectiveMismatch``); on a native all_to_all they are the caller's
contract, as in torch. ``extra`` is
``(inputs, outputs)``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from . import _sizes, transport
from ..drivers.base import byte_carrier
from ..errors import CollectiveArgumentError, CollectiveMismatch, PlanError
from .engine import Call, Strategy, issue, when_checking, wire_call
from ._wire import (
    as_comm_flat,
    byte_view,
    comm_numel,
    copy_bytes,
    copy_source,
    dense_flat,
    itemsize,
    prepare,
    restore,
)

Tensor = torch.Tensor

_M = (1 << 61) - 1  # the checksum's modulus (a prime)
_MASK = (1 << 64) - 1
_OP = "all_to_all"


def _mix(x: int) -> int:
    # splitmix64's finaliser: every input bit reaches every output bit
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _h(src: int, dst: int, n: int) -> int:
    return _mix(_mix((src << 32) ^ dst) + n) % _M


def table_share(me: int, in_sizes: list[int], out_sizes: list[int]) -> int:
    """This rank's share of the split table's checksum (the shares of all ranks sum to 0 mod 2**61-1
    exactly when every rank sends every other rank what that rank expects, up to a 2**-61 chance).

    Args:
        me: this rank's index in the group.
        in_sizes: what it sends to each rank (elements).
        out_sizes: what it expects from each rank (elements).
    """
    total = 0
    for r, n in enumerate(in_sizes):
        total += _h(me, r, n)
    for s, n in enumerate(out_sizes):
        total -= _h(s, me, n)
    return total % _M


def _checking() -> bool:
    """Whether verification mode is on (its hook is set)."""
    seen: list[bool] = []
    when_checking(lambda: seen.append(True))
    return bool(seen)


def _piece_size_errors(table: list[list[int]], ws: int) -> list[str]:
    """Disagreements in a size table (row j: rank j's send sizes, then its receive sizes)."""
    return [
        f"rank {j} sends {table[j][r]} elements to rank {r}, which expects {table[r][ws + j]}"
        for j in range(ws)
        for r in range(ws)
        if table[j][r] != table[r][ws + j]
    ]


def _raise_piece_sizes(bad: list[str], checking: bool) -> None:
    if checking:
        raise CollectiveMismatch(
            "collective mismatch in 'all_to_all' across ranks (verification mode): piece sizes do not"
            " match: " + "; ".join(bad[:4])
        )
    raise CollectiveArgumentError("all_to_all: piece sizes do not match across ranks: " + "; ".join(bad[:4]))


def _sizes_of(c: Call) -> tuple[list[int], list[int]]:
    ins, outs = c.extra
    return [comm_numel(t.shape, c.plan) for t in ins], [comm_numel(t.shape, c.plan) for t in outs]


def _explicit_table(c: Call, in_sizes: list[int], out_sizes: list[int]) -> list[list[int]]:
    """Every rank's dtype and sizes (one small all_gather), checked: the same error on every rank."""
    ws = c.view.size
    code = _sizes.dtype_code(c.data.dtype)
    rows = transport.gather_ints([code] + in_sizes + out_sizes, c.group, c.driver)
    isz = itemsize(c.plan.comm_dtype)
    # what the history records: every rank's largest piece in bytes (the span of the predicted route)
    headers = [_sizes.Header(max(row[1 : ws + 1]) * isz, 0, row[0], -1) for row in rows]
    v = _sizes.verdict(_OP, headers, None)
    _sizes.history(c.group, _OP).record(v)
    v.raise_if_error()
    table = [row[1:] for row in rows]
    bad = _piece_size_errors(table, ws)
    if bad:
        _raise_piece_sizes(bad, _checking())
    return table


class AllToAll(Strategy):
    """all_to_all: picks one of the routes below for each call (the same on every rank)."""

    op = _OP

    def choose(self, c: Call) -> Strategy:
        in_sizes, out_sizes = _sizes_of(c)
        native = c.plan.native_op == "all_to_all"
        if c.view.size == 1:  # nothing to agree on
            c.state = (in_sizes, out_sizes)
            return EQUAL if native and in_sizes == out_sizes else SPLIT if native else EMULATED_ONE
        checking = _checking()
        if native and not checking:
            # torch's contract: every rank's output tensors give the sizes it receives, so a backend with
            # an all_to_all needs no agreement (one collective, nothing framed, the data never staged on
            # the host); verification mode checks the split tables first
            c.state = (in_sizes, out_sizes)
            return EQUAL if len(set(in_sizes + out_sizes)) == 1 else SPLIT
        cap = None
        if not checking:  # verification mode: always the explicit table, with the mode's error
            cap = _sizes.history(c.group, _OP).predict(_sizes.IN_BAND_MAX_BYTES)
        if cap is not None:
            c.state = (in_sizes, out_sizes, cap)
            return PREDICTED
        table = _explicit_table(c, in_sizes, out_sizes)
        if not native:
            c.state = table
            return EMULATED
        c.state = (in_sizes, out_sizes)
        first = table[0][0]
        return EQUAL if all(n == first for row in table for n in row) else SPLIT

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        ins, outs = extra
        with torch.no_grad():
            outs[0].copy_(ins[0].reshape(outs[0].shape))


class _Equal(Strategy):
    """Every piece of every rank has one size: torch's list form."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        ins, outs = c.extra
        # flat (views where the tensors are contiguous): torch's list form wants one shape, and pieces
        # of one size may differ in shape ((1,) and (1, 1), or 0-d)
        c.send = [dense_flat(prepare(t, c.plan, c.cdev)[0]) for t in ins]
        prepared = [prepare(t, c.plan, c.cdev) for t in outs]
        c.recv = [dense_flat(b) for b, _ in prepared]
        c.state = [aliased for _, aliased in prepared]
        c.native = "all_to_all"

    def finish(self, c: Call) -> None:
        for t, b, aliased in zip(c.extra[1], c.recv, c.state):
            if not aliased:
                restore(t, b, c.plan)


class _Split(Strategy):
    """Pieces of different sizes, known on every rank: one flat buffer each way with split sizes."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        ins, _ = c.extra
        in_sizes, out_sizes = c.state
        device = c.cdev if c.cdev is not None else ins[0].device
        c.send = torch.cat([as_comm_flat(t, c.plan, c.cdev) for t in ins])
        c.recv = torch.empty(sum(out_sizes), dtype=c.plan.comm_dtype, device=device)
        c.splits = (out_sizes, in_sizes)
        c.native = "all_to_all_single"

    def finish(self, c: Call) -> None:
        for t, piece in zip(c.extra[1], c.recv.split(c.splits[0])):
            restore(t, piece, c.plan)


class _Emulated(Strategy):
    """No all_to_all, the table known on every rank: all_gather every rank's pieces."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        ins, _ = c.extra
        g, plan = c.view, c.plan
        ws = g.size
        table = c.state if c.state is not None else [[comm_numel(t.shape, plan) for t in ins] * 2]
        width = max(sum(row[:ws]) for row in table)
        device = c.cdev if c.cdev is not None else ins[0].device
        mine = torch.empty(width, dtype=plan.comm_dtype, device=device)
        pos = 0
        for t in ins:
            k = comm_numel(t.shape, plan)
            mine[pos : pos + k].copy_(copy_source(t, plan, c.cdev))
            pos += k
        c.send = mine
        c.recv = [torch.empty_like(mine) for _ in range(ws)]
        c.state = (table, g.index(g.rank))
        c.native = "all_gather"

    def finish(self, c: Call) -> None:
        table, me = c.state
        for j, out in enumerate(c.extra[1]):
            off = sum(table[j][:me])
            restore(out, c.recv[j][off : off + table[j][me]], c.plan)


# ---------------------------------------------------------------------------
# the predicted route: framed slots of the predicted capacity
# ---------------------------------------------------------------------------
def _piece_bytes(t: Tensor, c: Call) -> Tensor:
    return byte_view(as_comm_flat(t, c.plan, c.cdev))


def _carrier(driver: Any, op: str) -> torch.dtype:
    # int64 where the driver moves it as it is: gloo's all_to_all_single of 128 KiB took 1.6 ms as uint8
    # and 0.09 ms as int64 here (slots are multiples of 64 bytes, so any carrier fits)
    try:
        if not driver.plan(op, torch.int64).cast:
            return torch.int64
    except PlanError:
        pass
    return byte_carrier(driver, op)


def _rows_call(c: Call, send: Tensor) -> tuple[str, Tensor, Any, Tensor]:
    """How row ``r`` of ``send`` (``(ws, width)`` uint8) reaches rank ``r``: ``(native, send, recv, rows)``.

    ``rows`` (``(ws, width)``) holds row ``j`` from rank ``j`` once ``native`` ran on ``send``/``recv``:
    one ``all_to_all_single`` of equal rows, or without all_to_all one all_gather of every rank's block.
    """
    ws, width = send.shape
    dev = c.driver.comm_device()
    native = c.plan.native_op == "all_to_all"
    carrier = _carrier(c.driver, "all_to_all" if native else "all_gather")
    flat = send.reshape(-1).to(dev).view(carrier)
    if native:
        recv = torch.empty(ws * width, dtype=torch.uint8, device=dev)
        return "all_to_all_single", flat, recv.view(carrier), recv.view(ws, width)
    blocks = torch.empty(ws, ws * width, dtype=torch.uint8, device=dev)  # every rank's whole block
    me = c.view.index(c.view.rank)
    return "all_gather", flat, list(blocks.view(carrier).unbind(0)), blocks.view(ws, ws, width)[:, me]


def _exchange(c: Call, send: Tensor) -> Tensor:
    """Row ``j`` from rank ``j`` (blocking; the redo of the bytes over the capacity)."""
    native, flat, recv, rows = _rows_call(c, send)
    call = wire_call(c.group, native, send=flat, recv=recv, driver=c.driver)
    call.splits = (None, None)
    issue(call)
    return rows


def _host_bytes(t: Tensor, c: Call) -> Optional[np.ndarray]:
    """``t``'s bytes as a numpy view when it travels as it is from host memory, else None."""
    plan = c.plan
    if c.cdev is not None or plan.cast or plan.view or t.device.type != "cpu" or not t.is_contiguous():
        return None
    try:
        return t.detach().numpy().reshape(-1).view(np.uint8)
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, ...)
        return None


class _Predicted(Strategy):
    """The history predicts the largest piece: slots of that capacity behind a header, one collective.

    The slots are filled and read through numpy where the pieces are host tensors numpy can view
    (each torch op on a small tensor costs microseconds; docs/benchmarks.md), else through torch.
    """

    op = _OP

    def to_wire(self, c: Call) -> None:
        ins, _ = c.extra
        in_sizes, out_sizes, cap = c.state
        ws = c.view.size
        hb = _sizes.HEADER_BYTES
        isz = itemsize(c.plan.comm_dtype)
        span = max(in_sizes) * isz
        code = _sizes.dtype_code(c.data.dtype)
        share = table_share(c.view.index(c.view.rank), in_sizes, out_sizes)
        slots = np.empty((ws, hb + cap), dtype=np.uint8)  # the padding past each piece is never read
        slots[:, :hb].view(np.int64)[:] = [
            _sizes.Header(n * isz, n, code, 1, share, span, (n,)).words() for n in in_sizes
        ]
        pieces: list[Any] = []
        for r, t in enumerate(ins):
            host = _host_bytes(t, c)
            if host is not None:
                n = min(host.size, cap)
                slots[r, hb : hb + n] = host[:n]
                pieces.append(host)
            else:
                p = _piece_bytes(t, c)
                n = min(p.numel(), cap)
                if n:
                    copy_bytes(torch.from_numpy(slots[r, hb : hb + n]), p.narrow(0, 0, n).cpu())
                pieces.append(p.cpu().numpy())
        c.native, c.send, c.recv, rows = _rows_call(c, torch.from_numpy(slots))
        c.splits = (None, None)
        c.state = (in_sizes, out_sizes, cap, pieces, rows)

    def finish(self, c: Call) -> None:
        in_sizes, out_sizes, cap, pieces, rows = c.state
        ws = c.view.size
        hb = _sizes.HEADER_BYTES
        got = rows.cpu().numpy()
        headers = [_sizes.Header.from_words(w) for w in got[:, :hb].view(np.int64).tolist()]
        v = _sizes.verdict(_OP, headers, cap)
        _sizes.history(c.group, _OP).record(v)
        v.raise_if_error()
        if sum(h.layout for h in headers) % _M:  # some send size is not what its receiver expects
            table = transport.gather_ints(in_sizes + out_sizes, c.group, c.driver)
            _raise_piece_sizes(_piece_size_errors(table, ws) or ["the split tables differ"], False)
        tails = None
        if v.over:  # every rank sends what was over the capacity (or nothing), the same width everywhere
            send = np.zeros((ws, v.tail_width), dtype=np.uint8)
            for r, p in enumerate(pieces):
                if p.size > cap:
                    send[r, : p.size - cap] = p[cap:]
            tails = _exchange(c, torch.from_numpy(send)).cpu().numpy()
        dtype = c.plan.comm_dtype
        for j, out in enumerate(c.extra[1]):
            n = headers[j].nbytes
            piece = got[j, hb : hb + min(n, cap)]
            if n > cap:
                assert tails is not None
                piece = np.concatenate([piece, tails[j, : n - cap]])
            restore(out, torch.from_numpy(piece).view(dtype), c.plan)


class _EmulatedOne(Strategy):
    """A one-rank group without all_to_all: the piece is this rank's own."""

    op = _OP

    def to_wire(self, c: Call) -> None:
        c.native = None

    def finish(self, c: Call) -> None:
        ins, outs = c.extra
        restore(outs[0], as_comm_flat(ins[0], c.plan, c.cdev), c.plan)


ALL_TO_ALL = AllToAll()
EQUAL = _Equal()
SPLIT = _Split()
EMULATED = _Emulated()
EMULATED_ONE = _EmulatedOne()
PREDICTED = _Predicted()
