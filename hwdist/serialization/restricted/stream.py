"""Reading one pickle, and no more, from a stream that cannot seek.

``pickle.Unpickler(f).load()`` reads ``f`` up to the object's STOP opcode and
leaves what follows for the next reader. The restricted interpreter works on
bytes in memory, so for a stream it cannot rewind (a pipe, a socket, a custom
``io.RawIOBase``) :func:`read_pickle` first collects exactly one pickle's bytes:
it reads each opcode and its argument as pickle does (the argument sizes come
from the standard library's ``pickletools`` table), and a protocol 4/5 FRAME in
one read. Nothing is interpreted here; the interpreter checks what was read.
"""

from __future__ import annotations

import pickletools
from typing import Any

__all__ = ["read_pickle"]

#: Reads of a length the stream gives are made in pieces of at most this size (bounded by real data).
_CHUNK = 1 << 20
_STOP, _FRAME = ord("."), 0x95
#: Width of the little-endian size prefix of each argument that carries its own length.
_PREFIX = {
    pickletools.TAKEN_FROM_ARGUMENT1: 1,
    pickletools.TAKEN_FROM_ARGUMENT4: 4,  # signed (string4, long4): a negative size is corrupt
    pickletools.TAKEN_FROM_ARGUMENT4U: 4,
    pickletools.TAKEN_FROM_ARGUMENT8U: 8,
}
#: opcode -> how its argument is read: an int n (n bytes; 0: none), "line", "2 lines" (GLOBAL,
#: INST), or ("sized", prefix width, signed).
_ARGS: dict[int, Any] = {}
for _op in pickletools.opcodes:
    _arg = _op.arg
    if _arg is None:
        _ARGS[ord(_op.code)] = 0
    elif _arg.n == pickletools.UP_TO_NEWLINE:
        _ARGS[ord(_op.code)] = "2 lines" if _arg.name == "stringnl_noescape_pair" else "line"
    elif _arg.n > 0:
        _ARGS[ord(_op.code)] = _arg.n
    else:
        _ARGS[ord(_op.code)] = ("sized", _PREFIX[_arg.n], _arg.n == pickletools.TAKEN_FROM_ARGUMENT4)


class _Source:
    """The stream, plus the unread rest of the current FRAME."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.frame = b""
        self.pos = 0

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
        if self.pos < len(self.frame):
            out = self.frame[self.pos : self.pos + n]
            self.pos += len(out)
            return out if len(out) == n else out + self._from_file(n - len(out))
        return self._from_file(n)

    def readline(self) -> bytes:
        if self.pos < len(self.frame):
            end = self.frame.find(b"\n", self.pos)
            if end >= 0:
                out, self.pos = self.frame[self.pos : end + 1], end + 1
                return out
            out, self.pos = self.frame[self.pos :], len(self.frame)
            return out + self._line_from_file()
        return self._line_from_file()

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
    src = _Source(file)
    out = bytearray()
    while True:
        op = src.read(1)
        if not op:
            if not out:
                raise EOFError("Ran out of input")
            return bytes(out)
        out += op
        code = op[0]
        how = _ARGS.get(code)
        if how is None or code == _STOP:
            return bytes(out)
        if type(how) is int:
            arg = src.read(how)
            out += arg
            if len(arg) < how:
                return bytes(out)
            if code == _FRAME:
                src.start_frame(int.from_bytes(arg, "little"))
        elif type(how) is str:
            for _ in range(2 if how == "2 lines" else 1):
                line = src.readline()
                out += line
                if not line.endswith(b"\n"):
                    return bytes(out)
        else:
            _, width, signed = how
            prefix = src.read(width)
            out += prefix
            size = int.from_bytes(prefix, "little", signed=signed)
            if len(prefix) < width or size < 0:
                return bytes(out)
            data = src.read(size)
            out += data
            if len(data) < size:
                return bytes(out)
