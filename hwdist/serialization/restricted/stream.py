"""Reading one pickle, and no more, from a stream that cannot seek.

``pickle.Unpickler(f).load()`` reads ``f`` up to the object's STOP opcode and
leaves what follows for the next reader. The restricted interpreter works on
bytes in memory, so for a stream it cannot rewind (a pipe, a socket, a custom
``io.RawIOBase``) :func:`read_pickle` first collects exactly one pickle's bytes:
the standard library's ``pickletools.genops`` walks the opcodes and their
arguments, reading through a recorder (lengths the stream gives are read in
bounded pieces, a protocol 4/5 FRAME in one read). Nothing is built here; the
interpreter checks what was read.
"""

from __future__ import annotations

import pickletools
from typing import Any

__all__ = ["read_pickle"]

#: Reads of a length the stream gives are made in pieces of at most this size (bounded by real data).
_CHUNK = 1 << 20


class _Recorder:
    """The stream as ``genops`` reads it, plus the unread rest of the current FRAME; keeps what it read."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.frame = b""
        self.pos = 0
        self.got = bytearray()

    def _from_file(self, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = self.file.read(min(n, _CHUNK))
            if not chunk:  # end of the stream (or None: nothing there without blocking)
                break
            parts.append(bytes(chunk))
            n -= len(chunk)
        return b"".join(parts)

    def read(self, n: int) -> bytes:
        out = self.frame[self.pos : self.pos + n]
        self.pos += len(out)
        if len(out) < n:
            out += self._from_file(n - len(out))
        self.got += out
        return out

    def readline(self) -> bytes:
        end = self.frame.find(b"\n", self.pos)
        out = self.frame[self.pos : len(self.frame) if end < 0 else end + 1]
        self.pos += len(out)
        if not out.endswith(b"\n"):
            out += self._line_from_file()
        self.got += out
        return out

    def _line_from_file(self) -> bytes:
        readline = getattr(self.file, "readline", None)
        if readline is not None:  # io's readline never reads past the newline
            return bytes(readline())
        parts = []
        while True:
            b = self._from_file(1)
            parts.append(b)
            if not b or b == b"\n":
                return b"".join(parts)

    def start_frame(self, n: int) -> None:
        self.frame = self.frame[self.pos :] + self._from_file(n)
        self.pos = 0


def read_pickle(file: Any) -> bytes:
    """The bytes of the next pickle in ``file``, up to and including its STOP; what follows stays unread.

    A stream that ends early, or an opcode pickle does not know, ends the collection there: the
    interpreter then refuses the bytes (truncated, unknown opcode) with its own message.

    Raises:
        EOFError: the stream is at its end (nothing left to read), as ``pickle.Unpickler`` raises.
    """
    src = _Recorder(file)
    try:
        for op, arg, _ in pickletools.genops(src):
            if op.name == "FRAME":
                src.start_frame(arg)
    except ValueError:  # truncated, an unknown opcode or a malformed argument: the bytes read so far
        pass
    if not src.got:
        raise EOFError("Ran out of input")
    return bytes(src.got)
