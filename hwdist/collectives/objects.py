"""Object collectives with mmengine.dist's names, on any backend.

Each call serializes once, then exchanges one record per rank (``_objwire``:
the protocol's one header, with the payload inline up to ``INLINE_BYTES``);
a larger payload then moves at its exact size. Failures, bad arguments and
mismatched calls raise the same error on every rank right after that
exchange. Routes, costs and errors: docs/objects.md.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, cast

import numpy as np
import torch.distributed as torch_dist

from .. import _compat
from ..errors import ArgumentAssertionError, CollectiveArgumentError, ObjectCollectiveError, PeerFailure
from ..errors import SerializationError, WeightsOnlyRefused
from .verify import rank_field
from .. import serialization as _ser
from ..serialization import weights_only as _weights_only
from .call_entry import collective
from .engine import view
from ._objwire import ARGUMENT, ASSERTED, CONFIRM, INLINE_BYTES, OK, OP_NAMES, OPS, Decoder, LocalFailure
from ._objwire import Link, arg_error, check_root, closing_status, decode, failure_record, make_record
from ._objwire import may_refuse, payload_record, raise_failures, serialize, world_size
from ..serialization import Frame, MapLocation, Serializer

# re-exported (in __all__ through _ser.__all__): objects is where users import them from
from ..serialization import PickleSerializer, RestrictedPickleSerializer, RestrictedUnpickler  # noqa: F401
from ..serialization import UnpicklingRefused, get_serializer, obj2tensor, object_to_tensor  # noqa: F401
from ..serialization import register_safe_class, restricted_loads, safe_globals, set_serializer  # noqa: F401
from ..serialization import tensor2obj, tensor_to_object, use_serializer, WeightsOnlySerializer  # noqa: F401

# serialization's public names, bar the wire's Frame and encode/decode
__all__ = [
    "all_gather_object", "gather_object", "broadcast_object_list", "broadcast_object", "scatter_object_list",
    "ObjectCollectiveError", "SerializationError", "WeightsOnlyRefused", "CollectiveArgumentError",
    "PeerFailure",
    *(n for n in _ser.__all__ if n not in ("Frame", "encode", "decode")),
]  # fmt: skip

#: Above this many bytes in all, an all_gather moves each rank's payload by broadcast
#: (exact sizes) instead of one padded all_gather.
PADDED_ALL_GATHER_LIMIT = 1 << 20
#: Above this many bytes in all (largest payload times ranks), ``gather_object`` sends each payload
#: point to point at its exact size instead of one padded gather.
GATHER_LIMIT = 2 << 20

def _padded(own: Optional[np.ndarray], width: int, zero: bool = True) -> np.ndarray:
    """``own`` (None: nothing) padded to ``width`` bytes, uncopied when it is that long; ``zero=False``
    leaves the padding unset (a row that never leaves this rank)."""
    n = 0 if own is None else own.size
    if n == width:
        return own  # type: ignore[return-value]
    row = np.empty(width, dtype=np.uint8)
    if own is not None:
        row[:n] = own
    if zero:
        row[n:] = 0
    return row


# ---- public collectives -----------------------------------------------------------------


@collective(1)
def all_gather_object(
    data: Any,
    group: Optional[Any] = None,
    rank_zero_return_only: bool = False,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
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
        serializer: default: [`get_serializer`][hwdist.serialization.serializers.get_serializer].
        weights_only: as torch's: True builds only safe types and those allowed with
            ``torch.serialization.add_safe_globals`` (docs/objects.md). Default False.

    Returns:
        ``[object of rank 0, object of rank 1, ...]`` (None off rank 0 with
        ``rank_zero_return_only``).

    Examples:
        >>> hwdist.all_gather_object({"rank": hwdist.get_rank()})
        [{'rank': 0}, {'rank': 1}]   # rank 0
        [{'rank': 0}, {'rank': 1}]   # rank 1
    """
    serializer = _weights_only.for_call(serializer, weights_only, "all_gather_object")
    world = world_size(group)
    if world == 1:
        return [data]
    if rank_zero_return_only:
        root = torch_dist.get_global_rank(group, 0) if group is not None else 0
        return gather_object(data, root, group, map_location=map_location, serializer=serializer)
    comm = Link(group)
    comm.verify("all_gather_object", {})
    op = OPS["all_gather_object"]
    try:
        rec, own = payload_record(op, serialize(data, serializer))
    except LocalFailure as fail:
        rec, own = failure_record(op, fail), None
    records = comm.exchange(rec, "all_gather_object", op)
    results: list[Any] = [None] * world
    decoder = Decoder(serializer, map_location, comm)  # a failure is raised after this rank's last broadcast
    big = [r for r in records if r.inline is None]
    for r in records:
        if r.inline is not None:
            results[r.rank] = decoder(r.rank, r.inline.copy())
    largest = max((r.nbytes for r in big), default=0)
    if len(big) > 1 and largest * world <= PADDED_ALL_GATHER_LIMIT:  # one padded all_gather
        rows = comm.all_gather(_padded(own, largest))
        for r in big:
            results[r.rank] = decoder(r.rank, rows[r.rank, : r.nbytes])
    else:  # exact sizes, one broadcast per rank: gloo's broadcast beats its all_gather here
        for r in big:
            buf = comm.broadcast(own if r.rank == comm.rank else None, r.nbytes, r.rank)
            results[r.rank] = decoder(r.rank, buf)
    if decoder.error is not None:
        raise decoder.error
    return results


@collective(2)
def gather_object(
    data: Any,
    dst: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
) -> Optional[list[Any]]:
    """Gather a picklable object from every rank on rank ``dst``.

    Outside a process group returns ``[data]`` (mmengine). Payloads that do
    not fit a record (832 bytes) then move in one padded gather (up to 2 MiB
    in all), else point to point at their exact size.

    Args:
        data: this rank's object.
        dst: destination rank (global rank, as in torch and mmengine).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.serialization.serializers.get_serializer].
        weights_only: as torch's: True builds only safe types and those allowed with
            ``torch.serialization.add_safe_globals`` (docs/objects.md). Default False.

    Returns:
        On ``dst``: ``[object of rank 0, object of rank 1, ...]``; elsewhere None.

    Examples:
        >>> hwdist.gather_object(hwdist.get_rank() * 10, dst=0)
        [0, 10, 20]   # rank 0
        None          # rank 1
        None          # rank 2
    """
    serializer = _weights_only.for_call(serializer, weights_only, "gather_object")
    world = world_size(group)
    if world == 1:
        return [data]
    comm = Link(group)
    comm.verify("gather_object", {"dst": rank_field(dst)})
    op = OPS["gather_object"]
    gathers = comm.gathers  # the driver's plan, looked up once
    own = None
    try:
        root = check_root(comm, dst, "dst")
        token = CONFIRM if comm.rank == root and may_refuse(serializer) else 0
        rec, own = payload_record(op, serialize(data, serializer), root=root, token=token)
    except LocalFailure as fail:
        rec, root = failure_record(op, fail), -1
    records = comm.exchange(rec, "gather_object", op, root)
    root = records[0].root
    results: Optional[list[Any]] = [None] * world if comm.rank == root else None
    decoder = Decoder(serializer, map_location, comm)
    big = [r for r in records if r.inline is None and r.rank != root]
    largest = max((r.nbytes for r in big), default=0)
    # up to the limit in all, the payloads that did not fit their record: one padded gather to the root
    # (an all_gather where the driver has no gather). No sender then waits on the root: as for inline
    # payloads, only the root raises its decode failure.
    padded = bool(big) and largest * world <= (GATHER_LIMIT if gathers else PADDED_ALL_GATHER_LIMIT)
    rows: Any = None  # a list of rows (gather) or an array of them (all_gather): indexed by rank alike
    if padded:  # the root's own row is empty (it decodes ``own``); a gather leaves it on the root
        mine = _padded(None if comm.rank == root else own, largest, zero=comm.rank != root or not gathers)
        rows = comm.gather(mine, root) if gathers else comm.all_gather(mine)
    p2p = comm.has("send") and comm.has("recv")
    for r in records:
        buf: Any = None
        if r.inline is not None:
            buf = r.inline.copy() if results is not None else None
        elif r.rank == root:
            buf = own
        elif padded:
            buf = None if rows is None else rows[r.rank][: r.nbytes]
        elif p2p:  # larger payloads move point to point to the root, at their exact size
            if comm.rank == r.rank:
                comm.send(own, root)  # type: ignore[arg-type]
            elif results is not None:
                buf = comm.recv(r.nbytes, r.rank)
        else:  # no point to point on this backend: broadcast, non-roots drop it
            buf = comm.broadcast(own if r.rank == comm.rank else None, r.nbytes, r.rank)
        if results is not None:
            results[r.rank] = decoder(r.rank, buf)
    closing_status(comm, records, root, decoder, "gather_object", op, moved=bool(big) and not padded)
    return results


@collective(2)
def broadcast_object_list(
    data: list[Any],
    src: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
) -> None:
    """Broadcast the picklable objects in ``data`` from ``src``, in place.

    Outside a process group does nothing (mmengine). On other ranks the list
    is replaced in place by ``src``'s objects (its length follows ``src``).
    The records (all-gathered while verification is on, else ``src``'s
    broadcast) carry a payload of up to 832 bytes; a larger one follows in
    one broadcast. ``src``'s failure raises on every rank; without
    verification a non-list ``data`` elsewhere raises on that rank only,
    after taking part, and ranks that disagree on ``src`` are undefined.

    Args:
        data: a list on every rank; its content matters on ``src`` only.
        src: source rank (global rank).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.serialization.serializers.get_serializer].
        weights_only: as torch's: True builds only safe types and those allowed with
            ``torch.serialization.add_safe_globals`` (docs/objects.md). Default False.

    Examples:
        >>> data = ["foo", 12, {1: 2}] if hwdist.get_rank() == 0 else [None, None, None]
        >>> hwdist.broadcast_object_list(data)
        >>> data
        ['foo', 12, {1: 2}]   # rank 0
        ['foo', 12, {1: 2}]   # rank 1
    """
    serializer = _weights_only.for_call(serializer, weights_only, "broadcast_object_list")
    bad = "" if isinstance(data, list) else f"data must be a list, got {type(data).__name__}"
    if bad and world_size(group) == 1:
        raise ArgumentAssertionError(f"broadcast_object_list: {bad}")
    if group is _compat.NON_GROUP_MEMBER or world_size(group) == 1:  # no exchange on this rank
        src = _checked_src(src, group)
        if group is not _compat.NON_GROUP_MEMBER:
            return
    comm = Link(group)
    comm.verify("broadcast_object_list", {"src": rank_field(src)})
    op = OPS["broadcast_object_list"]
    try:
        root = comm.group_rank(_checked_src(src, group))  # as broadcast checks it, in its words
    except CollectiveArgumentError as exc:
        if not comm.verifying:  # only src's record travels: this rank cannot take part
            raise
        # verified: every rank's record is all-gathered; this rank's failure raises on every rank
        failed = failure_record(op, LocalFailure(ARGUMENT, str(exc)))
        try:
            comm.receive_record(failed, 0, "broadcast_object_list", op)
        except ObjectCollectiveError as every:
            if set(every.failures.values()) == {str(exc)}:  # the same bad src everywhere: broadcast's error
                raise exc from None
            raise
        raise
    # src's record (status, size, a small payload itself), then a larger payload: only src can fail
    if comm.rank == root:
        own = None
        try:
            if bad:
                raise LocalFailure(ASSERTED, bad)
            rec, own = payload_record(op, serialize(data, serializer, "data"), root=root)
        except LocalFailure as fail:
            rec = failure_record(op, fail, root=root)
        source = comm.broadcast_record(rec, "broadcast_object_list", op, root)
        if own is not None:
            comm.broadcast(own, source.nbytes, root)
        return
    # verified: every rank's record is all-gathered, so a non-list here fails on every rank
    mine = failure_record(op, LocalFailure(ASSERTED, bad), root=root) if bad else None
    source = comm.receive_record(mine, root, "broadcast_object_list", op)
    if source.status == OK and (source.op != op or source.root != root):
        raise CollectiveArgumentError(
            f"broadcast_object_list: rank {root} sent {OP_NAMES.get(source.op, source.op)}"
            f" with source {source.root}; every rank must call broadcast_object_list with the same src"
        )
    raise_failures([source], "broadcast_object_list", op, root)
    buf = source.inline if source.inline is not None else comm.broadcast(None, source.nbytes, root)
    if bad:  # raised after taking part, so src and the other ranks are not left waiting
        raise ArgumentAssertionError(f"broadcast_object_list: {bad}")
    data[:] = decode(buf, serializer, map_location)


def _checked_src(src: Any, group: Any) -> int:
    """``src`` checked as ``broadcast`` checks it, in its words (a ``CollectiveArgumentError``)."""
    try:
        return cast(int, view(group).check_rank(src, "src", "broadcast_object_list"))
    except (TypeError, ValueError) as exc:
        raise CollectiveArgumentError(str(exc)) from None


# Same keyword shape as gather_object on purpose: the public object-collective signatures match.
@collective(2)
def broadcast_object(
    obj: Any,
    src: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
) -> Any:
    """Return ``src``'s ``obj`` on every rank (vis4d's ``broadcast(obj)``).

    Examples:
        >>> hwdist.broadcast_object("hello" if hwdist.get_rank() == 0 else None)
        'hello'   # rank 0
        'hello'   # rank 1
    """
    box = [obj]
    broadcast_object_list(
        box, src, group, map_location=map_location, serializer=serializer, weights_only=weights_only
    )
    return box[0]


@collective(3)
def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: Optional[Sequence[Any]] = None,
    src: int = 0,
    group: Optional[Any] = None,
    *,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
) -> None:
    """Scatter ``src``'s list: rank ``i`` gets item ``i`` in ``scatter_object_output_list[0]``.

    torch's signature. Outside a process group the output gets the first input item.

    Args:
        scatter_object_output_list: a non-empty list on every rank; item 0 is set.
        scatter_object_input_list: on ``src``, one object per rank of the group.
        src: source rank (global rank).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.serialization.serializers.get_serializer].
        weights_only: as torch's: True builds only safe types and those allowed with
            ``torch.serialization.add_safe_globals`` (docs/objects.md). Default False.

    Examples:
        >>> out = [None]
        >>> hwdist.scatter_object_list(out, ["a", "b"] if hwdist.get_rank() == 0 else None)
        >>> out
        ['a']   # rank 0
        ['b']   # rank 1
    """
    serializer = _weights_only.for_call(serializer, weights_only, "scatter_object_list")
    world = world_size(group)
    bad = ""
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        bad = (
            "scatter_object_output_list must be a non-empty list, got "
            f"{type(scatter_object_output_list).__name__}: {scatter_object_output_list!r}"
        )
    if world == 1:
        if not bad and (scatter_object_input_list is None or len(scatter_object_input_list) < 1):
            got = scatter_object_input_list
            bad = f"scatter_object_input_list must hold one object per rank (1), got {got!r}"
        if bad:
            raise CollectiveArgumentError(f"scatter_object_list: {bad}")
        scatter_object_output_list[0] = scatter_object_input_list[0]  # type: ignore[index]
        return
    comm = Link(group)
    comm.verify("scatter_object_list", {"src": rank_field(src)})
    op = OPS["scatter_object_list"]
    frames: list[Frame] = []
    table, sizes = 8 * world, None
    root = -1
    # One record per rank, all-gathered: a rank's bad argument, the ranks' src, and src's record (did
    # every item serialize, and each rank's item size) in one collective.
    try:
        if bad:
            raise arg_error(bad)
        root = check_root(comm, src, "src")
        rec = make_record(op, root=root)
        if comm.rank == root:
            inp = scatter_object_input_list
            if not isinstance(inp, Sequence) or isinstance(inp, (str, bytes)) or len(inp) != world:
                got = f"{type(inp).__name__} of length {len(inp)}" if isinstance(inp, Sequence) else repr(inp)
                raise arg_error(
                    f"scatter_object_input_list must be a list of {world} objects on src, got {got}"
                )
            frames = [
                serialize(item, serializer, f"scatter_object_input_list[{i}]") for i, item in enumerate(inp)
            ]
            sizes = np.array([f.nbytes for f in frames], dtype="<i8").view(np.uint8)
            rec = make_record(op, total=table, root=root, inline=sizes if table <= INLINE_BYTES else None)
    except LocalFailure as fail:
        rec = failure_record(op, fail, root=root)
    records = comm.exchange(rec, "scatter_object_list", op)
    source = records[root if root >= 0 else records[0].root]
    root = source.root
    if source.inline is None:  # a size table longer than a record's inline bytes (over 100 ranks)
        source.inline = comm.broadcast(sizes, table, root)
    sizes = source.inline.copy().view("<i8")
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
    scatter_object_output_list[0] = decode(mine, serializer, map_location)
