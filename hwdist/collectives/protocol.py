"""The one header round, and hwdist's own traffic: how ranks agree, and how hwdist's bytes travel.

Every exchange in which the ranks of a group must agree (verification, the sizes of an uneven gather or
``all_to_all``, object records, ``all_reduce_dict``'s layout, a rank's failure) is one all_gather of one
fixed-size ``Header`` per rank (24 int64 words, then inline bytes: docs/architecture.md), then the data where
there is any; every rank reaches the same verdict. ``agree`` is that round for a collective's arguments: every
rank raises the same error together, or none does.

hwdist's own traffic (small ints, byte strings, header rows, flat buffers) never goes through a user-facing
op; it travels as the driver's plan says (a lossless widening, a byte view), issued by the engine
([`issue`][hwdist.collectives.engine.issue]).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.distributed as torch_dist

from .. import registry
from ..drivers.base import byte_carrier
from ..errors import ArgumentAssertionError, CollectiveArgumentError, PlanError
from .engine import issue, view, wire_call
from .wire import byte_view, itemsize, retype

Tensor = torch.Tensor


# ---------------------------------------------------------------------------
# hwdist's own traffic, issued through the engine
# ---------------------------------------------------------------------------


def reduce_flat(buf: Tensor, reduce_op: str, group: Any = None) -> None:
    """Reduce ``buf`` (on the comm device, in a dtype the driver reduces) in place: one all_reduce.

    ``reduce_op`` is an issued op name ('sum', 'max', ...).
    """
    issue(wire_call(group, "all_reduce", send=buf, reduce_op=reduce_op))


def _world(group: Any) -> int:
    return int(view(group).size)


def gather_ints(values: Sequence[int], group: Any = None, driver: Any = None) -> list[list[int]]:
    """Every rank's ``values`` (int64, the same length on every rank), in group-rank order: one all_gather.

    ``driver``: the group's driver when the caller already has it (as for every function here).
    """
    driver = driver if driver is not None else registry.resolve(group)
    plan = driver.plan("all_gather", torch.int64)
    mine = torch.tensor(list(values), dtype=torch.int64)
    wire = mine.view(plan.comm_dtype) if plan.view else mine.to(plan.comm_dtype)
    wire = wire.to(driver.comm_device())
    outs = [torch.empty_like(wire) for _ in range(_world(group))]
    issue(wire_call(group, "all_gather", send=wire, recv=outs))
    stacked = torch.stack(outs).cpu()
    back = stacked.view(torch.int64) if plan.view else stacked.to(torch.int64)
    return back.tolist()


def gather_bytes(data: bytes, group: Any = None, driver: Any = None) -> list[bytes]:
    """Every rank's ``data`` (any lengths), in group-rank order: the lengths, then one padded all_gather."""
    driver = driver if driver is not None else registry.resolve(group)
    lengths = [row[0] for row in gather_ints([len(data)], group, driver)]
    width = max(8, (max(lengths) + 7) // 8 * 8)  # a multiple of 8: any integer carrier up to int64
    rows = gather_rows(np.frombuffer(bytearray(data) + bytearray(width - len(data)), np.uint8), group, driver)
    return [row[:n].tobytes() for row, n in zip(rows, lengths)]


# ---- bytes of a size every rank already knows (object collectives, results collection) ----------

#: Waits for one issued work: ``wait(work, p2p)``. With no waiter the exchange is issued blocking.
Waiter = Callable[[Any, bool], None]


def _wire(data: np.ndarray, carrier: torch.dtype, dev: torch.device) -> Tensor:
    # uint8 bytes as a tensor of the carrier dtype on ``dev``, zero-padded to a whole carrier element
    t = torch.from_numpy(data)
    if carrier is not torch.uint8:
        pad = -t.numel() % itemsize(carrier)
        if pad:
            t = torch.cat([t, t.new_zeros(pad)])
        t = retype(t, carrier)
    return t if dev.type == "cpu" else t.to(dev)  # (from numpy: on the CPU)


def _room(n: int, carrier: torch.dtype, dev: torch.device) -> Tensor:
    return torch.empty(-(-n // itemsize(carrier)), dtype=carrier, device=dev)


def _host(t: Tensor, n: int) -> np.ndarray:
    # a received buffer's first ``n`` bytes on the host (no copy when it is a host uint8 buffer)
    host = t.numpy() if t.dtype is torch.uint8 and t.is_cpu and t.dim() == 1 else byte_view(t).cpu().numpy()
    return host if host.size == n else host[:n]


def _settle(work: Any, wait: Optional[Waiter], p2p: bool) -> None:
    if wait is not None:
        wait(work, p2p)
    elif work is not None:
        work.wait()


def carries(driver: Any, op: str) -> bool:
    """Whether ``driver`` moves bytes for ``op`` ('all_gather', 'broadcast', 'send', 'recv')."""
    try:
        _carrier(driver, op)
    except PlanError:
        return False
    return True


def _rows_in(data: np.ndarray, op: str, group: Any, driver: Any) -> tuple[Any, int, torch.dtype, Tensor]:
    """(driver, group size, byte carrier, ``data`` on the wire) for a gather of equal rows by ``op``."""
    driver = driver if driver is not None else registry.resolve(group)
    carrier = _carrier(driver, op)
    return driver, _world(group), carrier, _wire(data, carrier, driver.comm_device())


_CARRIERS: dict[tuple[Any, str], torch.dtype] = {}


def _carrier(driver: Any, op: str) -> torch.dtype:
    """``byte_carrier(driver, op)``, found once per driver and op (a PlanError is raised each time)."""
    found = _CARRIERS.get((driver, op))
    if found is None:
        found = _CARRIERS[(driver, op)] = byte_carrier(driver, op)
    return found


def gather_rows(
    data: np.ndarray, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> np.ndarray:
    """Every rank's ``data`` (uint8, the same length on every rank) as the rows of a ``(world, len(data))``
    array, in group-rank order: one all_gather (``wait``: waits for the issued work; None: blocking)."""
    driver, world, carrier, inp = _rows_in(data, "all_gather", group, driver)
    n = data.size
    out = torch.empty(inp.numel() * world, dtype=carrier, device=inp.device)
    # one receive tensor (the engine falls back to the list form where the driver has no flat one)
    work = issue(wire_call(group, "all_gather_flat", send=inp, recv=out, driver=driver), wait is not None)
    _settle(work, wait, False)
    width = inp.numel() * itemsize(carrier)
    rows = _host(out, width * world).reshape(world, width)
    return rows if width == n else rows[:, :n]


def gathers(driver: Any) -> bool:
    """Whether ``driver`` issues ``gather`` itself for bytes (not emulated with an all_gather)."""
    try:
        return driver.plan("gather", _carrier(driver, "gather")).native_op == "gather"
    except PlanError:
        return False


def gather_rows_to(
    data: np.ndarray, dst: int, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> Optional[list[np.ndarray]]:
    """Every rank's ``data`` (uint8, the same length on every rank) on global rank ``dst``: a gather.

    Only the destination receives (the bytes cross the network once); use it where
    [`gathers`][hwdist.collectives.protocol.gathers] says the driver issues gather itself.

    Returns:
        On ``dst``: one uint8 array per group rank, in group-rank order; elsewhere None.
    """
    driver, world, _, inp = _rows_in(data, "gather", group, driver)
    n = data.size
    outs = None
    if view(group).rank == dst:
        outs = list(torch.empty((world, inp.numel()), dtype=inp.dtype, device=inp.device).unbind(0))
    work = issue(wire_call(group, "gather", send=inp, recv=outs, root=dst, driver=driver), wait is not None)
    _settle(work, wait, False)
    return None if outs is None else [_host(t, n) for t in outs]


def broadcast_sized(
    data: Optional[np.ndarray],
    n: int,
    src: int,
    group: Any = None,
    driver: Any = None,
    wait: Optional[Waiter] = None,
) -> np.ndarray:
    """The ``n`` bytes of global rank ``src`` on every rank (every rank knows ``n``): one broadcast.

    ``data`` is the bytes on ``src`` (returned as they are there), None elsewhere.
    """
    driver = driver if driver is not None else registry.resolve(group)
    dev = driver.comm_device()
    carrier = _carrier(driver, "broadcast")
    t = _wire(data, carrier, dev) if data is not None else _room(n, carrier, dev)
    work = issue(wire_call(group, "broadcast", send=t, root=src), wait is not None)
    _settle(work, wait, False)
    return data if data is not None else _host(t, n)


def send_bytes(
    data: np.ndarray, dst: int, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> None:
    """Send ``data`` (uint8) to global rank ``dst``, which receives it with ``recv_bytes(len(data), ...)``."""
    driver = driver if driver is not None else registry.resolve(group)
    t = _wire(data, _carrier(driver, "send"), driver.comm_device())
    _settle(issue(wire_call(group, "send", send=t, root=dst), True), wait, True)


def recv_bytes(
    n: int, src: int, group: Any = None, driver: Any = None, wait: Optional[Waiter] = None
) -> np.ndarray:
    """``n`` bytes from global rank ``src``, sent with ``send_bytes``."""
    driver = driver if driver is not None else registry.resolve(group)
    t = _room(n, _carrier(driver, "recv"), driver.comm_device())
    _settle(issue(wire_call(group, "recv", send=t, root=src), True), wait, True)
    return _host(t, n)


# ---------------------------------------------------------------------------
# the header
# ---------------------------------------------------------------------------
HEADER_BYTES = 1024
_WORDS = 24
_HEAD = 8 * _WORDS
#: The most bytes a header carries inline (a small payload, a failure's message, a call's description).
INLINE_BYTES = HEADER_BYTES - _HEAD
#: The header's words, little-endian int64 (what ``encode`` writes).
_PACK = struct.Struct(f"<{_WORDS}q")
DIMS = 8
#: The first word of every header.
MAGIC = int.from_bytes(b"HWDHDR01", "little")
OK = 0
#: flag: the inline bytes are the first INLINE_BYTES of a longer description
INLINE_CUT = 1
#: flag: the inline bytes are the call's description (verification), not a payload
DESCRIBED = 2

#: Every op that exchanges headers, by code (a header's op word; 0: none).
_OP_ORDER = (
    "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list", "collect_results",
    "collect_results(tmpdir)", "create_tmpdir", "all_reduce", "reduce", "broadcast", "all_gather", "gather",
    "scatter", "reduce_scatter", "all_to_all", "barrier", "pad_to_largest_tensor", "all_reduce_dict",
    "all_reduce_params", "agree",
)  # fmt: skip
OPS = {name: code for code, name in enumerate(_OP_ORDER, start=1)}
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
    """One rank's header (its words: docs/architecture.md, "The one protocol").

    ``rank`` is the sender's group rank, set by ``parse_rows``; ``framed`` is False for a row without the
    magic (that rank is in another kind of exchange).
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
    buf = bytearray(HEADER_BYTES)  # zeros; a bytearray keeps the array over it writable
    row = np.frombuffer(buf, dtype=np.uint8)
    inline = h.inline
    n = 0
    flags = h.flags
    if inline is not None:
        data = np.frombuffer(inline, dtype=np.uint8) if isinstance(inline, (bytes, bytearray)) else inline
        n = min(int(data.size), INLINE_BYTES)
        if n < data.size:
            flags |= INLINE_CUT
        row[_HEAD : _HEAD + n] = data[:n]
    dims = (tuple(h.dims[:DIMS]) + (0,) * DIMS)[:DIMS]
    _PACK.pack_into(
        buf, 0, MAGIC, h.status, h.op, h.seq, h.root, h.nbytes, h.nchunks, h.token, h.dtype, h.rop, h.numel,
        h.ndim, *dims, h.fingerprint, h.site, n, flags,
    )  # fmt: skip
    return row


def set_inline_length(row: np.ndarray, n: int) -> np.ndarray:
    """Declare the first ``n`` bytes of encoded header ``row``'s inline room its inline bytes (a payload
    written there in place); returns those bytes' view."""
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
    return gather_rows(encode(h), group, driver, wait)


#: The words a verified call's headers must share (magic, status, op, call number; fingerprint, site).
_AGREE = (slice(0, 32), slice(160, 176))


def rows_agree(rows: np.ndarray) -> bool:
    """Whether every row holds the first row's magic, OK status, op, call number, fingerprint and call site
    (a verified call agrees: nothing needs decoding)."""
    first = rows[0]
    return int(first[8:16].view("<i8")[0]) == OK and all((rows[:, s] == first[s]).all() for s in _AGREE)


def exchange(h: Header, group: Any, driver: Any, wait: Any = None) -> list[Header]:
    """The header round: every rank's header ``h``, in group-rank order (one all_gather of ``HEADER_BYTES``;
    ``wait``: a ``Waiter`` for the issued work, None: issued blocking)."""
    return parse_rows(exchange_rows(h, group, driver, wait))


# ---------------------------------------------------------------------------
# the agreement primitive: every rank raises together, or returns what all agree on
# ---------------------------------------------------------------------------
#: ``agree(raise_as=...)``: (this rank's problem or None, {rank: (exception type name, message)}) -> error.
Raiser = Callable[[Optional[BaseException], "dict[int, tuple[str, str]]"], BaseException]

_WORD = (1 << 31) - 1  # words are compared as 31-bit ints
_FAILED = 1


@dataclass(frozen=True)
class Agreement:
    """What every rank learned from one ``agree`` call: the maximum of ``flag``, whether every rank gave
    the same ``words``, and their element-wise maximum and minimum."""

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
        raise_as: on the error path every rank (those that gave a ``problem`` too) raises ``raise_as(problem,
            failures)`` instead of the default below.

    Returns:
        An ``Agreement``; deciding what a difference in ``words`` means is the caller's job.

    Raises:
        BaseException: ``problem`` itself, on the rank that gave it.
        CollectiveArgumentError: on every other rank when some rank gave a ``problem``, naming it.
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
    if failed:  # every rank raises, naming the ranks that gave a problem
        failures = {r: (kind, msg) for r, (kind, _, msg) in failed.items()}
        if raise_as is not None:
            raise raise_as(problem, failures)
        if problem is not None:
            raise problem
        first = min(failures)
        raise CollectiveArgumentError(
            f"{fn}: rank {first} was given invalid arguments ({': '.join(failures[first])});"
            f" rank {torch_dist.get_rank(group)} raises too so that no rank waits forever",
            {r: f"{k}: {m}" for r, (k, m) in failures.items()},
        )
    rows = [h.inline.copy().view("<i8").tolist() if h.inline is not None else [] for h in headers]
    if len({len(r) for r in rows}) > 1:  # another agreement on some rank: nothing in common to compare
        hi: tuple[int, ...] = (1,) * len(mine)
        lo: tuple[int, ...] = (0,) * len(mine)
    else:
        hi = tuple(max(col) for col in zip(*rows))
        lo = tuple(min(col) for col in zip(*rows))
    return Agreement(flag=max(h.nbytes for h in headers), same=hi == lo, highest=hi, lowest=lo)


def max_over_ranks(values: Sequence[int], group: Any, driver: Any = None) -> list[int]:
    """The element-wise maximum over the ranks of 31-bit non-negative ints (one header round)."""
    return list(agree("max", group, words=values, driver=driver).highest)


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


def _describe_dict(keys: Sequence[Any], values: Sequence[Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(repr of key, shape, dtype name) of each value: what the ranks compare and what errors show."""
    return [(repr(k), tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in zip(keys, values)]


def check_same_dicts(
    fn: str,
    keys: Sequence[Any],
    values: Sequence[Any],
    problem: Optional[Exception],
    group: Any,
    *,
    driver: Any = None,
    what: str = "keys, shapes and dtypes",
) -> None:
    """Every rank raises together unless every rank holds the same keys, shapes and dtypes.

    One ``agree`` round of a fingerprint of the dict and of ``problem``. When some rank's argument was bad,
    every rank raises [`argument_error`][hwdist.collectives.protocol.argument_error]'s error; when the dicts
    differ, the descriptions are exchanged (error path only) and every rank raises a ValueError naming the
    difference.

    Args:
        fn: the public op's name (starts every message).
        keys: the dict's keys, sorted.
        values: their tensors, in that order.
        problem: this rank's bad argument (its message without ``fn``), or None.
        group: the process group.
        driver: the group's driver when the caller has it.
        what: what every rank must pass the same of, in the mismatch message.
    """
    words, desc = (0, 0), []
    if problem is None:  # (a bad value may have no shape)
        desc = _describe_dict(keys, values)
        digest = hashlib.blake2b(repr(desc).encode(), digest_size=8).digest()
        words = (int.from_bytes(digest[:4], "little") >> 1, int.from_bytes(digest[4:], "little") >> 1)

    def raise_as(mine: Optional[BaseException], failures: dict[int, tuple[str, str]]) -> BaseException:
        return argument_error(fn, mine, failures, torch_dist.get_world_size(group))

    if agree(fn, group, problem=problem, words=words, driver=driver, raise_as=raise_as).same:
        return
    texts = [t.decode() for t in gather_bytes(repr(desc).encode(), group, driver)]
    raise ValueError(f"{fn}: {_explain(texts)}; every rank must pass the same {what}")


def _explain(texts: list[str]) -> str:
    """Where the ranks' dicts differ from rank 0's (``texts``: each rank's ``repr`` of its description)."""
    import ast

    descs = [{k: (s, d) for k, s, d in ast.literal_eval(t)} for t in texts]
    ref = descs[0]
    parts = []
    for r, other in enumerate(descs[1:], start=1):
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
