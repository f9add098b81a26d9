"""all_to_all's three transports, as engine strategies.

``ALL_TO_ALL`` picks one per call (``choose``):

* **equal pieces** on a backend with all_to_all: torch's list form, no copy where none is needed;
* **pieces of different sizes** on such a backend: one flat buffer each way with split sizes
  (``all_to_all_single``);
* **emulated** (the backend has no all_to_all, the plan says so): one exchange of the piece sizes,
  then one all_gather of every rank's pieces (world-size times the traffic). Size mismatches raise
  on every rank.

In verification mode the native transports exchange the piece sizes too, so a
mismatch raises on every rank there as well. ``extra`` is ``(inputs, outputs)``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import _transport
from ..errors import CollectiveMismatch
from ._engine import Call, Strategy, when_checking
from ._wire import as_comm_flat, comm_numel, copy_source, prepare, restore

Tensor = torch.Tensor


def _piece_size_errors(table: list[list[int]], ws: int) -> list[str]:
    """Disagreements in a size table (row j: rank j's send sizes, then its receive sizes)."""
    return [
        f"rank {j} sends {table[j][r]} elements to rank {r}, which expects {table[r][ws + j]}"
        for j in range(ws)
        for r in range(ws)
        if table[j][r] != table[r][ws + j]
    ]


def _check_piece_sizes(c: Call, in_sizes: list[int], out_sizes: list[int]) -> None:
    """Verification mode: every rank's send sizes match what their receivers expect (one gather)."""
    ws = c.view.size
    bad = _piece_size_errors(_transport.gather_ints(in_sizes + out_sizes, c.group, c.driver), ws)
    if bad:
        raise CollectiveMismatch(
            "collective mismatch in 'all_to_all' across ranks (verification mode): piece sizes do not"
            " match: " + "; ".join(bad[:4])
        )


def _sizes(c: Call) -> tuple[list[int], list[int]]:
    ins, outs = c.extra
    return [comm_numel(t.shape, c.plan) for t in ins], [comm_numel(t.shape, c.plan) for t in outs]


class AllToAll(Strategy):
    """all_to_all: picks one of the transports below for each call."""

    op = "all_to_all"

    def choose(self, c: Call) -> Strategy:
        if c.plan.native_op != "all_to_all":
            return EMULATED
        in_sizes, out_sizes = _sizes(c)
        c.state = (in_sizes, out_sizes)
        # the emulated transport always checks the sizes; the native ones in verification mode
        when_checking(lambda: _check_piece_sizes(c, in_sizes, out_sizes))
        return EQUAL if len(set(in_sizes + out_sizes)) == 1 else SPLIT

    def serial(self, data: Optional[Tensor], extra: Any) -> None:
        ins, outs = extra
        with torch.no_grad():
            outs[0].copy_(ins[0].reshape(outs[0].shape))


class _Equal(Strategy):
    """Equal pieces: torch's list form."""

    op = "all_to_all"

    def to_wire(self, c: Call) -> None:
        ins, outs = c.extra
        c.send = [prepare(t, c.plan, c.cdev)[0] for t in ins]
        prepared = [prepare(t, c.plan, c.cdev) for t in outs]
        c.recv = [b for b, _ in prepared]
        c.state = [aliased for _, aliased in prepared]
        c.native = "all_to_all"

    def finish(self, c: Call) -> None:
        for t, b, aliased in zip(c.extra[1], c.recv, c.state):
            if not aliased:
                restore(t, b, c.plan)


class _Split(Strategy):
    """Pieces of different sizes: one flat buffer each way with split sizes."""

    op = "all_to_all"

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
    """No all_to_all: exchange the piece sizes, then all_gather every rank's pieces."""

    op = "all_to_all"

    def to_wire(self, c: Call) -> None:
        ins, outs = c.extra
        g, plan = c.view, c.plan
        ws = g.size
        in_sizes, out_sizes = _sizes(c)
        table = _transport.gather_ints(in_sizes + out_sizes, c.group, c.driver)
        bad = _piece_size_errors(table, ws)
        if bad:
            raise ValueError("all_to_all: piece sizes do not match across ranks: " + "; ".join(bad[:4]))
        width = max(sum(row[:ws]) for row in table)
        device = c.cdev if c.cdev is not None else ins[0].device
        mine = torch.empty(width, dtype=plan.comm_dtype, device=device)
        pos = 0
        for t, k in zip(ins, in_sizes):
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


ALL_TO_ALL = AllToAll()
EQUAL = _Equal()
SPLIT = _Split()
EMULATED = _Emulated()
