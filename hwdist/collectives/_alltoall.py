"""all_to_all's transports, as engine strategies.

On a backend with an all_to_all and verification off, a call is one torch call
with no agreement (each rank's outputs give what it receives, as torch
requires): torch's list form when every piece has one size and the backend has
that form, else one flat buffer each way with split sizes
(``all_to_all_single``; a backend that has only the flat form declares
``'all_to_all'`` in its ``flat_ops`` and not in its ``native_ops``).

With verification on (the default), and on a backend without all_to_all, the
call first runs the one header round ([`protocol`][hwdist.collectives.protocol]):
every rank's dtype and split table (inline), and the verified call's
fingerprint, checked on every rank; then the data: the same torch call as
above, or without all_to_all one all_gather of every rank's pieces
(world-size times the traffic).

Mismatched piece sizes raise on every rank when the header round runs: the
verification's ``CollectiveMismatch``, or a ``CollectiveArgumentError`` naming
the ranks (a backend without all_to_all, verification off); otherwise they are
the caller's contract, as in torch. ``extra`` is ``(inputs, outputs)``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from . import protocol, transport, verify
from ..errors import CollectiveArgumentError, CollectiveMismatch
from .engine import Call, Strategy
from ._wire import as_comm_flat, comm_numel, copy_source, dense_flat, prepare, restore

Tensor = torch.Tensor

_OP = "all_to_all"


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
            "collective mismatch in 'all_to_all' across ranks (verification): piece sizes do not"
            " match: " + "; ".join(bad[:4])
        )
    raise CollectiveArgumentError("all_to_all: piece sizes do not match across ranks: " + "; ".join(bad[:4]))


def _sizes_of(c: Call) -> tuple[list[int], list[int]]:
    ins, outs = c.extra
    return [comm_numel(t.shape, c.plan) for t in ins], [comm_numel(t.shape, c.plan) for t in outs]


def _table(c: Call, in_sizes: list[int], out_sizes: list[int], st: Optional[verify.Stamp]) -> list[list[int]]:
    """Every rank's split table from one header round (verified when ``st``), checked: the same error on
    every rank (a table too long for the inline bytes, over 52 ranks, costs one more small exchange)."""
    ws = c.view.size
    sizes = np.array(in_sizes + out_sizes, dtype="<i8").view(np.uint8)
    fits = sizes.size <= protocol.INLINE_BYTES
    head = protocol.Header(op=protocol.op_code(_OP), dtype=protocol.dtype_code(c.data.dtype))
    if st is not None:
        head.seq, head.fingerprint, head.site = st.seq, st.fingerprint, st.site
    head.inline = sizes if fits else None
    headers = protocol.exchange(head, c.group, c.driver)
    if st is not None:
        verify.raise_if_mismatch(_OP, headers, st, c.group, c.driver)
    if len({h.dtype for h in headers}) > 1:
        raise CollectiveArgumentError(
            "all_to_all: every rank must pass the same dtype; got "
            + ", ".join(f"rank {h.rank}: {protocol.dtype_name(h.dtype)}" for h in headers)
        )
    if fits:
        table = [h.inline.copy().view("<i8").tolist() for h in headers]
    else:
        table = transport.gather_ints(in_sizes + out_sizes, c.group, c.driver)
    bad = _piece_size_errors(table, ws)
    if bad:
        _raise_piece_sizes(bad, st is not None)
    return table


class AllToAll(Strategy):
    """all_to_all: picks one of the routes below for each call (the same on every rank)."""

    op = _OP

    def choose(self, c: Call) -> Strategy:
        in_sizes, out_sizes = _sizes_of(c)
        listed = c.plan.native_op == "all_to_all"  # torch's list form
        flat = listed or "all_to_all" in c.driver.caps.flat_ops  # all_to_all_single
        ins, outs = c.extra
        st = verify.stamp(_OP, c.group, verify.TensorFields.all_to_all(outs, ins, check=True)[2])
        if c.view.size == 1:  # nothing to agree on
            c.state = (in_sizes, out_sizes)
            return EQUAL if listed and in_sizes == out_sizes else SPLIT if flat else EMULATED_ONE
        if flat and st is None:
            # torch's contract: every rank's output tensors give the sizes it receives, so a backend with
            # an all_to_all needs no agreement (one collective, the data never staged on the host);
            # verification checks the split tables first, in its header round
            table = [in_sizes + out_sizes]
        else:
            table = _table(c, in_sizes, out_sizes, st)
            if not flat:
                c.state = table
                return EMULATED
        c.state = (in_sizes, out_sizes)
        first = table[0][0]
        return EQUAL if listed and all(n == first for row in table for n in row) else SPLIT

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
