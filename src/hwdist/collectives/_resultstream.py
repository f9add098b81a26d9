"""Results collection's chunks: a part serialized in chunks, and streamed to the root while it is serialized.

A large part (over what a slot could hold) is not serialized whole before it
moves: its owner serializes one chunk, sends it (without waiting for it to
arrive) and serializes the next while rank 0 deserializes the previous one, so
serializing and deserializing overlap instead of adding up. Each chunk travels
as an 8-byte length, then its bytes; a length of 0 ends the stream. A chunk
that cannot be serialized ends the stream with its failure (a negative status,
then the message), which rank 0 reports to every rank in its closing status
(``_objwire.closing_status``): every rank raises the same
``SerializationError`` naming the rank and the item, after every rank took part
in everything it started (nothing is left waiting).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import serialization as _ser
from ._objwire import Decoder, Link, describe
from ._records import SERIALIZE, LocalFailure
from .serialization import Frame, Serializer

__all__ = ["Chunks", "encode_chunks", "encode_rest", "send_stream", "recv_stream", "FIRST_CHUNK"]

FIRST_CHUNK = 64  #: items in the first chunk, which measures the size of an item


def _which_item(chunk: list[Any], start: int, serializer: Optional[Serializer], exc: BaseException) -> str:
    for j, item in enumerate(chunk):
        try:
            _ser.encode(item, serializer)
        except Exception as inner:
            return describe(inner, item, serializer, f"result item {start + j} (of its part)")
    return describe(exc, chunk, serializer, "its results")


class Chunks:
    """Serializes ``items`` a chunk at a time: ``FIRST_CHUNK`` items, then about ``target`` bytes each."""

    def __init__(self, items: list[Any], serializer: Optional[Serializer], target: int) -> None:
        self.items, self.serializer, self.target = items, serializer, target
        self.pos, self.step = 0, min(len(items), FIRST_CHUNK)
        self.started = False
        self.per_item = 1.0

    @property
    def done(self) -> bool:
        """Every item has been serialized."""
        return self.started and self.pos >= len(self.items)

    def estimate(self) -> int:
        """The whole part's size in bytes, from the chunks serialized so far."""
        return int(self.per_item * len(self.items)) + 64

    def next(self) -> Optional[Frame]:
        """The next chunk's frame, None after the last; raises a ``SERIALIZE`` ``LocalFailure``."""
        if not self.started and not self.items:
            self.started = True
            return _ser.encode([], self.serializer)
        if self.started and self.pos >= len(self.items):
            return None
        self.started = True
        chunk = self.items[self.pos : self.pos + self.step]
        try:
            frame = _ser.encode(chunk, self.serializer)
        except Exception as exc:
            raise LocalFailure(SERIALIZE, _which_item(chunk, self.pos, self.serializer, exc)) from exc
        self.pos += len(chunk)
        self.per_item = max(1.0, frame.nbytes / len(chunk))
        self.step = max(1, int(self.target // self.per_item))
        return frame


def encode_chunks(items: list[Any], serializer: Optional[Serializer], target: int) -> list[Frame]:
    """Serialize ``items`` as a few lists of about ``target`` bytes each (at least one frame)."""
    chunks = Chunks(items, serializer, target)
    first = chunks.next()
    assert first is not None
    return [first, *encode_rest(chunks, target)]


def encode_rest(chunks: Chunks, target: int) -> list[Frame]:
    """Every chunk ``chunks`` has not serialized yet, of about ``target`` bytes each."""
    chunks.target = target
    chunks.step = max(1, int(target // chunks.per_item))
    frames = []
    frame = chunks.next()
    while frame is not None:
        frames.append(frame)
        frame = chunks.next()
    return frames


def _word(n: int) -> np.ndarray:
    return np.array([n], dtype="<i8").view(np.uint8)


def send_stream(link: Link, first: Frame, chunks: Chunks, root: int, p2p: bool) -> None:
    """Send ``first`` and every further chunk of ``chunks`` to ``root``, serializing while they travel."""
    pending: list[Any] = []

    def put(data: np.ndarray) -> None:
        if p2p:
            pending.append(link.send_nowait(data, root))
        else:
            link.broadcast(data, data.size, link.rank)

    try:
        frame: Optional[Frame] = first
        try:
            while frame is not None:
                put(_word(frame.nbytes))
                put(frame.to_numpy())
                frame = chunks.next()
            put(_word(0))
        except LocalFailure as fail:
            text = str(fail).encode("utf-8", "replace")[:960] or b"?"
            put(_word(-fail.kind))
            put(_word(len(text)))
            put(np.frombuffer(text, dtype=np.uint8))
    finally:
        for work in pending:
            link.settle(work)


def recv_stream(
    link: Link, rank: int, decoder: Decoder, items: list[Any], root: int, p2p: bool
) -> Optional[tuple[int, str]]:
    """Receive group rank ``rank``'s stream (decoded into ``items`` on ``root``); its failure, if any."""
    keep = link.rank == root

    def get(n: int) -> np.ndarray:
        return link.recv(n, rank) if p2p else link.broadcast(None, n, rank)

    while True:
        n = int(get(8).view("<i8")[0])
        if n == 0:
            return None
        if n < 0:
            size = int(get(8).view("<i8")[0])
            return -n, bytes(get(size)).decode("utf-8", "replace")
        buf = get(n)
        if keep:
            items.extend(decoder(rank, buf) or [])
