"""How the object collectives move bytes: a group's ranks, its transport and its failure notices.

[`Link`][hwdist.collectives._objwire.Link] is one call's view of a process group:
its driver, group and global ranks, and the byte exchanges the object
collectives and results collection need, each a call into the internal
transport ([`transport`][hwdist.collectives.transport]) with a waiter that
reads the group's failure notices while it waits (`_notices`): a rank that
leaves a collective in the middle tells the others, who raise
[`PeerFailure`][hwdist.errors.PeerFailure] instead of waiting for the
process-group timeout. Ranks given to a ``Link`` are group ranks.

Also here: serializing with a message that names the failing part
([`serialize`][hwdist.collectives._objwire.serialize]) and decoding received
payloads without leaving senders waiting
([`Decoder`][hwdist.collectives._objwire.Decoder],
[`closing_status`][hwdist.collectives._objwire.closing_status]).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch.distributed as torch_dist

from .. import _compat, registry
from ..errors import PeerFailure, PlanError
from ..info import is_distributed
from . import _notices, transport, _weights_only
from . import serialization as _ser
from ._records import (
    OTHER,
    RECORD_BYTES,
    REFUSED,
    SERIALIZE,
    LocalFailure,
    Record,
    arg_error,
    failure_record,
    make_record,
    parse_record,
    parse_rows,
    raise_failures,
)
from .serialization import Frame, MapLocation, PickleSerializer, Serializer

__all__ = [
    "Link",
    "Decoder",
    "CONFIRM",
    "closing_status",
    "check_root",
    "world_size",
    "describe",
    "serialize",
    "decode",
    "may_refuse",
]


def world_size(group: Any) -> int:
    """The group's size; 1 outside a process group."""
    return torch_dist.get_world_size(group) if is_distributed() else 1


class Link:
    """A group's driver, ranks and byte exchanges (through the transport, watching failure notices)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.driver = registry.resolve(group)
        self.world = torch_dist.get_world_size(group)
        self.rank = torch_dist.get_rank(group)
        self._sliced: Optional[bool] = None
        self._ranks: Optional[list[int]] = None
        self._board: Optional[_notices.Board] = None

    def _members(self) -> Optional[list[int]]:
        if self.group is None or self.group is _compat.default_group():
            return None
        if self._ranks is None:
            self._ranks = list(torch_dist.get_process_group_ranks(self.group))
        return self._ranks

    def global_rank(self, group_rank: int) -> int:
        """The global rank of ``group_rank``."""
        members = self._members()
        return group_rank if members is None else members[group_rank]

    def group_rank(self, global_rank: int) -> int:
        """The group rank of ``global_rank`` (-1 if not a member)."""
        members = self._members()
        if members is None:
            return global_rank if 0 <= global_rank < self.world else -1
        return members.index(global_rank) if global_rank in members else -1

    def has(self, op: str) -> bool:
        """Whether the driver can move bytes for ``op`` (natively or emulated)."""
        return transport.carries(self.driver, op)

    # ---- exchanges (group ranks) ----

    def all_gather(self, data: np.ndarray) -> np.ndarray:
        """All-gather ``data`` (uint8, the same size on every rank) -> array of shape (world, n)."""
        return self._call(transport.gather_rows, data)

    def broadcast(self, data: Optional[np.ndarray], n: int, src: int) -> np.ndarray:
        """Broadcast ``n`` bytes from group rank ``src``; ``data`` is used on ``src`` only."""
        return self._call(
            transport.broadcast_sized, data if self.rank == src else None, n, self.global_rank(src)
        )

    def send(self, data: np.ndarray, dst: int) -> None:
        """Send ``data`` to group rank ``dst``."""
        self._call(transport.send_bytes, data, self.global_rank(dst))

    def recv(self, n: int, src: int) -> np.ndarray:
        """Receive ``n`` bytes from group rank ``src``."""
        return self._call(transport.recv_bytes, n, self.global_rank(src))

    def exchange(self, record: np.ndarray, what: str, opcode: int, root: int = -1) -> list[Record]:
        """All-gather every rank's record; raise the same error on every rank if any rank failed."""
        records = parse_rows(self.all_gather(record))
        raise_failures(records, what, opcode, root)
        return records

    # ---- failure notices: a rank that leaves in the middle tells the others (see _notices.py) ----

    def _wait(self, work: Any, p2p: bool) -> None:
        if self._sliced is None:
            self._sliced = self.driver.comm_device().type == "cpu"
        _notices.wait(work, p2p, self._sliced, self.notices.check)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One transport exchange; a failure here is posted for the other ranks."""
        try:
            return fn(*args, self.group, self.driver, self._wait)
        except _notices.NoticeSeen as seen:
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

    @property
    def notices(self) -> _notices.Board:
        """The group's failure notices."""
        if self._board is None:
            self._board = _notices.Board(self.group)
        return self._board

    def post_failure(self, reason: str) -> None:
        """Tell the group's other ranks that this rank left an object collective in the middle."""
        self.notices.post(self.rank, reason)


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
    """Decodes received payloads; keeps the first failure instead of raising it.

    A rank that cannot decode one payload (a refused or corrupt payload) keeps
    taking part in the rest of the collective, so no sender is left waiting,
    and reports the failure in the collective's closing status (see
    [`closing_status`][hwdist.collectives._objwire.closing_status]).
    """

    def __init__(
        self, serializer: Optional[Serializer], map_location: MapLocation, link: Optional[Link] = None
    ) -> None:
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
            if self.link is not None:
                self.link.post_failure(f"{type(exc).__name__} while decoding the object from rank {rank}")
            raise


#: Set in the root's record ``token`` when the root will send a closing status
#: (see [`closing_status`][hwdist.collectives._objwire.closing_status]).
CONFIRM = 1


def closing_status(
    link: Link, records: Sequence[Record], root: int, decoder: Decoder, what: str, op: int
) -> None:
    """The root's decode failure, raised on every rank (the root raises the original error).

    A closing broadcast of the root's status runs when some payload moved
    after the record exchange (a sender might otherwise wait on the root) or
    when the root's serializer may refuse payloads (the root sets
    [`CONFIRM`][hwdist.collectives._objwire.CONFIRM] in its record). Otherwise every other rank has already
    finished, nothing is left waiting, and only the root raises.
    """
    if any(r.inline is None and r.rank != root for r in records) or records[root].token & CONFIRM:
        if link.rank == root:
            kind = LocalFailure(OTHER, decoder.message) if decoder.error is not None else None
            rec = failure_record(op, kind, root=root) if kind is not None else make_record(op, root=root)
            link.broadcast(rec, RECORD_BYTES, root)
        else:
            raise_failures([parse_record(root, link.broadcast(None, RECORD_BYTES, root))], what, op, root)
    if decoder.error is not None:
        raise decoder.error
