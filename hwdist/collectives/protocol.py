"""The one header round: the only way hwdist's ranks agree with each other.

Every exchange in which the ranks of a group must agree (a collective's
verification, the sizes of an uneven gather or ``all_to_all``, an object
collective's records, ``collect_results``, ``all_reduce_dict``'s layout, a rank's
failure) is one all_gather of one fixed-size ``Header``
per rank, then the data where there is any. Every rank sees every header, so
every rank reaches the same verdict: go on, or raise the same error.

A header is ``HEADER_BYTES`` (1 KiB): 24 little-endian int64 words, then inline bytes::

    word  0  magic ("HWDHDR01": a row without it came from another kind of exchange)
          1  status (OK, or the kind of this rank's failure: its message is the inline bytes)
          2  op code (which collective: OPS)
          3  the group's call number (verification) or 0
          4  root (a global rank) or -1
          5  byte size of this rank's payload
          6  chunk count (results collection) or 0
          7  token (a random word every rank must share) or 0
          8  dtype code (dtype_code) or 0
          9  reduce op code or 0
         10  numel or -1
         11  ndim (-1: no shape), then 12-19 the first 8 dims
         20  fingerprint of what must agree (a hash of the call's description)
         21  call-site hash (debug mode) or 0
         22  inline length
         23  flags (DESCRIBED: the inline bytes are the call's description; INLINE_CUT: it was cut)

Nothing is predicted: the header size never changes, a payload that fits the
inline room travels inside it (one collective in all), a larger one moves
afterwards at its exact size.

**The agreement primitive.** ``agree`` is the
header round for a collective's arguments: every rank raises the same error
together, or none does. A collective that checked its arguments on each rank
alone would let one rank raise while the others wait forever in the collective
it skipped. Each rank's header carries whether its arguments were invalid (and
its message, inline), a few integers every rank must hold the same
(fingerprints of shapes, dtypes, keys, configuration) and a flag whose maximum
the caller wants; the rank whose input was bad raises its own exception, the
others an error naming it. ``check_same_dicts``
is that agreement for a dict of tensors (``average_metrics``).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Optional, Sequence

import numpy as np
import torch
import torch.distributed as torch_dist

from .. import registry
from ..errors import ArgumentAssertionError, CollectiveArgumentError, PlanError
from . import transport

__all__ = [
    "HEADER_BYTES", "INLINE_BYTES", "MAGIC", "OK", "INLINE_CUT", "DESCRIBED", "OPS", "OP_NAMES", "Header",
    "encode", "decode", "parse_rows", "exchange", "dtype_code", "dtype_name", "digest",
    "op_code", "op_name", "stamp", "set_inline_length", "INLINE_AT", "exchange_rows", "rows_agree",
    "Agreement", "agree", "Raiser", "argument_error", "check_same_dicts", "dict_fingerprint",
    "max_over_ranks",
]  # fmt: skip

HEADER_BYTES = 1024
_WORDS = 24
_HEAD = 8 * _WORDS
#: Where the inline bytes start in an encoded header.
INLINE_AT = _HEAD
#: The most bytes a header carries inline (a small payload, a failure's message, a call's description).
INLINE_BYTES = HEADER_BYTES - _HEAD
DIMS = 8
#: The first word of every header.
MAGIC = int.from_bytes(b"HWDHDR01", "little")
OK = 0
#: flag: the inline bytes are the first INLINE_BYTES of a longer description
INLINE_CUT = 1
#: flag: the inline bytes are the call's description (verification), not a payload
DESCRIBED = 2

#: Every op that exchanges headers, by code (a header's op word; 0: none).
OPS = {
    name: code
    for code, name in enumerate(
        (
            "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
            "collect_results", "collect_results(tmpdir)", "create_tmpdir",
            "all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter",
            "all_to_all", "barrier", "pad_to_largest_tensor", "all_reduce_dict", "all_reduce_params",
            "agree",
        ),
        start=1,
    )
}  # fmt: skip
OP_NAMES = {v: k for k, v in OPS.items()}

_KNOWN_DTYPES = [
    d for d in (getattr(torch, n, None) for n in (
        "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64"
        " complex32 complex64 complex128 float8_e4m3fn float8_e5m2"
    ).split()) if isinstance(d, torch.dtype)
]  # fmt: skip


def dtype_code(dtype: torch.dtype) -> int:
    """A 31-bit code of ``dtype``, the same on every rank and torch version (crc32 of its name)."""
    return zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF


_CODE_TO_NAME = {dtype_code(d): str(d).replace("torch.", "") for d in _KNOWN_DTYPES}


def dtype_name(code: int) -> str:
    """The dtype's short name for ``code`` (``'bytes'`` for 0, ``'dtype #N'`` if unknown here)."""
    if code == 0:
        return "bytes"
    return _CODE_TO_NAME.get(code, f"dtype #{code}")


def op_code(name: str) -> int:
    """The op word of ``name`` (a crc32 for a name outside OPS, so any two names still differ)."""
    return OPS.get(name) or (zlib.crc32(name.encode()) & 0x7FFFFFFF) + 1000


def op_name(code: int) -> str:
    """The op's name for ``code`` (as far as this rank knows it)."""
    return OP_NAMES.get(code, f"op #{code}")


def digest(text: str) -> int:
    """A 63-bit fingerprint of ``text`` (the same on every rank and Python version)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


@dataclass
class Header:
    """One rank's header (see the module's table for the words).

    ``rank`` is the sender's group rank, set by ``parse_rows``;
    ``framed`` is False for a row without the magic (that rank is in another kind of exchange).
    """

    status: int = OK
    op: int = 0
    seq: int = 0
    root: int = -1
    nbytes: int = 0
    nchunks: int = 0
    token: int = 0
    dtype: int = 0
    rop: int = 0
    numel: int = -1
    ndim: int = -1
    dims: tuple[int, ...] = ()
    fingerprint: int = 0
    site: int = 0
    flags: int = 0
    inline: Any = None  # bytes / a uint8 array, at most INLINE_BYTES
    rank: int = -1
    framed: bool = field(default=True, repr=False)

    @classmethod
    def of_tensor(cls, t: torch.Tensor, nbytes: int, **kw: Any) -> "Header":
        """A header describing tensor ``t`` (its dtype, numel and shape), ``nbytes`` on the wire."""
        return cls(
            nbytes=nbytes, dtype=dtype_code(t.dtype), numel=t.numel(), ndim=t.dim(),
            dims=tuple(t.shape[:DIMS]), **kw,
        )  # fmt: skip

    @property
    def shape(self) -> Optional[torch.Size]:
        """The shape, when the header holds all of it (None: no shape, or more than 8 dims)."""
        return torch.Size(self.dims) if 0 <= self.ndim <= DIMS else None

    @property
    def message(self) -> str:
        """The inline bytes as text (a failure's message, a call's description)."""
        return bytes(self.inline).decode("utf-8", "replace") if self.inline is not None else ""


def encode(h: Header) -> np.ndarray:
    """``h`` as its ``HEADER_BYTES`` (uint8); inline bytes beyond the room are cut (flag ``INLINE_CUT``)."""
    row = np.zeros(HEADER_BYTES, dtype=np.uint8)
    inline = h.inline
    n = 0
    flags = h.flags
    if inline is not None:
        data = np.frombuffer(inline, dtype=np.uint8) if isinstance(inline, (bytes, bytearray)) else inline
        n = min(int(data.size), INLINE_BYTES)
        if n < data.size:
            flags |= INLINE_CUT
        row[_HEAD : _HEAD + n] = data[:n]
    dims = (list(h.dims[:DIMS]) + [0] * DIMS)[:DIMS]
    words = [
        MAGIC, h.status, h.op, h.seq, h.root, h.nbytes, h.nchunks, h.token, h.dtype, h.rop, h.numel,
        h.ndim, *dims, h.fingerprint, h.site, n, flags,
    ]  # fmt: skip
    row[:_HEAD] = np.array(words, dtype="<i8").view(np.uint8)
    return row


def set_inline_length(row: np.ndarray, n: int) -> np.ndarray:
    """Declare the first ``n`` bytes after ``INLINE_AT`` of encoded header ``row`` its inline bytes (a
    payload written there in place); returns those bytes' view."""
    row[:_HEAD].view("<i8")[22] = n
    return row[_HEAD : _HEAD + n]


def stamp(row: np.ndarray, op: int, seq: int, fingerprint: int, site: int) -> np.ndarray:
    """``row`` (an encoded header, a record) with a verified call's op, call number, fingerprint and call
    site written in (a copy when ``row`` is read-only)."""
    if not row.flags.writeable:
        row = row.copy()
    words = row[:_HEAD].view("<i8")
    words[2], words[3], words[20], words[21] = op, seq, fingerprint, site
    return row


def _decode(rank: int, w: list[int], row: np.ndarray) -> Header:
    n = w[22]
    framed = w[0] == MAGIC and 0 <= n <= INLINE_BYTES
    if not framed:
        return Header(rank=rank, framed=False)
    ndim = w[11]
    return Header(
        status=w[1], op=w[2], seq=w[3], root=w[4], nbytes=w[5], nchunks=w[6], token=w[7], dtype=w[8],
        rop=w[9], numel=w[10], ndim=ndim, dims=tuple(w[12 : 12 + min(max(ndim, 0), DIMS)]),
        fingerprint=w[20], site=w[21], flags=w[23], inline=row[_HEAD : _HEAD + n] if n else None,
        rank=rank,
    )  # fmt: skip


def decode(row: np.ndarray, rank: int = 0) -> Header:
    """The header in ``row`` (its first ``HEADER_BYTES``)."""
    return parse_rows(row[:HEADER_BYTES].reshape(1, -1), first=rank)[0]


def parse_rows(rows: np.ndarray, first: int = 0) -> list[Header]:
    """Every rank's header from the rows of a header all_gather (one row per group rank)."""
    words: list[list[int]] = rows[:, :_HEAD].copy().view("<i8").tolist()  # Python ints, in one call
    return [_decode(first + r, w, rows[r]) for r, w in enumerate(words)]


def exchange_rows(h: Header, group: Any, driver: Any, wait: Any = None) -> np.ndarray:
    """The header round's rows (a ``(world, HEADER_BYTES)`` uint8 array), not decoded."""
    return transport.gather_rows(encode(h), group, driver, wait)


#: The words a verified call's headers must share (magic, status, op, call number; fingerprint, site).
_AGREE = (slice(0, 32), slice(160, 176))


def rows_agree(rows: np.ndarray) -> bool:
    """Whether every row holds the first row's magic, OK status, op, call number, fingerprint and call site
    (a verified call agrees: nothing needs decoding)."""
    first = rows[0]
    return int(first[8:16].view("<i8")[0]) == OK and all((rows[:, s] == first[s]).all() for s in _AGREE)


def exchange(h: Header, group: Any, driver: Any, wait: Any = None) -> list[Header]:
    """The header round: every rank's header, in group-rank order (one all_gather of ``HEADER_BYTES``).

    Args:
        h: this rank's header.
        group: the process group (None: the default group).
        driver: the group's driver.
        wait: waits for the issued work (``transport.Waiter``; None: issued blocking).
    """
    return parse_rows(exchange_rows(h, group, driver, wait))


def listing(headers: Sequence[Header], show: Any) -> str:
    """``rank 0: <show(h0)>; rank 1: ...``."""
    return "; ".join(f"rank {h.rank}: {show(h)}" for h in headers)


# ---------------------------------------------------------------------------
# the agreement primitive: every rank raises together, or returns what all agree on
# ---------------------------------------------------------------------------
#: What ``agree(raise_as=...)`` calls on every rank on the error path: ``(this rank's own problem or
#: None, {rank: (exception type name, message)} of every rank that gave one)`` -> the exception to raise.
Raiser = Callable[[Optional[BaseException], "dict[int, tuple[str, str]]"], BaseException]

_WORD = (1 << 31) - 1  # words are compared as 31-bit ints
_FAILED = 1


@dataclass(frozen=True)
class Agreement:
    """What every rank learned from one ``agree`` call.

    Attributes:
        flag: the maximum of ``flag`` over the ranks.
        same: whether every rank gave the same ``words``.
        highest: the element-wise maximum of ``words``.
        lowest: the element-wise minimum of ``words``.
    """

    flag: int
    same: bool
    highest: tuple[int, ...]
    lowest: tuple[int, ...]


def agree(
    fn: str,
    group: Any,
    *,
    problem: Optional[BaseException] = None,
    words: Sequence[int] = (),
    flag: int = 0,
    driver: Any = None,
    raise_as: Optional[Raiser] = None,
) -> Agreement:
    """Run on every rank of ``group`` before a collective: raise together, or return what all agree on.

    Args:
        fn: the public op's name (starts every message).
        group: the process group (None: the default group).
        problem: this rank's argument error, if any (raised here, on this rank, after the exchange).
        words: integers every rank should hold the same (reduced to 31 bits each; at most 100).
        flag: a small non-negative int; the result carries its maximum over the ranks.
        driver: the group's driver when the caller already has it.
        raise_as: on the error path, every rank (the ones that gave a ``problem`` too) raises
            ``raise_as(problem, failures)`` instead of the default below; for ops whose errors
            keep an older form (the same message on every rank).

    Returns:
        An ``Agreement``; deciding what a difference in
        ``words`` means is the caller's job.

    Raises:
        BaseException: ``problem`` itself, on the rank that gave it.
        CollectiveArgumentError: on every other rank when some rank gave a ``problem``
            (a ``TypeError`` and a ``ValueError``), naming that rank and its message.
    """
    driver = driver if driver is not None else registry.resolve(group)
    mine = [int(w) & _WORD for w in words]
    if problem is not None:
        text = f"{type(problem).__name__}: {problem}".encode("utf-8", "replace")
        head = Header(status=_FAILED, op=OPS["agree"], nbytes=flag, inline=text)
    else:
        packed = np.array(mine, dtype="<i8").view(np.uint8)
        head = Header(op=OPS["agree"], nbytes=int(flag), nchunks=len(mine), inline=packed)
    headers = exchange(head, group, driver)
    failed = {h.rank: h.message.partition(": ") for h in headers if h.status != OK or not h.framed}
    if failed:
        _raise(fn, group, problem, {r: (kind, msg) for r, (kind, _, msg) in failed.items()}, raise_as)
    rows = [h.inline.copy().view("<i8").tolist() if h.inline is not None else [] for h in headers]
    if len({len(r) for r in rows}) > 1:  # another agreement on some rank: nothing in common to compare
        hi: tuple[int, ...] = (1,) * len(mine)
        lo: tuple[int, ...] = (0,) * len(mine)
    else:
        hi = tuple(max(col) for col in zip(*rows))
        lo = tuple(min(col) for col in zip(*rows))
    return Agreement(flag=max(h.nbytes for h in headers), same=hi == lo, highest=hi, lowest=lo)


def _raise(
    fn: str,
    group: Any,
    problem: Optional[BaseException],
    failures: dict[int, tuple[str, str]],
    raise_as: Optional[Raiser],
) -> NoReturn:
    """The error path of ``agree``: every rank raises, naming the
    ranks that gave a problem (``failures``: rank -> (exception type name, message))."""
    if raise_as is not None:
        raise raise_as(problem, failures)
    if problem is not None:
        raise problem
    first = min(failures)
    kind, msg = failures[first]
    raise CollectiveArgumentError(
        f"{fn}: rank {first} was given invalid arguments ({kind}: {msg});"
        f" rank {torch_dist.get_rank(group)} raises too so that no rank waits forever",
        {r: f"{k}: {m}" for r, (k, m) in failures.items()},
    )


def max_over_ranks(values: Sequence[int], group: Any, driver: Any = None) -> list[int]:
    """The element-wise maximum over the ranks of 31-bit non-negative ints (one header round)."""
    return list(agree("max", group, words=values, driver=driver).highest)


# ---------------------------------------------------------------------------
# every rank holds the same dict (keys, shapes, dtypes): all_reduce_dict, average_metrics
# ---------------------------------------------------------------------------
def describe_dict(keys: Sequence[Any], values: Sequence[Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(repr of key, shape, dtype name) of each value: what the ranks compare and what errors show."""
    return [(repr(k), tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in zip(keys, values)]


def dict_fingerprint(op: Optional[str], keys: Sequence[Any], values: Sequence[Any]) -> tuple[int, int]:
    """Two 31-bit words of a hash of the keys, shapes and dtypes (and ``op``): what the ranks compare."""
    desc = describe_dict(keys, values)
    text = repr(desc if op is None else [("op", (), op), *desc])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little") >> 1, int.from_bytes(digest[4:], "little") >> 1


def argument_error(
    fn: str, mine: Optional[BaseException], failures: dict[int, tuple[str, str]], world: int
) -> BaseException:
    """The error every rank raises when some ranks' arguments were bad (``failures``: rank -> (exception
    type name, message)): ``mine``'s type where this rank's was bad, PlanError where every failure was
    one, else ValueError; the message alone when every rank gave the same one."""
    texts = [msg for _, msg in failures.values()]
    if len(failures) == world and len(set(texts)) == 1:
        explained = texts[0]  # the same bad argument on every rank: no rank list needed
    else:
        explained = "; ".join(f"rank {r}: {msg}" for r, (_, msg) in sorted(failures.items()))
    kinds = (TypeError, ValueError, ArgumentAssertionError, PlanError)
    kind = type(mine) if mine is not None and type(mine) in kinds else ValueError
    if all(name == "PlanError" for name, _ in failures.values()):
        kind = PlanError  # no plan for a dtype: the type all_reduce raises, on every rank
    return kind(f"{fn}: {explained}")


def check_same_dicts(
    fn: str,
    keys: Sequence[Any],
    values: Sequence[Any],
    problem: Optional[Exception],
    group: Any,
    *,
    op: Optional[str] = None,
    driver: Any = None,
    words: Optional[tuple[int, int]] = None,
    what: str = "",
) -> None:
    """Every rank raises together unless every rank holds the same keys, shapes and dtypes (and ``op``).

    One header round (``collectives.protocol.agree``) of a fingerprint and of
    ``problem`` (this rank's bad argument, found before any communication). When some rank's
    argument was bad, every rank raises the same message (``problem``'s type where it was this
    rank's, else ValueError); when the layouts differ, the descriptions are exchanged (error path
    only) and every rank raises a ValueError naming the difference.

    Args:
        fn: the public op's name (starts every message).
        keys: the dict's keys, sorted.
        values: their tensors, in that order.
        problem: this rank's bad argument (its message without ``fn``), or None.
        group: the process group.
        op: the reduce op, when every rank must pass the same one.
        driver: the group's driver when the caller has it.
        words: the layout's fingerprint when the caller has it.
        what: what every rank must pass the same of, in the mismatch message
            (default: keys, shapes and dtypes, and op when given).
    """
    if problem is not None:
        words = (0, 0)
    elif words is None:
        words = dict_fingerprint(op, keys, values)

    def raise_as(mine: Optional[BaseException], failures: dict[int, tuple[str, str]]) -> BaseException:
        return argument_error(fn, mine, failures, torch_dist.get_world_size(group))

    same = agree(fn, group, problem=problem, words=words, driver=driver, raise_as=raise_as).same
    if same:
        return
    text = repr([op, describe_dict(keys, values)])
    texts = [t.decode() for t in transport.gather_bytes(text.encode(), group, driver)]
    what = what or ("keys, shapes and dtypes" if op is None else "keys, shapes, dtypes and op")
    raise ValueError(f"{fn}: {_explain(texts)}; every rank must pass the same {what}")


def _explain(texts: list[str]) -> str:
    """Where the ranks' layouts differ from rank 0's (``texts``: each rank's ``repr([op, description])``)."""
    import ast

    parsed = [ast.literal_eval(t) for t in texts]
    ops = [op for op, _ in parsed]
    descs = [{k: (s, d) for k, s, d in desc} for _, desc in parsed]
    ref = descs[0]
    parts = []
    for r, other in enumerate(descs[1:], start=1):
        if ops[r] != ops[0]:
            parts.append(f"op is '{ops[0]}' on rank 0 but '{ops[r]}' on rank {r}")
        missing = sorted(set(ref) - set(other))
        extra = sorted(set(other) - set(ref))
        if missing:
            parts.append(f"rank {r} lacks keys {', '.join(missing)} that rank 0 has")
        if extra:
            parts.append(f"rank {r} has extra keys {', '.join(extra)}")
        for k in sorted(set(ref) & set(other)):
            if ref[k][0] != other[k][0]:
                parts.append(f"key {k} has shape {ref[k][0]} on rank 0 but {other[k][0]} on rank {r}")
            if ref[k][1] != other[k][1]:
                parts.append(f"key {k} has dtype {ref[k][1]} on rank 0 but {other[k][1]} on rank {r}")
    return "; ".join(parts) or "the ranks' dicts differ"
