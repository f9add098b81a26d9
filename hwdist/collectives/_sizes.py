"""Size agreement by prediction: one collective per call in the steady state.

An op whose ranks may hold different sizes (an uneven ``all_gather``/``gather``,
``all_to_all`` with uneven splits) today exchanges sizes first and moves the data second: two collectives per
call. Here every rank instead *predicts* the next call's size from the group's
history for that op and call-shape key, and sends a buffer of the predicted
capacity with a small fixed [`Header`][hwdist.collectives._sizes.Header] in front
(true byte count, numel, dtype code, ndim, dims, a layout fingerprint). The
collective is always well-formed: every rank sends the same number of bytes,
because every rank's history was built only from what every rank saw.

Every rank sees every header, so [`verdict`][hwdist.collectives._sizes.verdict]
gives the same answer everywhere: the prediction held (use the data), or redo
(a rank is over the capacity, a shape has more dims than the header carries, or
the layouts differ) with the sizes now known, or a real error (dtypes or ndims
differ) with the same message on every rank. No rank can hang or read another
rank's bytes as its own: a rank over the capacity sent its first ``capacity``
bytes, and the redo sends only the rest.

The rules (the per-key [`SizeHistory`][hwdist.collectives._sizes.SizeHistory]):

- *Prediction.* The history keeps the largest payload of the last
  ``HISTORY_LEN`` agreed calls. If they repeat with a period of 1 to 4 calls
  (equal sizes; big/small alternation; ...), the prediction is the size at the
  same phase; otherwise the last size plus the last growth (never more than 2x
  the last size). The capacity is the prediction rounded up to a bucket
  ([`capacity_for`][hwdist.collectives._sizes.capacity_for]: 64 bytes up to
  4 KiB, then under 12.5 % headroom).
- *Memory.* The capacity is at most 2x the size the history predicts for this
  call, so padding is at most 2x the largest true size unless the sizes shrank
  more than 2x since the history's last matching call; then the very next call
  predicts the smaller size. Above ``limit`` bytes (the driver's gather cliff;
  ``PREDICT_MAX_BYTES`` by default) no prediction is made: the sizes are
  exchanged first (a few % of such a transfer), nothing is padded, and the
  data can take another route (one broadcast per rank on gloo).
- *Where the header travels* ([`route`][hwdist.collectives._sizes.route]): in
  band up to ``IN_BAND_MAX_BYTES`` (one collective; copying the payload behind
  the header is free there), beside the data above it (the header's small
  all_gather issued together with the data's, ``async_op=True``: no copy).
- *Adaptation.* Two misses in a row switch the key to the explicit exchange for
  ``backoff`` calls (4, doubling to 64 while it keeps missing; reset by a hit).
  A miss costs two collectives (the predicted one and the redo of the bytes over
  the capacity), the same count as the explicit exchange (sizes, then data), so
  sizes that change on every call cost no more collectives than today; only the
  padding of the missed call is extra, and the backoff makes that rare.
- *Symmetry.* [`SizeHistory.record`][hwdist.collectives._sizes.SizeHistory.record]
  takes a [`Verdict`][hwdist.collectives._sizes.Verdict] (built from every rank's
  headers) and nothing local, and the key must be built only from what the op's
  contract makes equal on every rank (op name, root, a call-site tag): never
  from this rank's dtype or shape, which travel in the header.

Measured costs and the route choice at large sizes are in docs/benchmarks.md
("Tensor gathers" and "gloo's all_gather at large sizes").
"""

from __future__ import annotations

import enum
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .. import _state
from ..errors import CollectiveArgumentError
from . import transport
from ._wire import byte_view, copy_bytes

__all__ = [
    "HEADER_BYTES",
    "HEADER_DIMS",
    "IN_BAND_MAX_BYTES",
    "PREDICT_MAX_BYTES",
    "Header",
    "Outcome",
    "Verdict",
    "SizeHistory",
    "capacity_for",
    "dtype_code",
    "dtype_name",
    "frame",
    "unframe",
    "pack",
    "unpack",
    "verdict",
    "history",
    "route",
    "gather",
]

Tensor = torch.Tensor

HEADER_DIMS = 8  #: dims carried in the header; a longer shape makes the call redo with an explicit exchange
HEADER_WORDS = 16
HEADER_BYTES = 8 * HEADER_WORDS  #: 128: keeps every payload slot 64-byte aligned
GRANULE = 64  #: capacities are multiples of this (any dtype's view stays aligned)
PREDICT_MAX_BYTES = 8 << 20  #: default ``limit``: gloo's all_gather cliff on one host (docs/benchmarks.md)
IN_BAND_MAX_BYTES = 64 << 10  #: header in band up to this capacity, beside the data above it
HISTORY_LEN = 8
BACKOFF_START = 4
BACKOFF_MAX = 64
_MAGIC = 0x48575331  # "HWS1": a slot that does not start with it was not framed by this protocol
_PERIODS = (1, 2, 3, 4)

_KNOWN_DTYPES = [
    d for d in (getattr(torch, n, None) for n in (
        "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64"
        " complex32 complex64 complex128 float8_e4m3fn float8_e5m2"
    ).split()) if isinstance(d, torch.dtype)
]


def dtype_code(dtype: torch.dtype) -> int:
    """A 31-bit code of ``dtype``, the same on every rank and torch version (crc32 of its name)."""
    return zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF


_CODE_TO_NAME = {dtype_code(d): str(d).replace("torch.", "") for d in _KNOWN_DTYPES}


def dtype_name(code: int) -> str:
    """The dtype's short name for ``code`` (``'bytes'`` for 0, ``'dtype #N'`` if unknown here)."""
    if code == 0:
        return "bytes"
    return _CODE_TO_NAME.get(code, f"dtype #{code}")


@dataclass(frozen=True)
class Header:
    """What each rank sends in front of its payload.

    Attributes:
        nbytes: the true payload size in bytes.
        numel: the tensor's element count (bytes payloads: ``nbytes``).
        dtype: [`dtype_code`][hwdist.collectives._sizes.dtype_code] of the tensor (0: raw bytes).
        ndim: the tensor's number of dims (-1: raw bytes).
        layout: a caller-defined fingerprint (dict keys, a split vector, a serializer; 0: none).
        span: the size that must fit the capacity (``nbytes``; ``all_to_all``: the largest piece).
        dims: the first ``HEADER_DIMS`` dims.
    """

    nbytes: int
    numel: int = 0
    dtype: int = 0
    ndim: int = -1
    layout: int = 0
    span: int = -1
    dims: tuple[int, ...] = ()

    @classmethod
    def of(cls, tensor: Tensor, layout: int = 0, span: Optional[int] = None) -> "Header":
        """The header of ``tensor`` (any dtype, any shape)."""
        nbytes = tensor.numel() * tensor.element_size()
        return cls(nbytes, tensor.numel(), dtype_code(tensor.dtype), tensor.dim(), layout,
                   nbytes if span is None else span, tuple(tensor.shape[:HEADER_DIMS]))

    @classmethod
    def of_bytes(cls, nbytes: int, layout: int = 0) -> "Header":
        """The header of a raw byte payload (serialized objects, records)."""
        return cls(nbytes, nbytes, 0, -1, layout, nbytes, ())

    @property
    def fits(self) -> int:
        """The size compared with the capacity."""
        return self.nbytes if self.span < 0 else self.span

    @property
    def shape(self) -> Optional[torch.Size]:
        """The full shape, or None when it has more than ``HEADER_DIMS`` dims (or the payload is bytes)."""
        if self.ndim < 0 or self.ndim > HEADER_DIMS:
            return None
        return torch.Size(self.dims[: self.ndim])

    def words(self) -> list[int]:
        """The ``HEADER_WORDS`` int64 words that travel."""
        dims = (list(self.dims) + [0] * HEADER_DIMS)[:HEADER_DIMS]
        head = [_MAGIC, self.nbytes, self.numel, self.dtype, self.ndim, self.layout, self.fits, *dims]
        return head + [0] * (HEADER_WORDS - len(head))

    @classmethod
    def from_words(cls, words: Sequence[int]) -> "Header":
        """Parse :meth:`words`' output; raises ``ValueError`` if the slot was not framed by this protocol."""
        w = [int(x) for x in words]
        if len(w) < HEADER_WORDS or w[0] != _MAGIC:
            raise ValueError(
                f"not a size header (magic {w[0] if w else None:#x}, expected {_MAGIC:#x}): the rank that"
                " sent it is in a different collective"
            )
        ndim = w[4]
        dims = tuple(w[7 : 7 + min(max(ndim, 0), HEADER_DIMS)])
        return cls(w[1], w[2], w[3], ndim, w[5], w[6], dims)


def pack(header: Header) -> Tensor:
    """``header`` as ``HEADER_BYTES`` uint8 (int64 words, native byte order)."""
    return torch.tensor(header.words(), dtype=torch.int64).view(torch.uint8)


def unpack(row: Tensor) -> Header:
    """The header at the start of ``row`` (uint8, CPU)."""
    return Header.from_words(row[:HEADER_BYTES].contiguous().view(torch.int64).tolist())


def capacity_for(nbytes: int) -> int:
    """The bucket for ``nbytes``: a multiple of 64 up to 4 KiB, then under 12.5 % headroom (still x64)."""
    n = max(int(nbytes), 1)
    step = GRANULE if n <= 4096 else 1 << (n.bit_length() - 4)
    return -(-n // step) * step


def _padded(nbytes: int) -> int:
    return -(-max(nbytes, 0) // GRANULE) * GRANULE


def frame(payload: Tensor, header: Header, capacity: int) -> Tensor:
    """One rank's slot: ``header`` then the first ``capacity`` bytes of ``payload`` (uint8), zero-padded.

    Args:
        payload: the bytes (a flat uint8 tensor on CPU); only ``min(len, capacity)`` of them are copied.
        header: this rank's header (its ``nbytes`` may exceed ``capacity``: the verdict then says redo).
        capacity: the predicted capacity (a multiple of 64, the same on every rank).
    """
    slot = torch.zeros(HEADER_BYTES + capacity, dtype=torch.uint8)
    slot[:HEADER_BYTES] = pack(header)
    n = min(payload.numel(), capacity)
    copy_bytes(slot[HEADER_BYTES : HEADER_BYTES + n], payload[:n])
    return slot


def unframe(rows: Tensor) -> tuple[list[Header], list[Tensor]]:
    """Every rank's header and payload view (at most ``capacity`` bytes) from gathered ``(world, len)``."""
    headers = [unpack(row) for row in rows]
    cap = rows.shape[1] - HEADER_BYTES
    return headers, [row[HEADER_BYTES : HEADER_BYTES + min(h.nbytes, cap)] for row, h in zip(rows, headers)]


class Outcome(enum.Enum):
    """What every rank concludes from every rank's headers."""

    HELD = "held"  #: the prediction held (or the call was an explicit exchange): use the data
    REDO = "redo"  #: the sizes are now known; move what did not fit (or exchange what the header lacks)
    ERROR = "error"  #: the arguments really disagree: raise ``Verdict.error()`` on every rank


@dataclass(frozen=True)
class Verdict:
    """The same conclusion on every rank, from every rank's headers.

    Attributes:
        outcome: held, redo or error.
        headers: every rank's header, in group-rank order.
        capacity: the capacity the call used (None: an explicit exchange, headers only).
        largest: the largest ``fits`` over the ranks (what the history records).
        over: the ranks whose ``fits`` exceeded the capacity.
        long_shapes: the ranks whose shape has more dims than the header carries.
        reason: why redo, or the error message.
    """

    outcome: Outcome
    headers: tuple[Header, ...]
    capacity: Optional[int]
    largest: int
    over: tuple[int, ...] = ()
    long_shapes: tuple[int, ...] = ()
    reason: str = ""
    layouts_agree: bool = True

    @property
    def held(self) -> bool:
        """The data can be used as it is."""
        return self.outcome is Outcome.HELD

    @property
    def tail_width(self) -> int:
        """Bytes per rank the redo must move: the part over the capacity, rounded up to 64."""
        if self.capacity is None or not self.over:
            return 0
        return _padded(self.largest - self.capacity)

    def error(self) -> CollectiveArgumentError:
        """The error every rank raises (a ``TypeError`` and a ``ValueError``, as the explicit exchange's)."""
        return CollectiveArgumentError(self.reason)

    def raise_if_error(self) -> None:
        """Raise [`error`][hwdist.collectives._sizes.Verdict.error] when the outcome is ERROR."""
        if self.outcome is Outcome.ERROR:
            raise self.error()


def _listing(values: Sequence[Any]) -> str:
    return ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))


def verdict(
    fn: str,
    headers: Sequence[Header],
    capacity: Optional[int],
    *,
    same_dtype: bool = True,
    same_ndim: bool = False,
    same_layout: bool = False,
) -> Verdict:
    """What every rank concludes from every rank's headers (a pure function: same input, same answer).

    Args:
        fn: the public op's name (starts the error message).
        headers: every rank's header, in group-rank order.
        capacity: the capacity the call used, or None for an explicit (headers-only) exchange.
        same_dtype: different dtypes are an error (every tensor op).
        same_ndim: different ndims are an error (ops whose output stacks the pieces).
        same_layout: different layout fingerprints make the call redo through the explicit path
            (which raises the op's own error if they really differ).

    Returns:
        A [`Verdict`][hwdist.collectives._sizes.Verdict].
    """
    hs = tuple(headers)
    largest = max((h.fits for h in hs), default=0)
    layouts_agree = len({h.layout for h in hs}) <= 1

    def made(outcome: Outcome, reason: str = "", **kw: Any) -> Verdict:
        return Verdict(outcome, hs, capacity, largest, reason=reason, layouts_agree=layouts_agree, **kw)

    if same_dtype and len({h.dtype for h in hs}) > 1:
        return made(Outcome.ERROR, f"{fn}: every rank must pass the same dtype; got "
                    + _listing([dtype_name(h.dtype) for h in hs]))
    if same_ndim and len({h.ndim for h in hs}) > 1:
        return made(Outcome.ERROR, f"{fn}: every rank must pass a tensor with the same number of dims; got "
                    + _listing([h.ndim for h in hs]))
    long_shapes = tuple(r for r, h in enumerate(hs) if h.ndim > HEADER_DIMS)
    over = () if capacity is None else tuple(r for r, h in enumerate(hs) if h.fits > capacity)
    reasons = []
    if over:
        reasons.append(f"{_listing_over(hs, over)} over the predicted {capacity} bytes")
    if long_shapes:
        reasons.append(f"rank(s) {', '.join(map(str, long_shapes))} have more than {HEADER_DIMS} dims")
    if same_layout and not layouts_agree:
        reasons.append("the layouts differ: " + _listing([f"{h.layout:#x}" for h in hs]))
    if reasons:
        return made(Outcome.REDO, "; ".join(reasons), over=over, long_shapes=long_shapes)
    return made(Outcome.HELD)


def _listing_over(hs: Sequence[Header], over: Sequence[int]) -> str:
    return ", ".join(f"rank {r} ({hs[r].fits} bytes)" for r in over)


class SizeHistory:
    """One (group, op, key)'s history of agreed sizes: predicts the next capacity, adapts on misses.

    Every rank holds an identical copy, because [`record`][hwdist.collectives._sizes.SizeHistory.record]
    only takes a verdict built from every rank's headers. The rules are in the module docstring.

    Attributes:
        sizes: the largest size of each of the last ``HISTORY_LEN`` agreed calls.
        hits, redos, explicit: counts of calls whose prediction held, missed, or that had none.
    """

    def __init__(self) -> None:
        self.sizes: deque[int] = deque(maxlen=HISTORY_LEN)
        self.misses = 0
        self.backoff = BACKOFF_START
        self.skip = 0
        self.hits = self.redos = self.explicit = 0

    def expected(self) -> Optional[int]:
        """The size the history expects for the next call (before bucketing), or None without history."""
        sizes = self.sizes
        if len(sizes) > 1 and sizes[-1] == sizes[-2]:  # the steady state (period 1), without a copy
            return sizes[-1]
        s = list(sizes)
        if not s:
            return None
        for p in _PERIODS:
            if len(s) >= 2 * p and all(s[-i] == s[-i - p] for i in range(1, p + 1)):
                return s[-p]
        last = s[-1]
        growth = last - s[-2] if len(s) > 1 else 0
        return min(last + max(growth, 0), 2 * max(last, 1))

    def predict(self, limit: int = PREDICT_MAX_BYTES) -> Optional[int]:
        """The capacity for the next call, or None: exchange explicitly (no history, backing off, too big).

        Call exactly once per call on every rank (it has no side effects; ``record`` moves the state).
        """
        if self.skip > 0:
            return None
        want = self.expected()
        if want is None:
            return None
        cap = capacity_for(want)  # under 12.5 % over ``want``: the 2x bound holds with room
        return cap if cap <= limit else None

    def record(self, v: Verdict) -> None:
        """Move the history by one call's verdict (call it on every rank, for every call, before raising)."""
        if v.outcome is Outcome.ERROR:
            return
        self.sizes.append(v.largest)
        if v.capacity is None:
            self.explicit += 1
            self.skip = max(self.skip - 1, 0)
        elif v.held:
            self.hits += 1
            self.misses = 0
            self.backoff = BACKOFF_START
        else:
            self.redos += 1
            self.misses += 1
            if self.misses >= 2:
                self.skip, self.misses = self.backoff, 0
                self.backoff = min(2 * self.backoff, BACKOFF_MAX)

    def __repr__(self) -> str:
        return (f"SizeHistory(sizes={list(self.sizes)}, hits={self.hits}, redos={self.redos},"
                f" explicit={self.explicit}, skip={self.skip})")


def history(group: Any, op: str, key: tuple[Any, ...] = ()) -> SizeHistory:
    """The [`SizeHistory`][hwdist.collectives._sizes.SizeHistory] of ``(op, key)`` in ``group``'s state."""
    table: dict[tuple[Any, ...], SizeHistory] = _state.of(group).sizes
    full = (op,) + tuple(key)
    hist = table.get(full)
    if hist is None:
        hist = table[full] = SizeHistory()
    return hist


def route(capacity: Optional[int], in_band_max: int = IN_BAND_MAX_BYTES) -> str:
    """How a call with this predicted ``capacity`` moves its header (the same answer on every rank).

    Returns:
        ``'explicit'`` (no prediction: headers first, then exactly the data), ``'in_band'``
        (header and payload in one slot, one collective) or ``'beside'`` (the header's own small
        collective issued together with the data's, no staging copy).
    """
    if capacity is None:
        return "explicit"
    return "in_band" if capacity <= in_band_max else "beside"


# ---------------------------------------------------------------------------
# the protocol over the transport: the reference the engine's all_gather follows
# ---------------------------------------------------------------------------
def _as_bytes(t: Tensor) -> Tensor:
    return byte_view(t.detach().cpu())


def _pad(b: Tensor, width: int) -> Tensor:
    out = torch.zeros(max(width, GRANULE), dtype=torch.uint8)
    out[: b.numel()] = b
    return out


def gather(
    tensor: Tensor,
    group: Any = None,
    *,
    op: str = "all_gather",
    key: tuple[Any, ...] = (),
    driver: Any = None,
    limit: int = PREDICT_MAX_BYTES,
) -> list[Tensor]:
    """Every rank's ``tensor`` (any shapes, one dtype), with sizes agreed by prediction.

    The reference use of this module over the transport (``gather_equal``): one
    collective when the prediction holds, two otherwise, never more than the
    explicit exchange. Raises on every rank when the dtypes differ.

    Returns:
        One CPU tensor per group rank, in group-rank order.
    """
    hist = history(group, op, key)
    cap = hist.predict(limit)
    data = _as_bytes(tensor)
    head = Header.of(tensor)
    if cap is None:  # explicit: headers, then exactly the bytes needed
        headers = [unpack(r) for r in transport.gather_equal(pack(head), group, driver)]
        v = verdict(op, headers, None)
        hist.record(v)
        v.raise_if_error()
        rows = transport.gather_equal(_pad(data, _padded(v.largest)), group, driver)
        payloads = [row[: h.nbytes] for row, h in zip(rows, headers)]
    else:
        headers, payloads = unframe(transport.gather_equal(frame(data, head, cap), group, driver))
        v = verdict(op, headers, cap)
        hist.record(v)
        v.raise_if_error()
        if v.over:  # every rank sends what was over the capacity (or nothing), the same width everywhere
            tails = transport.gather_equal(_pad(data[cap:], v.tail_width), group, driver)
            payloads = [
                torch.cat([p, tails[r][: h.nbytes - cap]]) if r in v.over else p
                for r, (p, h) in enumerate(zip(payloads, headers))
            ]
    shapes: list[Optional[torch.Size]] = [h.shape for h in headers]
    if v.long_shapes:  # rare: a shape longer than the header; every rank knows it from the headers
        width = max(h.ndim for h in headers)
        dims = list(tensor.shape) + [0] * width
        rows2 = transport.gather_ints(dims[:width], group, driver)
        shapes = [torch.Size(rows2[r][: h.ndim]) for r, h in enumerate(headers)]
    dtype = tensor.dtype
    out = []
    for p, s in zip(payloads, shapes):
        assert s is not None
        buf = p.clone().view(dtype) if p.numel() else torch.empty(0, dtype=dtype)
        out.append(buf.reshape(s))
    return out
