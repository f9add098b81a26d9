"""The object collectives' slots: status, size and payload in one collective, sizes agreed by prediction.

Every object collective that exchanges sizes (``all_gather_object``,
``gather_object``, ``broadcast_object_list``, ``collect_results`` over
communication) is a user of the size-agreement mechanism of
[`_sizes`][hwdist.collectives._sizes]. Each rank sends one *slot*:
a [`Header`][hwdist.collectives._sizes.Header] (the payload's true size; its
``layout`` word carries the collective's opcode, this rank's status, the
root it was told, a token and a chunk count) followed by the first
``capacity`` bytes of its payload (``frame``). The capacity is the group's
[`SizeHistory`][hwdist.collectives._sizes.SizeHistory] prediction, the same on
every rank, so in the steady state an object collective is one collective:
status, size and data together. Every rank sees every header
([`verdict`][hwdist.collectives._sizes.verdict]) and knows which ranks were
over the capacity; only those move their payload again (the caller's route:
the bytes past the capacity by a padded all_gather, whole payloads by a
broadcast per rank above ``PADDED_ALL_GATHER_LIMIT``, point to point to a
gather root).

Without a prediction (the first call, a history backing off after misses, a
predicted size above the limit) the slot has
[`DEFAULT_CAPACITY`][hwdist.collectives._objslots.DEFAULT_CAPACITY] bytes: the
1 KiB record it replaces, so a small object still travels in one collective.

A failed rank (it could not serialize, or got a bad argument) sends its
status and its message as the payload; every rank raises the same error
after the one exchange (a message longer than the slot costs one more
exchange of the part past the capacity, on the error path only). The
all_gather-based collectives (``all_gather_object``, ``gather_object``,
``collect_results``) share one history per group, so their slots have the
same size on every rank even when ranks call different collectives: the
opcodes in the headers then make every rank raise
``CollectiveArgumentError``. A failed call does not move the history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from . import _sizes
from ._objwire import Link
from ._records import INLINE_BYTES, OK, RECORD_MAGIC, LocalFailure, Record, raise_failures
from .serialization import Frame

__all__ = [
    "DEFAULT_CAPACITY",
    "FAMILY",
    "Exchange",
    "gather_slots",
    "broadcast_slot",
    "complete_broadcast",
    "gather_tails",
    "message_bytes",
    "predicted",
]

#: Slot capacity of a call without a prediction: header + 896 bytes = 1 KiB, the old record's size.
DEFAULT_CAPACITY = 1024 - _sizes.HEADER_BYTES
#: The history shared by the all_gather-based object collectives (see the module docstring).
FAMILY = "object collectives"
#: Above this many bytes in all (capacity x world), no prediction: the default slot and the payloads
#: moved by the caller's large route (one broadcast per rank, or point to point).
PREDICT_TOTAL_BYTES = 1 << 20
_EMPTY = np.zeros(0, dtype=np.uint8)


def _header(nbytes: int, opcode: int, status: int, root: int, token: int, nchunks: int) -> _sizes.Header:
    # layout word: opcode 8 bits | status 8 | token 8 | root+1 (any group size); a bytes payload has no
    # element count, so ``numel`` carries the chunk count (collect_results)
    layout = (opcode & 0xFF) | (status & 0xFF) << 8 | (token & 0xFF) << 16 | (root + 1) << 24
    return _sizes.Header(nbytes, nchunks, 0, -1, layout, nbytes, ())


def _record(rank: int, h: _sizes.Header, data: Optional[np.ndarray]) -> Record:
    w = h.layout
    opcode, status, token, root = w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF, (w >> 24) - 1
    return Record(rank, (RECORD_MAGIC, status, h.nbytes, h.numel, root, opcode, token), data)


def message_bytes(failure: LocalFailure) -> np.ndarray:
    """The failure's text as it travels (utf-8, at most ``INLINE_BYTES``, as the old record's)."""
    return np.frombuffer(bytearray(str(failure).encode("utf-8", "replace")[:INLINE_BYTES]), dtype=np.uint8)


def predicted(hist: _sizes.SizeHistory, limit: int) -> tuple[Optional[int], int]:
    """``(the capacity predicted or None, the capacity this call uses)``.

    A serialized object's size moves in 64-byte steps (frame alignment) and with its content, so
    the history's capacity gets a quarter more headroom (within ``limit``): still under 2x the
    expected size (1.125 x 1.25, rounded up to 64 bytes).
    """
    cap = hist.predict(limit)
    if cap is None:
        return None, DEFAULT_CAPACITY
    roomy = _sizes.capacity_for(cap + cap // 4)
    cap = roomy if roomy <= limit else cap
    return cap, cap


def _slot(payload: np.ndarray, header: _sizes.Header, capacity: int) -> np.ndarray:
    """``_sizes.frame`` through numpy (a few torch ops on a small tensor cost more than the bytes)."""
    hb = _sizes.HEADER_BYTES
    slot = np.empty(hb + capacity, dtype=np.uint8)
    slot[:hb].view(np.int64)[:] = header.words()
    n = min(payload.size, capacity)
    slot[hb : hb + n] = payload[:n]
    slot[hb + n :] = 0
    return slot


@dataclass
class Exchange:
    """One call's slots as every rank saw them.

    Attributes:
        records: every rank's status, size, root, ... (``inline``: its whole payload when it fitted the slot,
            else None: the caller moves it).
        heads: every rank's part of its payload that travelled in the slot.
        capacity: the slot capacity this call used.
        verdict: the size verdict (``over``: the ranks whose payload did not fit).
    """

    records: list[Record]
    heads: list[np.ndarray]
    capacity: int
    verdict: _sizes.Verdict

    @property
    def over(self) -> tuple[int, ...]:
        """The ranks whose payload did not fit the slot."""
        return self.verdict.over


def _joined(frames: Sequence[Frame], n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint8)
    pos = 0
    for f in frames:
        f.write_into(out[pos : pos + f.nbytes])
        pos += f.nbytes
    return out


def _parse(rows: np.ndarray) -> tuple[list[_sizes.Header], list[np.ndarray]]:
    """``_sizes.unframe`` through numpy: every rank's header and payload view (at most the capacity)."""
    hb = _sizes.HEADER_BYTES
    words = np.ascontiguousarray(rows[:, :hb]).view(np.int64).tolist()
    headers = [_sizes.Header.from_words(w) for w in words]
    cap = rows.shape[1] - hb
    return headers, [row[hb : hb + min(h.nbytes, cap)] for row, h in zip(rows, headers)]


def _fill_messages(link: Link, ex: Exchange, own: np.ndarray) -> None:
    """Error path: every failed rank's whole message, one more all_gather if one did not fit."""
    failed = [r for r in ex.records if r.status != OK]
    long = [r for r in failed if r.total > ex.capacity]
    if long:
        width = -(-(max(r.total for r in long) - ex.capacity) // 64) * 64
        mine = np.zeros(width, dtype=np.uint8)
        if ex.records[link.rank].status != OK and own.size > ex.capacity:
            tail = own[ex.capacity :]
            mine[: tail.size] = tail
        rows = link.all_gather(mine)
        for r in long:
            r.inline = np.concatenate([ex.heads[r.rank], rows[r.rank, : r.total - ex.capacity]])


def gather_slots(
    link: Link,
    what: str,
    opcode: int,
    payload: Union[np.ndarray, Sequence[Frame], None],
    failure: Optional[LocalFailure] = None,
    *,
    root: int = -1,
    token: int = 0,
    nchunks: int = 0,
) -> Exchange:
    """Every rank's slot, one all_gather at the family's predicted capacity; raises together on a failure.

    Args:
        link: the call's group.
        what: the public op's name (starts every message).
        opcode: the collective's opcode (``_records.OPS``).
        payload: this rank's bytes, or its frames (sent in band, one after the other, when they fit the
            slot; else the slot carries none of them and the caller moves them); None: nothing to send.
        failure: this rank's failure (its message travels instead of the payload).
        root: the root this rank was told (group rank; -1: none).
        token: a small flag word (``CONFIRM``).
        nchunks: the chunk count (``collect_results``).

    Returns:
        An [`Exchange`][hwdist.collectives._objslots.Exchange].

    Raises:
        ObjectCollectiveError: of the failed rank's kind, on every rank, naming every failed rank.
        CollectiveArgumentError: the ranks called different collectives or gave different roots.
    """
    hist = _sizes.history(link.group, FAMILY)
    cap, used = predicted(hist, PREDICT_TOTAL_BYTES // link.world)
    status = OK
    if failure is not None:
        data, status = message_bytes(failure), failure.kind
        n = int(data.size)
    elif payload is None or isinstance(payload, np.ndarray):
        data = payload if payload is not None else _EMPTY
        n = int(data.size)
    else:  # frames: joined in the slot when they fit it
        n = sum(f.nbytes for f in payload)
        data = _joined(payload, n) if n <= used else _EMPTY
    header = _header(n, opcode, status, root, token, nchunks)
    rows = link.all_gather(_slot(data, header, used))
    headers, heads = _parse(rows)
    records = [_record(r, h, heads[r] if h.nbytes <= used else None) for r, h in enumerate(headers)]
    v = _sizes.verdict(what, headers, used)
    ex = Exchange(records, heads, used, v)
    if any(r.status != OK for r in records):  # nothing moved the history: it stays the same on every rank
        _fill_messages(link, ex, data)
        raise_failures(records, what, opcode, root)
    hist.record(v if cap is not None else _sizes.verdict(what, headers, None))
    raise_failures(records, what, opcode, root)  # different collectives or roots
    return ex


def broadcast_slot(
    link: Link,
    what: str,
    opcode: int,
    root: int,
    payload: Optional[np.ndarray],
    failure: Optional[LocalFailure] = None,
    *,
    limit: int = PREDICT_TOTAL_BYTES,
) -> tuple[Record, np.ndarray]:
    """Group rank ``root``'s slot on every rank (one broadcast at the predicted capacity).

    ``payload`` and ``failure`` matter on ``root`` only. Returns ``root``'s record (with its message
    filled in on failure; the caller raises) and the part of its payload that came in the slot.
    Over the capacity, ``root`` and the others complete the payload with
    [`complete_broadcast`][hwdist.collectives._objslots.complete_broadcast].
    """
    hist = _sizes.history(link.group, what)
    cap, used = predicted(hist, limit)
    width = _sizes.HEADER_BYTES + used
    if link.rank == root:
        status = OK
        if failure is not None:
            data, status = message_bytes(failure), failure.kind
        else:
            data = payload if payload is not None else _EMPTY
        header = _header(int(data.size), opcode, status, root, 0, 0)
        row = _slot(data, header, used)
        link.broadcast(row, width, root)
    else:
        row = link.broadcast(None, width, root)
        data = _EMPTY
    headers, heads = _parse(row.reshape(1, width))
    rec = _record(root, headers[0], heads[0] if headers[0].nbytes <= used else None)
    if rec.status != OK:
        if rec.inline is None:  # a long message: the rest of it, exactly
            tail = link.broadcast(data[used:] if link.rank == root else None, rec.total - used, root)
            rec.inline = np.concatenate([heads[0], tail])
        return rec, heads[0]
    hist.record(_sizes.verdict(what, headers, used if cap is not None else None))
    return rec, heads[0]


def complete_broadcast(
    link: Link, rec: Record, head: np.ndarray, own: Optional[np.ndarray], root: int
) -> np.ndarray:
    """``root``'s whole payload after [`broadcast_slot`][hwdist.collectives._objslots.broadcast_slot].

    In the slot already: no collective. Else one broadcast: of the bytes past the capacity
    (joined to the slot's part) up to ``PREDICT_TOTAL_BYTES``, of the whole payload above it
    (no copy of a large payload).
    """
    if rec.inline is not None:
        return rec.inline
    n = rec.total
    if n > PREDICT_TOTAL_BYTES:
        return link.broadcast(own if link.rank == root else None, n, root)
    k = head.size
    tail = link.broadcast(own[k:] if link.rank == root and own is not None else None, n - k, root)
    if link.rank == root and own is not None:
        return own
    return np.concatenate([head, tail])


def gather_tails(link: Link, ex: Exchange, own: Optional[np.ndarray]) -> list[Optional[np.ndarray]]:
    """Every over rank's whole payload by one all_gather of the bytes past the capacity (None elsewhere)."""
    cap = ex.capacity
    width = ex.verdict.tail_width
    mine = np.zeros(max(width, 64), dtype=np.uint8)
    if link.rank in ex.over and own is not None:
        tail = own[cap:]
        mine[: tail.size] = tail
    rows = link.all_gather(mine)
    out: list[Optional[np.ndarray]] = [None] * link.world
    for r in ex.over:
        out[r] = np.concatenate([ex.heads[r], rows[r, : ex.records[r].total - cap]])
    return out
