"""Object collectives with mmengine.dist's names, on any backend.

Every call resolves its driver with ``registry.resolve(group)`` and then takes
one of two paths, the same on every rank:

* **portable** (default): serialize once (`serialization`), then one
  fixed-size *record* exchange (an all_gather of 1 KiB per rank) that carries
  each rank's status, payload size and, for small payloads, the payload
  itself. If any rank failed to serialize or passed a bad argument, every
  rank raises the same clear error right there, instead of hanging in the
  next collective. ``broadcast_object_list`` instead broadcasts ``src``'s
  record alone (only ``src`` can fail there; see its docstring), one
  collective for a small object where torch uses two. Larger payloads then move as exact-size byte tensors on
  ``driver.comm_device()`` (broadcast per rank, point-to-point to a gather
  root, or a padded all_gather when that is cheaper), in the byte dtype the
  driver's plan allows. Tensors inside received objects land on CPU or the
  ``map_location`` given.
* **native**: torch's own ``all_gather_object`` & co. Used only when asked
  ([`set_object_path`][hwdist.collectives.objects.set_object_path] ``('native')``), when the driver declares
  ``native_object_collectives`` and the torch version has them
  (``_compat.HAS_OBJECT_COLLECTIVES``), and the call uses the default pickle
  serializer without ``map_location``; otherwise the portable path runs. The
  portable path is the default because it measured faster on every size
  (see ``docs/objects.md``).

Verification mode ([`hwdist.verify`][hwdist.verify]): the record exchange checks the
call's identity (which collective, its src/dst) in every mode, so those
disagreements raise [`CollectiveArgumentError`][hwdist.collectives.objects.CollectiveArgumentError] on every rank even when
the mode is off (``broadcast_object_list``: only with the mode on). When the mode is on, each object collective also takes part
in the mode's per-group digest exchange (op name, call number, src/dst) before
its record exchange: a 1 KiB record exchange must never meet a tensor
collective's 24-byte digest exchange on another rank, so every verified
collective, tensor or object, starts with the same exchange.

Outside a process group every function behaves as mmengine's does.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as torch_dist

from .. import _compat, registry
from .. import verify as _verify
from ..drivers.base import PlanError, byte_carrier
from ..info import is_distributed
from . import _notices
from . import serialization as _ser
from .serialization import (
    Frame,
    MapLocation,
    PickleSerializer,
    RestrictedPickleSerializer,
    RestrictedUnpickler,
    Serializer,
    UnpicklingRefused,
    get_serializer,
    obj2tensor,
    object_to_tensor,
    register_safe_class,
    restricted_loads,
    safe_globals,
    set_serializer,
    tensor2obj,
    tensor_to_object,
    use_serializer,
)

__all__ = [
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "broadcast_object",
    "scatter_object_list",
    "object_to_tensor",
    "tensor_to_object",
    "obj2tensor",
    "tensor2obj",
    "ObjectCollectiveError",
    "SerializationError",
    "CollectiveArgumentError",
    "PeerFailure",
    "set_object_path",
    "get_object_path",
    "object_path",
    "Serializer",
    "PickleSerializer",
    "RestrictedPickleSerializer",
    "RestrictedUnpickler",
    "UnpicklingRefused",
    "get_serializer",
    "set_serializer",
    "use_serializer",
    "register_safe_class",
    "safe_globals",
    "restricted_loads",
]

# ---- errors --------------------------------------------------------------------------------


from ..errors import ArgumentAssertionError, CollectiveArgumentError, ObjectCollectiveError, PeerFailure, SerializationError  # noqa: E402,E501



_OK, _SERIALIZE, _ARGUMENT, _IO, _OTHER = 0, 1, 2, 3, 4
_ASSERTED = 5  # an argument mmengine checks with assert: an ArgumentAssertionError on every rank
_ERRORS: dict[int, type[ObjectCollectiveError]] = {
    _SERIALIZE: SerializationError,
    _ARGUMENT: CollectiveArgumentError,
    _ASSERTED: ArgumentAssertionError,
    _IO: ObjectCollectiveError,
    _OTHER: ObjectCollectiveError,
}


class _LocalFailure(Exception):
    """A failure on this rank, to be reported to every rank in the next record exchange."""

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _arg_error(message: str) -> _LocalFailure:
    return _LocalFailure(_ARGUMENT, message)


# ---- path selection ----------------------------------------------------------------------

_PATHS = ("portable", "native")


def _initial_path() -> str:
    value = os.environ.get("HWDIST_OBJECT_PATH", "").strip().lower() or "portable"
    if value not in _PATHS:
        raise ValueError(f"HWDIST_OBJECT_PATH must be one of {', '.join(_PATHS)}, got {value!r}")
    return value


_path: Optional[str] = None


def get_object_path() -> str:
    """``'portable'`` (default) or ``'native'``: which implementation object collectives prefer."""
    global _path
    if _path is None:
        _path = _initial_path()
    return _path


def set_object_path(path: str) -> str:
    """Prefer ``'portable'`` or ``'native'`` (torch's own, where the driver allows); returns the previous value.

    The choice must be the same on every rank. ``HWDIST_OBJECT_PATH`` sets the initial value.
    """
    global _path
    if path not in _PATHS:
        raise ValueError(f"object path must be one of {', '.join(_PATHS)}, got {path!r}")
    previous = get_object_path()
    _path = path
    return previous


@contextlib.contextmanager
def object_path(path: str) -> Iterator[str]:
    """Context manager: prefer ``path`` (``'portable'`` or ``'native'``) inside the block."""
    previous = set_object_path(path)
    try:
        yield path
    finally:
        set_object_path(previous)


def _native(driver: Any, map_location: MapLocation, serializer: Optional[Serializer]) -> bool:
    return (
        get_object_path() == "native"
        and bool(getattr(driver, "native_object_collectives", False))
        and _compat.HAS_OBJECT_COLLECTIVES
        and map_location is None
        and _ser.is_default_serializer(serializer)
    )


# ---- wire ------------------------------------------------------------------------------------

#: Bytes per rank in the record exchange (64-byte header + inline payload).
RECORD_BYTES = 1024
_HEAD = 8  # int64 fields: magic, status, total, nchunks, root, opcode, token, inline_len
INLINE_BYTES = RECORD_BYTES - 8 * _HEAD
_REC_MAGIC = int.from_bytes(b"HWDREC01", "little")
#: Above this many bytes in all, an all_gather moves each rank's payload by broadcast
#: (exact sizes) instead of one padded all_gather.
PADDED_ALL_GATHER_LIMIT = 1 << 20

_OPS = {
    "all_gather_object": 1,
    "gather_object": 2,
    "broadcast_object_list": 3,
    "scatter_object_list": 4,
    "collect_results": 5,
    "collect_results(tmpdir)": 6,
    "create_tmpdir": 7,
}
_OP_NAMES = {v: k for k, v in _OPS.items()}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class Record:
    """One rank's entry of the record exchange."""

    __slots__ = ("rank", "status", "total", "nchunks", "root", "opcode", "token", "inline")

    def __init__(self, rank: int, head: Sequence[int], inline: Optional[np.ndarray]) -> None:
        self.rank = rank
        _, self.status, self.total, self.nchunks, self.root, self.opcode, self.token, _ = (int(x) for x in head)
        self.inline = inline

    @property
    def message(self) -> str:
        """The failure text carried inline."""
        return bytes(self.inline).decode("utf-8", "replace") if self.inline is not None else ""


def _make_record(
    opcode: int,
    *,
    status: int = _OK,
    total: int = 0,
    nchunks: int = 0,
    root: int = -1,
    token: int = 0,
    inline: Optional[np.ndarray] = None,
    message: str = "",
) -> np.ndarray:
    rec = np.zeros(RECORD_BYTES, dtype=np.uint8)
    if status != _OK:
        raw = message.encode("utf-8", "replace")[:INLINE_BYTES]
        inline = np.frombuffer(raw, dtype=np.uint8)
    n = 0 if inline is None else int(inline.size)
    head = np.array([_REC_MAGIC, status, total, nchunks, root, opcode, token, n], dtype="<i8")
    rec[: 8 * _HEAD] = head.view(np.uint8)
    if n:
        rec[8 * _HEAD : 8 * _HEAD + n] = inline
    return rec


class _Comm:
    """A group's driver, ranks and byte transport (everything in the driver's planned byte dtype)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.driver = registry.resolve(group)
        self.world = torch_dist.get_world_size(group)
        self.rank = torch_dist.get_rank(group)
        self._device: Optional[torch.device] = None
        self._ranks: Optional[list[int]] = None
        self._board: Optional[_notices.Board] = None

    @property
    def device(self) -> torch.device:
        """The communication device."""
        if self._device is None:
            self._device = self.driver.comm_device()
        return self._device

    def global_rank(self, group_rank: int) -> int:
        """The global rank of ``group_rank``."""
        if self.group is None or self.group is _compat.default_group():
            return group_rank
        if self._ranks is None:
            self._ranks = list(torch_dist.get_process_group_ranks(self.group))
        return self._ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        """The group rank of ``global_rank`` (-1 if not a member)."""
        if self.group is None or self.group is _compat.default_group():
            return global_rank if 0 <= global_rank < self.world else -1
        if self._ranks is None:
            self._ranks = list(torch_dist.get_process_group_ranks(self.group))
        try:
            return self._ranks.index(global_rank)
        except ValueError:
            return -1

    def has(self, op: str) -> bool:
        """Whether the driver can run ``op`` on bytes (natively or emulated)."""
        try:
            self._carrier(op)
        except PlanError:
            return False
        return True

    def _carrier(self, op: str) -> torch.dtype:
        # The smallest integer dtype the driver moves for ``op``; bytes are padded to its size.
        return byte_carrier(self.driver, op)

    def _wire(self, t: torch.Tensor, op: str) -> torch.Tensor:
        carrier = self._carrier(op)
        if carrier != torch.uint8:
            pad = -t.numel() % _itemsize(carrier)
            if pad:
                t = torch.cat([t, t.new_zeros(pad)])
            t = t.view(carrier)
        if t.device != self.device:
            t = t.to(self.device)
        return t

    def _padded(self, n: int, op: str) -> int:
        k = _itemsize(self._carrier(op))
        return -(-n // k) * k

    def _empty(self, n: int, op: str) -> torch.Tensor:
        dtype = self._carrier(op)
        return torch.empty(self._padded(n, op) // _itemsize(dtype), dtype=dtype, device=self.device)

    @staticmethod
    def _host(t: torch.Tensor, n: int) -> np.ndarray:
        host = t.view(torch.uint8).cpu().numpy() if t.dtype != torch.uint8 else t.cpu().numpy()
        return host if host.size == n else host[:n]

    def all_gather(self, data: np.ndarray) -> np.ndarray:
        """All-gather ``data`` (uint8) -> array of shape (world, n)."""
        n = data.size
        inp = self._wire(torch.from_numpy(data), "all_gather")
        width = self._padded(n, "all_gather")
        out = self._empty(width * self.world, "all_gather")
        self._run(lambda: torch_dist.all_gather(list(out.chunk(self.world)), inp, group=self.group, async_op=True))
        rows = self._host(out, width * self.world).reshape(self.world, width)
        return rows if width == n else rows[:, :n]

    def broadcast(self, data: Optional[np.ndarray], n: int, src: int) -> np.ndarray:
        """Broadcast ``n`` bytes from group rank ``src``; ``data`` is used on ``src`` only."""
        if self.rank == src:
            assert data is not None and data.size == n
            t = self._wire(torch.from_numpy(data), "broadcast")
        else:
            t = self._empty(n, "broadcast")
        self._run(lambda: torch_dist.broadcast(t, src=self.global_rank(src), group=self.group, async_op=True))
        return data if self.rank == src else self._host(t, n)  # type: ignore[return-value]

    def send(self, data: np.ndarray, dst: int) -> None:
        """Send ``data`` to group rank ``dst``."""
        t = self._wire(torch.from_numpy(data), "send")
        self._run(lambda: torch_dist.isend(t, dst=self.global_rank(dst), group=self.group), p2p=True)

    def recv(self, n: int, src: int) -> np.ndarray:
        """Receive ``n`` bytes from group rank ``src``."""
        t = self._empty(n, "recv")
        self._run(lambda: torch_dist.irecv(t, src=self.global_rank(src), group=self.group), p2p=True)
        return self._host(t, n)

    # ---- failure notices: a rank that leaves in the middle tells the others (see _notices.py) ----

    def _run(self, start: Any, p2p: bool = False) -> None:
        """Start one communication and wait for it; a failure here is posted for the other ranks."""
        try:
            _notices.wait(start(), p2p, self.device.type == "cpu", self.notices.check)
        except _notices.NoticeSeen as seen:
            raise PeerFailure(
                f"an object collective failed on rank {seen.rank} of this group while rank {self.rank} waited"
                f" for it ({seen.waited:.1f} s): {seen.reason}. Rank {self.rank} stops waiting instead of waiting"
                " for the process-group timeout; the group cannot be used for object collectives any more",
                {int(seen.rank) if seen.rank.isdigit() else -1: seen.reason},
            ) from None
        except BaseException as exc:
            self.post_failure(f"{type(exc).__name__}: {exc}")
            raise

    @property
    def notices(self) -> _notices.Board:
        """The group's failure notices."""
        if self._board is None:
            self._board = _notices.Board(self.group)
        return self._board

    def post_failure(self, reason: str) -> None:
        """Tell the group's other ranks that this rank left an object collective in the middle."""
        self.notices.post(self.rank, reason)

    def exchange(self, record: np.ndarray, what: str, opcode: int, root: int = -1) -> list[Record]:
        """All-gather every rank's record; raise the same error on every rank if any rank failed."""
        rows = self.all_gather(record)
        heads = rows[:, : 8 * _HEAD].copy().view("<i8")
        records = []
        for r in range(self.world):
            n = int(heads[r, 7])
            inline = rows[r, 8 * _HEAD : 8 * _HEAD + n] if n else None
            records.append(Record(r, heads[r], inline))
        _raise_failures(records, what, opcode, root)
        return records


def _parse_record(rank: int, row: np.ndarray) -> Record:
    """One rank's record from its bytes."""
    head = row[: 8 * _HEAD].copy().view("<i8")
    n = int(head[7])
    return Record(rank, head, row[8 * _HEAD : 8 * _HEAD + n] if n else None)


def _raise_failures(records: Sequence[Record], what: str, opcode: int, root: int) -> None:
    failed = [rec for rec in records if rec.status != _OK]
    if failed:
        detail = "; ".join(f"rank {rec.rank}: {rec.message}" for rec in failed)
        ranks = ", ".join(str(rec.rank) for rec in failed)
        cls = _ERRORS.get(failed[0].status, ObjectCollectiveError)
        raise cls(f"{what} failed on rank(s) {ranks}: {detail}", {rec.rank: rec.message for rec in failed})
    ops = {rec.opcode for rec in records}
    if len(ops) > 1 or opcode not in ops:
        calls = ", ".join(f"rank {rec.rank}: {_OP_NAMES.get(rec.opcode, rec.opcode)}" for rec in records)
        raise CollectiveArgumentError(f"{what}: ranks called different object collectives ({calls})")
    roots = {rec.root for rec in records}
    if len(roots) > 1:
        calls = ", ".join(f"rank {rec.rank}: {rec.root}" for rec in records)
        raise CollectiveArgumentError(f"{what}: ranks disagree on the source/destination rank ({calls})")


def _locate(obj: Any, serializer: Optional[Serializer], path: str, depth: int, parent: Any = None) -> tuple[str, Any, Any]:
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


def _describe(exc: BaseException, obj: Any, serializer: Optional[Serializer], name: str = "its object") -> str:
    where, culprit, parent = _locate(obj, serializer, "", 6)
    inner = ""
    if where:
        inner = f"; the failing part is {name}{where} of type '{type(culprit).__qualname__}'"
        if parent is not None and parent is not obj:
            inner += f" inside a '{type(parent).__qualname__}'"
    return (
        f"could not serialize {name} of type '{type(obj).__qualname__}'{inner}:"
        f" {type(exc).__name__}: {exc}"
    )


def _serialize(obj: Any, serializer: Optional[Serializer], name: str = "its object") -> Frame:
    try:
        return _ser.encode(obj, serializer)
    except Exception as exc:
        raise _LocalFailure(_SERIALIZE, _describe(exc, obj, serializer, name)) from exc


def _failure_record(opcode: int, failure: _LocalFailure, root: int = -1) -> np.ndarray:
    return _make_record(opcode, status=failure.kind, root=root, message=str(failure))


def _payload_record(opcode: int, frame: Optional[Frame], root: int = -1, token: int = 0) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The record for ``frame`` (inline when it fits) and the frame's bytes when it travels separately."""
    if frame is None:
        return _make_record(opcode, root=root, token=token), None
    data = frame.to_numpy()
    if frame.nbytes <= INLINE_BYTES:
        return _make_record(opcode, total=frame.nbytes, root=root, token=token, inline=data), None
    return _make_record(opcode, total=frame.nbytes, root=root, token=token), data


def _decode(data: np.ndarray, serializer: Optional[Serializer], map_location: MapLocation) -> Any:
    if not data.flags.writeable:
        data = data.copy()
    return _ser.decode(data, 0, serializer, map_location)


class _Decoder:
    """Decodes received payloads; keeps the first failure instead of raising it.

    A rank that cannot decode one payload (a refused or corrupt payload) keeps
    taking part in the rest of the collective, so no sender is left waiting,
    and reports the failure in the collective's closing status (see
    [`_closing_status`][hwdist.collectives.objects._closing_status]).
    """

    def __init__(self, serializer: Optional[Serializer], map_location: MapLocation, comm: Optional[_Comm] = None) -> None:
        self.serializer = serializer
        self.map_location = map_location
        self.comm = comm
        self.error: Optional[BaseException] = None
        self.message = ""

    def __call__(self, rank: int, data: np.ndarray) -> Any:
        if self.error is not None:
            return None  # drained, not decoded
        try:
            return _decode(data, self.serializer, self.map_location)
        except Exception as exc:
            self.error = exc
            self.message = f"could not decode the object from rank {rank}: {type(exc).__name__}: {exc}"
            return None
        except BaseException as exc:  # KeyboardInterrupt & co.: this rank leaves now; tell the others
            if self.comm is not None:
                self.comm.post_failure(f"{type(exc).__name__} while decoding the object from rank {rank}")
            raise


#: Set in the root's record ``token`` when the root will send a closing status (see [`_closing_status`][hwdist.collectives.objects._closing_status]).
_CONFIRM = 1


def _may_refuse(serializer: Optional[Serializer]) -> bool:
    """Whether decoding with ``serializer`` may refuse a peer's payload (anything but plain pickle)."""
    return type(serializer if serializer is not None else _ser.get_serializer()) is not PickleSerializer


def _closing_status(comm: _Comm, records: Sequence[Record], root: int, decoder: _Decoder, what: str, op: int) -> None:
    """The root's decode failure, raised on every rank (the root raises the original error).

    A closing broadcast of the root's status runs when some payload moved
    after the record exchange (a sender might otherwise wait on the root) or
    when the root's serializer may refuse payloads (the root sets
    [`_CONFIRM`][hwdist.collectives.objects._CONFIRM] in its record). Otherwise every other rank has already
    finished, nothing is left waiting, and only the root raises.
    """
    if any(r.inline is None and r.rank != root for r in records) or records[root].token & _CONFIRM:
        if comm.rank == root:
            kind = _LocalFailure(_OTHER, decoder.message) if decoder.error is not None else None
            rec = _failure_record(op, kind, root=root) if kind is not None else _make_record(op, root=root)
            comm.broadcast(rec, RECORD_BYTES, root)
        else:
            _raise_failures([_parse_record(root, comm.broadcast(None, RECORD_BYTES, root))], what, op, root)
    if decoder.error is not None:
        raise decoder.error


def _check_root(comm: _Comm, root: Any, name: str) -> int:
    """The group rank of global rank ``root``; raises a _LocalFailure when it is bad."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise _arg_error(f"{name} must be an int rank, got {type(root).__name__}: {root!r}")
    grank = comm.group_rank(int(root))
    if grank < 0:
        raise _arg_error(f"{name}={root} is not a rank of the group (group size {comm.world})")
    return grank


def _verify_call(comm: _Comm, op: str, **fields: Any) -> None:
    """Verification mode: the call's digest exchange (see the module docstring)."""
    _verify.check_call(op, comm.group, comm.driver, **fields)


def _world(group: Any) -> int:
    return torch_dist.get_world_size(group) if is_distributed() else 1


# ---- public collectives -----------------------------------------------------------------


def all_gather_object(
    data: Any,
    group: Optional[Any] = None,
    rank_zero_return_only: bool = False,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
) -> Optional[list[Any]]:
    """Gather a picklable object from every rank into a list, on every rank.

    Outside a process group (or in a group of one) returns ``[data]``, as
    mmengine does. Unlike torch's, tensors inside the objects land on CPU
    (or ``map_location``), and an unpicklable object on any rank makes every
    rank raise [`SerializationError`][hwdist.collectives.objects.SerializationError] naming that rank.

    Args:
        data: this rank's object.
        group: process group (default group if None).
        rank_zero_return_only: vis4d semantics: gather to rank 0 of the group
            only; other ranks get None.
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].

    Returns:
        ``[object of rank 0, object of rank 1, ...]`` (None off rank 0 with
        ``rank_zero_return_only``).

    Examples:
        >>> hwdist.all_gather_object({"rank": hwdist.get_rank()})
        [{'rank': 0}, {'rank': 1}]   # rank 0
        [{'rank': 0}, {'rank': 1}]   # rank 1
    """
    world = _world(group)
    if world == 1:
        return [data]
    if rank_zero_return_only:
        root = torch_dist.get_global_rank(group, 0) if group is not None else 0
        return gather_object(data, root, group, map_location=map_location, serializer=serializer)
    comm = _Comm(group)
    if _verify._enabled:
        _verify_call(comm, "all_gather_object")
    op = _OPS["all_gather_object"]
    if _native(comm.driver, map_location, serializer):
        out: list[Any] = [None] * world
        torch_dist.all_gather_object(out, data, group=group)
        return out
    try:
        frame = _serialize(data, serializer)
        rec, own = _payload_record(op, frame)
    except _LocalFailure as fail:
        rec, own = _failure_record(op, fail), None
    records = comm.exchange(rec, "all_gather_object", op)
    results: list[Any] = [None] * world
    big = [r for r in records if r.inline is None]
    decode = _Decoder(serializer, map_location, comm)  # a failure is raised after this rank's last broadcast
    for r in records:
        if r.inline is not None:
            results[r.rank] = decode(r.rank, r.inline.copy())
    if big:
        largest = max(r.total for r in big)
        if largest * world <= PADDED_ALL_GATHER_LIMIT and len(big) > 1:
            slot = np.zeros(largest, dtype=np.uint8)
            if own is not None:
                slot[: own.size] = own
            rows = comm.all_gather(slot)
            for r in big:
                results[r.rank] = decode(r.rank, rows[r.rank, : r.total])
        else:
            for r in big:
                buf = comm.broadcast(own if r.rank == comm.rank else None, r.total, r.rank)
                results[r.rank] = decode(r.rank, buf)
    if decode.error is not None:
        raise decode.error
    return results


def gather_object(
    data: Any,
    dst: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
) -> Optional[list[Any]]:
    """Gather a picklable object from every rank on rank ``dst``.

    Outside a process group returns ``[data]`` (mmengine). Payloads move
    point to point to ``dst`` at their exact size (no padding to the
    largest); ``dst`` deserializes one rank's payload at a time.

    Args:
        data: this rank's object.
        dst: destination rank (global rank, as in torch and mmengine).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].

    Returns:
        On ``dst``: ``[object of rank 0, object of rank 1, ...]``; elsewhere None.

    Examples:
        >>> hwdist.gather_object(hwdist.get_rank() * 10, dst=0)
        [0, 10, 20]   # rank 0
        None          # rank 1
        None          # rank 2
    """
    world = _world(group)
    if world == 1:
        return [data]
    comm = _Comm(group)
    if _verify._enabled:
        _verify_call(comm, "gather_object", dst=_verify.rank_field(dst))
    op = _OPS["gather_object"]
    own = None
    try:
        root = _check_root(comm, dst, "dst")
        if _native(comm.driver, map_location, serializer):
            out = [None] * world if comm.rank == root else None
            torch_dist.gather_object(data, out, dst=dst, group=group)
            return out
        token = _CONFIRM if comm.rank == root and _may_refuse(serializer) else 0
        rec, own = _payload_record(op, _serialize(data, serializer), root=root, token=token)
    except _LocalFailure as fail:
        rec = _failure_record(op, fail)
        root = -1
    records = comm.exchange(rec, "gather_object", op, root)
    root = records[0].root
    p2p = comm.has("send") and comm.has("recv")
    results: Optional[list[Any]] = [None] * world if comm.rank == root else None
    decode = _Decoder(serializer, map_location, comm)
    for r in records:
        if r.inline is not None:
            if results is not None:
                results[r.rank] = decode(r.rank, r.inline.copy())
            continue
        if r.rank == root:
            if results is not None:
                results[r.rank] = decode(r.rank, own)  # type: ignore[arg-type]
        elif p2p:
            if comm.rank == r.rank:
                comm.send(own, root)  # type: ignore[arg-type]
            elif results is not None:
                results[r.rank] = decode(r.rank, comm.recv(r.total, r.rank))
        else:  # no point to point on this backend: broadcast, non-roots drop it
            buf = comm.broadcast(own if r.rank == comm.rank else None, r.total, r.rank)
            if results is not None:
                results[r.rank] = decode(r.rank, buf)
    _closing_status(comm, records, root, decode, "gather_object", op)
    return results


def broadcast_object_list(
    data: list[Any],
    src: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
) -> None:
    """Broadcast the picklable objects in ``data`` from ``src``, in place.

    Outside a process group does nothing (mmengine). On other ranks the list
    is replaced in place by ``src``'s objects (its length follows ``src``).

    One broadcast of ``src``'s 1 KiB record (payload inline when it fits,
    else one more broadcast of the exact bytes). If ``src`` cannot serialize
    its list, or ``data`` is not a list there, every rank raises the same
    error naming ``src``. A non-list ``data`` on another rank raises
    [`CollectiveArgumentError`][hwdist.collectives.objects.CollectiveArgumentError] on that rank after it took part (the
    others complete). Ranks that disagree on ``src`` are undefined, as in
    torch, unless verification mode is on (then every rank raises first).

    Args:
        data: a list on every rank; its content matters on ``src`` only.
        src: source rank (global rank).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].

    Examples:
        >>> data = ["foo", 12, {1: 2}] if hwdist.get_rank() == 0 else [None, None, None]
        >>> hwdist.broadcast_object_list(data)
        >>> data
        ['foo', 12, {1: 2}]   # rank 0
        ['foo', 12, {1: 2}]   # rank 1
    """
    if not isinstance(data, list):
        bad = f"broadcast_object_list: data must be a list, got {type(data).__name__}"
        if _world(group) == 1:
            raise ArgumentAssertionError(bad)
    else:
        bad = ""
    if _world(group) == 1:
        return
    comm = _Comm(group)
    if _verify._enabled:
        _verify_call(comm, "broadcast_object_list", src=_verify.rank_field(src), data_is_list=not bad)
    op = _OPS["broadcast_object_list"]
    try:
        root = _check_root(comm, src, "src")
    except _LocalFailure as fail:  # no rank to receive from: this rank cannot take part
        raise CollectiveArgumentError(f"broadcast_object_list: {fail}") from None
    if not bad and _native(comm.driver, map_location, serializer):
        torch_dist.broadcast_object_list(data, src=src, group=group)
        return
    # One broadcast of src's record (status, size and, when small, the payload itself): the same
    # collectives as torch's size-then-data broadcast, one fewer for small objects. Only src can
    # fail (it alone serializes); its failure reaches every rank in the record.
    if comm.rank == root:
        own = None
        try:
            if bad:
                raise _LocalFailure(_ASSERTED, f"data must be a list, got {type(data).__name__}")
            rec, own = _payload_record(op, _serialize(data, serializer, "data"), root=root)
        except _LocalFailure as fail:
            rec = _failure_record(op, fail, root=root)
        comm.broadcast(rec, RECORD_BYTES, root)
        source = _parse_record(root, rec)
        _raise_failures([source], "broadcast_object_list", op, root)
        if own is not None:
            comm.broadcast(own, source.total, root)
        return
    source = _parse_record(root, comm.broadcast(None, RECORD_BYTES, root))
    if source.status == _OK and (source.opcode != op or source.root != root):
        raise CollectiveArgumentError(
            f"broadcast_object_list: rank {root} sent {_OP_NAMES.get(source.opcode, source.opcode)} with source"
            f" {source.root}; every rank must call broadcast_object_list with the same src"
        )
    _raise_failures([source], "broadcast_object_list", op, root)
    buf = source.inline if source.inline is not None else comm.broadcast(None, source.total, root)
    if bad:  # raised after taking part, so src and the other ranks are not left waiting
        raise ArgumentAssertionError(bad)
    data[:] = _decode(buf.copy() if source.inline is not None else buf, serializer, map_location)


def broadcast_object(
    obj: Any,
    src: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
) -> Any:
    """Return ``src``'s ``obj`` on every rank (vis4d's ``broadcast(obj)``).

    Examples:
        >>> hwdist.broadcast_object("hello" if hwdist.get_rank() == 0 else None)
        'hello'   # rank 0
        'hello'   # rank 1
    """
    box = [obj]
    broadcast_object_list(box, src, group, map_location=map_location, serializer=serializer)
    return box[0]


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: Optional[Sequence[Any]] = None,
    src: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
) -> None:
    """Scatter ``src``'s list: rank ``i`` gets item ``i`` in ``scatter_object_output_list[0]``.

    torch's signature. Outside a process group the output gets the first input item.

    Args:
        scatter_object_output_list: a non-empty list on every rank; item 0 is set.
        scatter_object_input_list: on ``src``, one object per rank of the group.
        src: source rank (global rank).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].

    Examples:
        >>> out = [None]
        >>> hwdist.scatter_object_list(out, ["a", "b"] if hwdist.get_rank() == 0 else None)
        >>> out
        ['a']   # rank 0
        ['b']   # rank 1
    """
    world = _world(group)
    bad = ""
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        bad = (
            "scatter_object_output_list must be a non-empty list, got "
            f"{type(scatter_object_output_list).__name__}: {scatter_object_output_list!r}"
        )
    if world == 1:
        if bad:
            raise CollectiveArgumentError(f"scatter_object_list: {bad}")
        if scatter_object_input_list is None or len(scatter_object_input_list) < 1:
            raise CollectiveArgumentError(
                "scatter_object_list: scatter_object_input_list must hold one object per rank (1), got"
                f" {scatter_object_input_list!r}"
            )
        scatter_object_output_list[0] = scatter_object_input_list[0]
        return
    comm = _Comm(group)
    if _verify._enabled:
        _verify_call(comm, "scatter_object_list", src=_verify.rank_field(src))
    op = _OPS["scatter_object_list"]
    frames: list[Frame] = []
    try:
        if bad:
            raise _arg_error(bad)
        root = _check_root(comm, src, "src")
        if _native(comm.driver, map_location, serializer):
            torch_dist.scatter_object_list(scatter_object_output_list, scatter_object_input_list, src=src, group=group)
            return
        if comm.rank == root:
            inp = scatter_object_input_list
            if not isinstance(inp, Sequence) or isinstance(inp, (str, bytes)) or len(inp) != world:
                got = f"{type(inp).__name__} of length {len(inp)}" if isinstance(inp, Sequence) else repr(inp)
                raise _arg_error(f"scatter_object_input_list must be a list of {world} objects on src, got {got}")
            frames = [_serialize(item, serializer, f"scatter_object_input_list[{i}]") for i, item in enumerate(inp)]
        rec = _make_record(op, total=sum(f.nbytes for f in frames), root=root)
    except _LocalFailure as fail:
        rec, root = _failure_record(op, fail), -1
    records = comm.exchange(rec, "scatter_object_list", op, root)
    root = records[0].root
    sizes = np.array([f.nbytes for f in frames] if comm.rank == root else [0] * world, dtype="<i8")
    sizes = comm.broadcast(sizes.view(np.uint8), 8 * world, root).view("<i8")
    p2p = comm.has("send") and comm.has("recv")
    mine: Optional[np.ndarray] = None
    for r in range(world):
        n = int(sizes[r])
        if r == root:
            if comm.rank == root:
                mine = frames[r].to_numpy()
        elif p2p:
            if comm.rank == root:
                comm.send(frames[r].to_numpy(), r)
            elif comm.rank == r:
                mine = comm.recv(n, root)
        else:
            buf = comm.broadcast(frames[r].to_numpy() if comm.rank == root else None, n, root)
            if comm.rank == r:
                mine = buf
    assert mine is not None
    scatter_object_output_list[0] = _decode(mine, serializer, map_location)
