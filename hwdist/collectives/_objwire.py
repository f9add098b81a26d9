"""The object collectives' wire: one record per rank, the group's byte exchanges and failure notices.

A record is the one header of ``collectives.protocol`` (1 KiB, fixed):
status, payload size, chunk count, root, opcode, token, the verified call's
fingerprint and, up to ``INLINE_BYTES``, the payload or a failure's message.
[`Link`][hwdist.collectives._objwire.Link] is one call's group: rank mapping,
byte exchanges through ``protocol`` and failure notices on the group's store,
so that a rank left waiting raises [`PeerFailure`][hwdist.errors.PeerFailure]
instead of waiting for the process-group timeout. docs/objects.md.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import _compat
from ..errors import ArgumentAssertionError, CollectiveArgumentError, ObjectCollectiveError, PeerFailure
from ..errors import PlanError, SerializationError, WeightsOnlyRefused
from .. import serialization as _ser
from ..serialization import weights_only as _weights_only
from . import protocol, verify
from .engine import view
from ..serialization import Frame, MapLocation, PickleSerializer, Serializer

__all__ = [
    "OK", "SERIALIZE", "ARGUMENT", "ASSERTED", "REFUSED", "IO", "OTHER", "LocalFailure", "arg_error",
    "RECORD_BYTES", "INLINE_BYTES", "OPS", "OP_NAMES", "Record", "make_record",
    "failure_record", "payload_record", "parse_rows", "raise_failures",
    "NOTICE_KEY", "Link", "check_root", "world_size",
    "describe", "serialize", "decode", "may_refuse", "Decoder", "CONFIRM", "closing_status",
]  # fmt: skip

# ---- statuses and local failures ---------------------------------------------------------------

#: Statuses: fine, could not serialize, invalid arguments, filesystem, anything else.
OK, SERIALIZE, ARGUMENT, IO, OTHER = 0, 1, 2, 3, 4
ASSERTED = 5  # an argument mmengine checks with assert: an ArgumentAssertionError on every rank
REFUSED = 6  # weights_only=True refused a rank's own object: a WeightsOnlyRefused on every rank
ERRORS: dict[int, type[ObjectCollectiveError]] = {
    REFUSED: WeightsOnlyRefused, SERIALIZE: SerializationError, ARGUMENT: CollectiveArgumentError,
    ASSERTED: ArgumentAssertionError, IO: ObjectCollectiveError, OTHER: ObjectCollectiveError,
}  # fmt: skip


class LocalFailure(Exception):
    """A failure on this rank (``kind``: its status), reported to every rank in the next record exchange."""

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def arg_error(message: str) -> LocalFailure:
    """An ``ARGUMENT`` failure."""
    return LocalFailure(ARGUMENT, message)


# ---- the record: the one header format (protocol) -------------------------------------------------

#: Bytes per rank in the record exchange: one header.
RECORD_BYTES = protocol.HEADER_BYTES
#: The largest payload a record carries inline.
INLINE_BYTES = protocol.INLINE_BYTES

#: The opcode of each collective that exchanges records (records of different calls never match).
OPS = {name: protocol.OPS[name] for name in (
    "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
    "collect_results", "collect_results(tmpdir)", "create_tmpdir",
)}  # fmt: skip
OP_NAMES = {v: k for k, v in OPS.items()}
#: One rank's record: a protocol header (``nbytes``: the payload's size; ``inline``: the payload or a
#: failure's message when it fits; ``op``: the opcode).
Record = protocol.Header


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
    """One record's bytes (``RECORD_BYTES``, uint8); a failed status carries ``message`` inline."""
    if status != OK:
        inline = np.frombuffer(message.encode("utf-8", "replace")[:INLINE_BYTES], dtype=np.uint8)
    head = protocol.Header(
        status=status, op=opcode, root=root, nbytes=total, nchunks=nchunks, token=token, inline=inline
    )
    return protocol.encode(head)


def failure_record(opcode: int, failure: LocalFailure, root: int = -1) -> np.ndarray:
    """The record reporting ``failure``."""
    return make_record(opcode, status=failure.kind, root=root, message=str(failure))


def payload_record(
    opcode: int, frame: Frame, root: int = -1, token: int = 0
) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The record of ``frame`` (written straight into it when it fits) and the frame's bytes otherwise."""
    n = frame.nbytes
    if n <= INLINE_BYTES:
        rec = make_record(opcode, total=n, root=root, token=token)
        frame.write_into(protocol.set_inline_length(rec, n))
        return rec, None
    return make_record(opcode, total=n, root=root, token=token), frame.to_numpy()


parse_rows = protocol.parse_rows


def raise_failures(records: Sequence[Record], what: str, opcode: int, root: int) -> None:
    """Raise, the same on every rank, when a record failed or the records are of different calls.

    Raises:
        ObjectCollectiveError: of the failed record's kind, naming every failed rank and its message.
        CollectiveArgumentError: the ranks called different collectives or gave different roots.
    """
    if not all(rec.framed for rec in records):  # its fields are not a record's: name no status or opcode
        calls = ", ".join(
            f"rank {rec.rank}: {OP_NAMES.get(rec.op, rec.op) if rec.framed else 'another collective'}"
            for rec in records
        )
        raise CollectiveArgumentError(f"{what}: ranks called different object collectives ({calls})")
    failed = [rec for rec in records if rec.status != OK]
    if failed:
        detail = "; ".join(f"rank {rec.rank}: {rec.message}" for rec in failed)
        ranks = ", ".join(str(rec.rank) for rec in failed)
        cls = ERRORS.get(failed[0].status, ObjectCollectiveError)
        raise cls(f"{what} failed on rank(s) {ranks}: {detail}", {rec.rank: rec.message for rec in failed})
    if len({rec.op for rec in records}) > 1 or records[0].op != opcode:
        calls = ", ".join(f"rank {rec.rank}: {OP_NAMES.get(rec.op, rec.op)}" for rec in records)
        raise CollectiveArgumentError(f"{what}: ranks called different object collectives ({calls})")
    if len({rec.root for rec in records}) > 1:
        calls = ", ".join(f"rank {rec.rank}: {rec.root}" for rec in records)
        raise CollectiveArgumentError(f"{what}: ranks disagree on the source/destination rank ({calls})")


# ---- the group: ranks, exchanges, failure notices ------------------------------------------------

#: The store key of a group's failure notice: ``"<group rank>|<reason>"``.
NOTICE_KEY = "hwdist/object-collective-failure"
_FIRST, _MOST = 0.05, 0.5  # a slow step looks for a notice after 50 ms, then twice as long each time...


class _NoticeSeen(Exception):
    def __init__(self, rank: str, reason: str, waited: float) -> None:
        super().__init__(f"rank {rank}: {reason}")
        self.rank, self.reason, self.waited = rank, reason, waited


def world_size(group: Any) -> int:
    """The group's size; 1 outside a process group."""
    return int(view(group).size)


class Link:
    """One call's group: its view (size, driver), ranks, byte exchanges and failure notices."""

    def __init__(self, group: Any) -> None:
        v = view(group)
        self.group = group
        self.driver = v.target(None)[0]
        self.world = int(v.size)
        self._ranks: Optional[list[int]] = v.ranks()  # None: the default group (group rank = global rank)
        self.rank = v.rank if self._ranks is None else self.group_rank(v.rank)
        self._sliced: Optional[bool] = None
        self._store: Any = None  # the group's store, on first use; False: none
        #: (op name, stamp) of a verified call, until its first record exchange carries it
        self._pending: Optional[tuple[str, verify.Stamp]] = None

    def verify(self, op: str, fields: dict[str, Any]) -> None:
        """Verify this call (while verification is on) in its first record exchange, all-gathered."""
        st = verify.stamp(op, self.group, fields)
        self._pending = None if st is None else (op, st)

    def global_rank(self, group_rank: int) -> int:
        """The global rank of ``group_rank``."""
        return group_rank if self._ranks is None else self._ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        """The group rank of ``global_rank`` (-1 if not a member)."""
        if self._ranks is None:
            return global_rank if 0 <= global_rank < self.world else -1
        return self._ranks.index(global_rank) if global_rank in self._ranks else -1

    def has(self, op: str) -> bool:
        """Whether the driver can move bytes for ``op`` (natively or emulated)."""
        return protocol.carries(self.driver, op)

    def all_gather(self, data: np.ndarray) -> np.ndarray:
        """All-gather ``data`` (uint8, the same size on every rank) -> array of shape (world, n)."""
        return self._call(protocol.gather_rows, data)

    def gather(self, data: np.ndarray, root: int) -> Optional[list[np.ndarray]]:
        """Gather ``data`` (uint8, equal sizes) on group rank ``root`` (None elsewhere); where ``gathers``."""
        return self._call(protocol.gather_rows_to, data, self.global_rank(root))

    @property
    def gathers(self) -> bool:
        """Whether the driver issues gather itself (a gather to one rank moves each payload once)."""
        return protocol.gathers(self.driver)

    def broadcast(self, data: Optional[np.ndarray], n: int, src: int) -> np.ndarray:
        """Broadcast ``n`` bytes from group rank ``src``; ``data`` is used on ``src`` only."""
        mine = data if self.rank == src else None
        return self._call(protocol.broadcast_sized, mine, n, self.global_rank(src))

    def send(self, data: np.ndarray, dst: int) -> None:
        """Send ``data`` to group rank ``dst``."""
        self._call(protocol.send_bytes, data, self.global_rank(dst))

    def recv(self, n: int, src: int) -> np.ndarray:
        """Receive ``n`` bytes from group rank ``src``."""
        return self._call(protocol.recv_bytes, n, self.global_rank(src))

    @property
    def verifying(self) -> bool:
        """Whether this call is verified and its first record exchange has not run yet."""
        return self._pending is not None

    def _gathered(self, record: np.ndarray) -> list[Record]:
        """Every rank's record (one all_gather), verified first when this call is."""
        pending, self._pending = self._pending, None
        if pending is None:
            return parse_rows(self.all_gather(record))
        op, st = pending
        stamped = protocol.stamp(record, protocol.op_code(op), st.seq, st.fingerprint, st.site)
        records = parse_rows(self.all_gather(stamped))
        verify.raise_if_mismatch(op, records, st, self.group, self.driver)
        return records

    def exchange(self, record: np.ndarray, what: str, opcode: int, root: int = -1) -> list[Record]:
        """All-gather every rank's record; raise the same error on every rank if any rank failed."""
        records = self._gathered(record)
        raise_failures(records, what, opcode, root)
        return records

    def receive_record(self, record: Optional[np.ndarray], root: int, what: str = "", opcode: int = 0
                       ) -> Record:  # fmt: skip
        """Group rank ``root``'s record on every rank, unchecked: one broadcast, or verified, an all_gather
        (any rank's own failing ``record`` then raises on every rank, as ``what`` with ``opcode``)."""
        if self._pending is not None:
            mine = record if record is not None else make_record(opcode, root=root)
            records = self._gathered(mine)
            if any(r.status != OK for r in records):
                raise_failures(records, what, opcode, root)
            return records[root]
        return protocol.decode(self.broadcast(record, RECORD_BYTES, root), root)

    def broadcast_record(self, record: Optional[np.ndarray], what: str, opcode: int, root: int) -> Record:
        """Group rank ``root``'s record on every rank (``record`` matters there only); raises its failure."""
        rec = self.receive_record(record, root, what, opcode)
        raise_failures([rec], what, opcode, root)
        return rec

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One transport exchange; a failure here is posted for the other ranks."""
        try:
            return fn(*args, self.group, self.driver, self._wait)
        except _NoticeSeen as seen:
            raise PeerFailure(
                f"an object collective failed on rank {seen.rank} of this group while rank {self.rank}"
                f" waited for it ({seen.waited:.1f} s): {seen.reason}. Rank {self.rank} stops waiting instead"
                " of waiting for the process-group timeout; the group cannot be used for object collectives"
                " any more",
                {int(seen.rank) if seen.rank.isdigit() else -1: seen.reason},
            ) from None
        except BaseException as exc:
            if not isinstance(exc, PlanError):  # the same on every rank: nobody is left waiting
                self.post_failure(f"{type(exc).__name__}: {exc}")
            raise

    def _store_or_false(self) -> Any:
        if self._store is None:
            self._store = _compat.group_store(self.group) or False
        return self._store

    def post_failure(self, reason: str) -> None:
        """Tell the group's other ranks that this rank left an object collective in the middle."""
        store = self._store_or_false()
        if store is not False:
            try:
                store.set(NOTICE_KEY, f"{self.rank}|{reason[:2000]}")
            except Exception:
                pass  # the store is gone too: the others see the broken connections instead

    def _check_notice(self, waited: float) -> None:
        store = self._store_or_false()
        if store is False:
            return
        try:
            if not store.check([NOTICE_KEY]):
                return
            who, _, why = store.get(NOTICE_KEY).decode("utf-8", "replace").partition("|")
        except Exception:
            return
        raise _NoticeSeen(who, why, waited)

    def _wait(self, work: Any, p2p: bool) -> None:
        """Wait for ``work``; between slices of a slow wait look for a notice (on the CPU only)."""
        if work is None:
            return
        if self._sliced is None:
            self._sliced = self.driver.comm_device().type == "cpu"
        if not self._sliced:
            work.wait()
            return
        start, step = time.monotonic(), _FIRST
        if p2p:  # in a helper thread: gloo closes the pair of a p2p wait that times out
            done = threading.Event()
            failure: list[BaseException] = []

            def run() -> None:
                try:
                    work.wait()
                except BaseException as exc:  # noqa: BLE001 (handed to the caller)
                    failure.append(exc)
                done.set()

            threading.Thread(target=run, name="hwdist-p2p-wait", daemon=True).start()
            while not done.wait(step):
                self._check_notice(time.monotonic() - start)
                step = min(2 * step, _MOST)
            if failure:
                raise failure[0]
            return
        while True:
            try:
                work.wait(timeout=datetime.timedelta(seconds=step))
                return
            except TypeError:  # a Python Work whose wait() takes no timeout: wait without slices
                work.wait()
                return
            except RuntimeError:
                if work.is_completed():  # it failed (not the slice's timeout): raise its own error
                    work.wait()
                    return
            self._check_notice(time.monotonic() - start)
            step = min(2 * step, _MOST)


def check_root(link: Link, root: Any, name: str) -> int:
    """The group rank of global rank ``root``; raises a ``LocalFailure`` when it is bad."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise arg_error(f"{name} must be an int rank, got {type(root).__name__}: {root!r}")
    grank = link.group_rank(int(root))
    if grank < 0:
        raise arg_error(f"{name}={root} is not a rank of the group (group size {link.world})")
    return grank


# ---- encoding and decoding ---------------------------------------------------------------------


def _locate(
    obj: Any, serializer: Optional[Serializer], path: str, depth: int, parent: Any = None
) -> tuple[str, Any, Any]:
    """The innermost part of ``obj`` that fails to serialize, and its container (failure path only)."""
    if depth <= 0:
        return path, obj, parent
    if isinstance(obj, dict):
        children: Any = ((f"{path}[{k!r}]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    elif hasattr(obj, "__dict__") and isinstance(vars(obj), dict):
        children = ((f"{path}.{k}", v) for k, v in vars(obj).items())
    else:
        return path, obj, parent
    for where, child in children:
        try:
            _ser.encode(child, serializer)
        except Exception:
            return _locate(child, serializer, where, depth - 1, obj)
    return path, obj, parent


def describe(exc: BaseException, obj: Any, serializer: Optional[Serializer], name: str = "its object") -> str:
    """Why ``obj`` could not be serialized, naming its innermost failing part (failure path only)."""
    where, culprit, parent = _locate(obj, serializer, "", 6)
    inner = ""
    if where:
        inner = f"; the failing part is {name}{where} of type '{type(culprit).__qualname__}'"
        if parent is not None and parent is not obj:
            inner += f" inside a '{type(parent).__qualname__}'"
    return (
        f"could not serialize {name} of type '{type(obj).__qualname__}'{inner}: {type(exc).__name__}: {exc}"
    )


def serialize(obj: Any, serializer: Optional[Serializer], name: str = "its object") -> Frame:
    """``obj``'s frame; raises a ``SERIALIZE`` ``LocalFailure`` describing the failing part.

    A ``serializer`` that is not one is an ``ARGUMENT`` failure (no part of ``obj`` is to blame).
    """
    if serializer is not None and not isinstance(serializer, Serializer):
        raise arg_error(f"serializer must be a hwdist Serializer or None, got {type(serializer).__name__}")
    try:
        frame = _ser.encode(obj, serializer)
    except Exception as exc:
        raise LocalFailure(SERIALIZE, describe(exc, obj, serializer, name)) from exc
    refused = _weights_only.check_own(frame, serializer)  # weights_only=True: fail here, on every rank
    if refused is not None:
        raise LocalFailure(REFUSED, f"{name} of type '{type(obj).__qualname__}' is refused: {refused}")
    return frame


def decode(data: np.ndarray, serializer: Optional[Serializer], map_location: MapLocation) -> Any:
    """The object in one received frame (a read-only buffer is copied first)."""
    if not data.flags.writeable:
        data = data.copy()
    return _ser.decode(data, 0, serializer, map_location)


def may_refuse(serializer: Optional[Serializer]) -> bool:
    """Whether decoding with ``serializer`` may refuse a peer's payload (anything but plain pickle)."""
    return type(serializer if serializer is not None else _ser.get_serializer()) is not PickleSerializer


class Decoder:
    """Decodes received payloads, keeping the first failure (raised after the collective's last exchange,
    so that no sender is left waiting; see [`closing_status`][hwdist.collectives._objwire.closing_status])."""

    def __init__(self, serializer: Optional[Serializer], map_location: MapLocation, link: Link) -> None:
        self.serializer = serializer
        self.map_location = map_location
        self.link = link
        self.error: Optional[BaseException] = None
        self.message = ""

    def __call__(self, rank: int, data: np.ndarray) -> Any:
        if self.error is not None:
            return None  # drained, not decoded
        try:
            return decode(data, self.serializer, self.map_location)
        except Exception as exc:
            self.error = exc
            self.message = f"could not decode the object from rank {rank}: {type(exc).__name__}: {exc}"
            return None
        except BaseException as exc:  # KeyboardInterrupt & co.: this rank leaves now; tell the others
            self.link.post_failure(f"{type(exc).__name__} while decoding the object from rank {rank}")
            raise


#: Set in the root's record ``token`` when the root will send a closing status
#: (see [`closing_status`][hwdist.collectives._objwire.closing_status]).
CONFIRM = 1


def closing_status(
    link: Link, records: Sequence[Record], root: int, decoder: Decoder, what: str, op: int, moved: bool
) -> None:
    """The root's decode failure, raised on every rank (the root raises the original error).

    The root broadcasts its status when a payload ``moved`` to it after the records (a sender may wait
    on it) or when it set ``CONFIRM`` (its serializer may refuse); otherwise only the root raises.
    """
    if moved or records[root].token & CONFIRM:
        if link.rank == root:
            failed = decoder.error is not None
            rec = failure_record(op, LocalFailure(OTHER, decoder.message), root) if failed else None
            link.receive_record(rec if rec is not None else make_record(op, root=root), root)
        else:
            link.broadcast_record(None, what, op, root)
    if decoder.error is not None:
        raise decoder.error
