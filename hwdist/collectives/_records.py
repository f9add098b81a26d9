"""The object collectives' record: one rank's status, sizes and (small) payload in 1 KiB.

A record is what every rank contributes to the first exchange of an object
collective (an all_gather of one record per rank; ``broadcast_object_list``
broadcasts ``src``'s alone). It carries the rank's status (did it serialize its
object, were its arguments valid), the payload size and, for payloads up to
[`INLINE_BYTES`][hwdist.collectives._records.INLINE_BYTES], the payload itself: status
and data in one collective. A failed rank's record carries its message instead,
so every rank raises the same error, of the right kind, naming the failed ranks
([`raise_failures`][hwdist.collectives._records.raise_failures]). Why records and not
the agreement primitive: docs/objects.md, "Every rank raises together".

Layout: eight little-endian int64 (magic, status, total, nchunks, root, opcode,
token, inline length), then the inline bytes, zero-padded.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..errors import (
    ArgumentAssertionError,
    CollectiveArgumentError,
    ObjectCollectiveError,
    SerializationError,
    WeightsOnlyRefused,
)
from .serialization import Frame

__all__ = [
    "OK",
    "SERIALIZE",
    "ARGUMENT",
    "ASSERTED",
    "REFUSED",
    "IO",
    "OTHER",
    "LocalFailure",
    "arg_error",
    "RECORD_BYTES",
    "INLINE_BYTES",
    "OPS",
    "OP_NAMES",
    "Record",
    "make_record",
    "failure_record",
    "payload_record",
    "RECORD_MAGIC",
    "parse_record",
    "parse_rows",
    "raise_failures",
]

#: Statuses: fine, could not serialize, invalid arguments, filesystem, anything else.
OK, SERIALIZE, ARGUMENT, IO, OTHER = 0, 1, 2, 3, 4
ASSERTED = 5  # an argument mmengine checks with assert: an ArgumentAssertionError on every rank
REFUSED = 6  # weights_only=True refused a rank's own object: a WeightsOnlyRefused on every rank
ERRORS: dict[int, type[ObjectCollectiveError]] = {
    REFUSED: WeightsOnlyRefused,
    SERIALIZE: SerializationError,
    ARGUMENT: CollectiveArgumentError,
    ASSERTED: ArgumentAssertionError,
    IO: ObjectCollectiveError,
    OTHER: ObjectCollectiveError,
}


class LocalFailure(Exception):
    """A failure on this rank, to be reported to every rank in the next record exchange.

    Attributes:
        kind: its status (``SERIALIZE``, ``ARGUMENT``, ``IO``, ``OTHER``).
    """

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def arg_error(message: str) -> LocalFailure:
    """An ``ARGUMENT`` failure."""
    return LocalFailure(ARGUMENT, message)


#: Bytes per rank in the record exchange (64-byte header + inline payload).
RECORD_BYTES = 1024
_HEAD = 8  # int64 fields: magic, status, total, nchunks, root, opcode, token, inline_len
#: The largest payload a record carries inline.
INLINE_BYTES = RECORD_BYTES - 8 * _HEAD
#: The first word of every record (a row that lacks it came from another collective).
RECORD_MAGIC = int.from_bytes(b"HWDREC01", "little")

#: The opcode of each collective that exchanges records (records of different calls never match).
OPS = {
    "all_gather_object": 1,
    "gather_object": 2,
    "broadcast_object_list": 3,
    "scatter_object_list": 4,
    "collect_results": 5,
    "collect_results(tmpdir)": 6,
    "create_tmpdir": 7,
}
OP_NAMES = {v: k for k, v in OPS.items()}


class Record:
    """One rank's entry of the record exchange."""

    __slots__ = ("rank", "framed", "status", "total", "nchunks", "root", "opcode", "token", "inline")

    def __init__(self, rank: int, head: Sequence[int], inline: Optional[np.ndarray]) -> None:
        self.rank = rank
        fields = [int(x) for x in head]
        #: False: the rank sent something else (it is in another collective, e.g. a size exchange)
        self.framed = fields[0] == RECORD_MAGIC
        self.status, self.total, self.nchunks, self.root, self.opcode, self.token = fields[1:7]
        self.inline = inline

    @property
    def message(self) -> str:
        """The failure text carried inline."""
        return bytes(self.inline).decode("utf-8", "replace") if self.inline is not None else ""


def make_record(
    opcode: int,
    *,
    status: int = OK,
    total: int = 0,
    nchunks: int = 0,
    root: int = -1,
    token: int = 0,
    inline: Optional[np.ndarray] = None,
    message: str = "",
) -> np.ndarray:
    """One record's bytes (uint8, ``RECORD_BYTES``); a failed status carries ``message`` inline."""
    rec = np.zeros(RECORD_BYTES, dtype=np.uint8)
    if status != OK:
        inline = np.frombuffer(message.encode("utf-8", "replace")[:INLINE_BYTES], dtype=np.uint8)
    n = 0 if inline is None else int(inline.size)
    head = np.array([RECORD_MAGIC, status, total, nchunks, root, opcode, token, n], dtype="<i8")
    rec[: 8 * _HEAD] = head.view(np.uint8)
    if inline is not None and n:
        rec[8 * _HEAD : 8 * _HEAD + n] = inline
    return rec


def failure_record(opcode: int, failure: LocalFailure, root: int = -1) -> np.ndarray:
    """The record reporting ``failure``."""
    return make_record(opcode, status=failure.kind, root=root, message=str(failure))


def payload_record(
    opcode: int, frame: Optional[Frame], root: int = -1, token: int = 0
) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The record for ``frame`` (inline when it fits) and the frame's bytes when they travel separately."""
    if frame is None:
        return make_record(opcode, root=root, token=token), None
    data = frame.to_numpy()
    if frame.nbytes <= INLINE_BYTES:
        return make_record(opcode, total=frame.nbytes, root=root, token=token, inline=data), None
    return make_record(opcode, total=frame.nbytes, root=root, token=token), data


def parse_record(rank: int, row: np.ndarray) -> Record:
    """Group rank ``rank``'s record from its bytes."""
    head = row[: 8 * _HEAD].copy().view("<i8")
    n = int(head[7])
    return Record(rank, head, row[8 * _HEAD : 8 * _HEAD + n] if n else None)


def parse_rows(rows: np.ndarray) -> list[Record]:
    """Every rank's record from the rows of a record all_gather (one row per group rank)."""
    heads = rows[:, : 8 * _HEAD].copy().view("<i8")
    records = []
    for r in range(rows.shape[0]):
        n = int(heads[r, 7])
        records.append(Record(r, heads[r], rows[r, 8 * _HEAD : 8 * _HEAD + n] if n else None))
    return records


def raise_failures(records: Sequence[Record], what: str, opcode: int, root: int) -> None:
    """Raise, the same on every rank, when a record failed or the records are of different calls.

    Raises:
        ObjectCollectiveError: of the failed record's kind, naming every failed rank and its message.
        CollectiveArgumentError: the ranks called different collectives or gave different roots.
    """
    if not all(rec.framed for rec in records):  # its fields are not a record's: name no status or opcode
        calls = ", ".join(
            f"rank {rec.rank}: {OP_NAMES.get(rec.opcode, rec.opcode) if rec.framed else 'another collective'}"
            for rec in records
        )
        raise CollectiveArgumentError(f"{what}: ranks called different object collectives ({calls})")
    failed = [rec for rec in records if rec.status != OK]
    if failed:
        detail = "; ".join(f"rank {rec.rank}: {rec.message}" for rec in failed)
        ranks = ", ".join(str(rec.rank) for rec in failed)
        cls = ERRORS.get(failed[0].status, ObjectCollectiveError)
        raise cls(f"{what} failed on rank(s) {ranks}: {detail}", {rec.rank: rec.message for rec in failed})
    ops = {rec.opcode for rec in records}
    if len(ops) > 1 or opcode not in ops:
        calls = ", ".join(f"rank {rec.rank}: {OP_NAMES.get(rec.opcode, rec.opcode)}" for rec in records)
        raise CollectiveArgumentError(f"{what}: ranks called different object collectives ({calls})")
    roots = {rec.root for rec in records}
    if len(roots) > 1:
        calls = ", ".join(f"rank {rec.rank}: {rec.root}" for rec in records)
        raise CollectiveArgumentError(f"{what}: ranks disagree on the source/destination rank ({calls})")
