"""Object collectives with mmengine.dist's names, on any backend.

Every call resolves its driver with ``registry.resolve(group)`` and then takes
one of two paths, the same on every rank:

* **portable** (default): serialize once (`serialization`), then one
  *slot* per rank (`_objslots`, over the size-agreement mechanism of
  `_sizes`): a 128-byte header (status, true size, opcode, root) and the
  payload up to the capacity the group's size history predicts, the same on
  every rank. In the steady state that one all_gather (``broadcast_object_list``:
  one broadcast of ``src``'s slot) is the whole collective. If any rank failed
  to serialize or passed a bad argument, every rank raises the same clear error
  right there, instead of hanging in the next collective. Only the ranks whose
  payload was over the capacity move it again: the bytes past the capacity by a
  padded all_gather, whole payloads by one broadcast per rank above
  ``PADDED_ALL_GATHER_LIMIT``, point to point to a gather root.
  ``scatter_object_list`` agrees on its arguments first (the agreement
  primitive, ``consensus.agree``), then broadcasts ``src``'s record. Bytes move
  through hwdist's internal transport (`_objwire`, `transport`), in the byte
  dtype the driver's plan allows. Tensors inside received objects land on CPU
  or the ``map_location`` given.
* **native**: torch's own ``all_gather_object`` & co. Used only when asked
  ([`set_object_path`][hwdist.collectives.objects.set_object_path] ``('native')``), when the driver
  declares ``native_object_collectives`` and the torch version has them
  (``_compat.DIST_AVAILABLE``), and the call uses the default pickle
  serializer without ``map_location``; otherwise the portable path runs. The
  portable path is the default because it measured faster on every size
  (see ``docs/objects.md``).

Verification mode ([`hwdist.verify`][hwdist.collectives.verify]): the slot exchange checks the
call's identity (which collective, its src/dst) in every mode, so those
disagreements raise [`CollectiveArgumentError`][hwdist.collectives.objects.CollectiveArgumentError]
on every rank even when the mode is off (``broadcast_object_list`` and
``scatter_object_list`` against a different collective: only with the mode on).
When the mode is on, each object collective also takes part in the mode's
per-group digest exchange (op name, call number, src/dst) before its slot
exchange: a slot exchange must never meet a tensor collective's 24-byte
digest exchange on another rank, so every verified collective, tensor or
object, starts with the same exchange.

Outside a process group every function behaves as mmengine's does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Sequence, cast

import numpy as np
import torch.distributed as torch_dist

from .. import _compat, settings
from ..errors import (
    ArgumentAssertionError,
    CollectiveArgumentError,
    ObjectCollectiveError,
    PeerFailure,
    SerializationError,
    WeightsOnlyRefused,
)
from .verify import rank_field
from . import _weights_only
from . import serialization as _ser
from .consensus import agree
from .call_entry import collective
from .engine import check
from ._objwire import (
    CONFIRM,
    Decoder,
    Link,
    check_root,
    closing_status,
    decode,
    may_refuse,
    serialize,
    world_size,
)
from ._objslots import broadcast_slot, complete_broadcast, gather_slots, gather_tails
from ._records import (
    ASSERTED,
    INLINE_BYTES,
    OK,
    OP_NAMES,
    OPS,
    RECORD_BYTES,
    LocalFailure,
    arg_error,
    failure_record,
    make_record,
    parse_record,
    raise_failures,
)
from . import serialization as _serialization
from .serialization import (  # noqa: F401  (re-exported: in __all__ through _serialization.__all__)
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

# serialization's public names are re-exported: objects is where users import them from
# (the wire's Frame and encode/decode stay serialization's own)
__all__ = [
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "broadcast_object",
    "scatter_object_list",
    "ObjectCollectiveError",
    "SerializationError",
    "WeightsOnlyRefused",
    "CollectiveArgumentError",
    "PeerFailure",
    "set_object_path",
    "get_object_path",
    "object_path",
    *(n for n in _serialization.__all__ if n not in ("Frame", "encode", "decode")),
]

#: Above this many bytes in all, an all_gather moves each rank's payload by broadcast
#: (exact sizes) instead of one padded all_gather.
PADDED_ALL_GATHER_LIMIT = 1 << 20
#: Bytes per rank in the record exchange, and the largest payload a record carries inline.
RECORD_BYTES, INLINE_BYTES = RECORD_BYTES, INLINE_BYTES

# ---- path selection ----------------------------------------------------------------------

_PATHS = ("portable", "native")


def _check_path(path: Any) -> str:
    if path not in _PATHS:
        raise ValueError(f"object path must be one of {', '.join(_PATHS)}, got {path!r}")
    return str(path)


_PATH: settings.Switch[str] = settings.Switch(lambda: settings.choice("HWDIST_OBJECT_PATH"), _check_path)


def get_object_path() -> str:
    """``'portable'`` (default) or ``'native'``: which implementation object collectives prefer.

    ``HWDIST_OBJECT_PATH`` sets the initial value.

    Examples:
        >>> hwdist.get_object_path()
        'portable'   # every rank
    """
    return _PATH.get()


def set_object_path(path: str) -> str:
    """Prefer ``'portable'`` or ``'native'`` (torch's own, where the driver allows).

    The choice must be the same on every rank. ``HWDIST_OBJECT_PATH`` sets the initial value.

    Args:
        path: ``'portable'`` or ``'native'``.

    Returns:
        The previous value.

    Raises:
        ValueError: ``path`` is neither.

    Examples:
        >>> hwdist.set_object_path("native")
        'portable'   # every rank
    """
    return _PATH.set(path)


@contextlib.contextmanager
def object_path(path: str) -> Iterator[str]:
    """Context manager: prefer ``path`` (``'portable'`` or ``'native'``) inside the block.

    Examples:
        >>> with hwdist.object_path("native"):
        ...     hwdist.all_gather_object(hwdist.get_rank())
        [0, 1]   # every rank
    """
    with _PATH.override(path) as value:
        yield value


def _native(driver: Any, map_location: MapLocation, serializer: Optional[Serializer]) -> bool:
    return (
        _PATH.get() == "native"
        and bool(getattr(driver, "native_object_collectives", False))
        and _compat.DIST_AVAILABLE
        and map_location is None
        and _ser.is_default_serializer(serializer)
    )


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
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].
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
    check("all_gather_object", comm.group, lambda: (None, {}))
    op = OPS["all_gather_object"]
    if _native(comm.driver, map_location, serializer):
        out: list[Any] = [None] * world
        torch_dist.all_gather_object(out, data, group=group)
        return out
    own: Optional[np.ndarray] = None
    failure: Optional[LocalFailure] = None
    try:
        own = serialize(data, serializer).to_numpy()
    except LocalFailure as fail:
        failure = fail
    ex = gather_slots(comm, "all_gather_object", op, own, failure)
    results: list[Any] = [None] * world
    decoder = Decoder(serializer, map_location, comm)  # a failure is raised after this rank's last broadcast
    for r in ex.records:
        if r.inline is not None:
            results[r.rank] = decoder(r.rank, r.inline.copy())
    if ex.over:  # only the ranks over the predicted capacity move again
        if ex.verdict.tail_width * world <= PADDED_ALL_GATHER_LIMIT and len(ex.over) > 1:
            for k, buf in enumerate(gather_tails(comm, ex, own)):
                if buf is not None:
                    results[k] = decoder(k, buf)
        else:  # exact sizes, one broadcast per rank: gloo's broadcast beats its all_gather here
            for k in ex.over:
                buf = comm.broadcast(own if k == comm.rank else None, ex.records[k].total, k)
                results[k] = decoder(k, buf)
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

    Outside a process group returns ``[data]`` (mmengine). Payloads move
    point to point to ``dst`` at their exact size (no padding to the
    largest); ``dst`` deserializes one rank's payload at a time.

    Args:
        data: this rank's object.
        dst: destination rank (global rank, as in torch and mmengine).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].
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
    check("gather_object", comm.group, lambda: (None, {"dst": rank_field(dst)}))
    op = OPS["gather_object"]
    own: Optional[np.ndarray] = None
    failure: Optional[LocalFailure] = None
    root, token = -1, 0
    try:
        root = check_root(comm, dst, "dst")
        if _native(comm.driver, map_location, serializer):
            out = [None] * world if comm.rank == root else None
            torch_dist.gather_object(data, out, dst=dst, group=group)
            return out
        token = CONFIRM if comm.rank == root and may_refuse(serializer) else 0
        own = serialize(data, serializer).to_numpy()
    except LocalFailure as fail:
        failure, root = fail, -1
    # the root's own payload need not travel: it decodes it from here
    sent = None if comm.rank == root else own
    ex = gather_slots(comm, "gather_object", op, sent, failure, root=root, token=token)
    root = ex.records[0].root
    p2p = comm.has("send") and comm.has("recv")
    results: Optional[list[Any]] = [None] * world if comm.rank == root else None
    decoder = Decoder(serializer, map_location, comm)
    for r in ex.records:
        if r.rank == root:
            if results is not None:
                results[r.rank] = decoder(r.rank, own)  # type: ignore[arg-type]
            continue
        if r.inline is not None:
            if results is not None:
                results[r.rank] = decoder(r.rank, r.inline.copy())
            continue
        if p2p:  # over the capacity: only those ranks' payloads move again, to the root
            if comm.rank == r.rank:
                comm.send(own, root)  # type: ignore[arg-type]
            elif results is not None:
                results[r.rank] = decoder(r.rank, comm.recv(r.total, r.rank))
        else:  # no point to point on this backend: broadcast, non-roots drop it
            buf = comm.broadcast(own if r.rank == comm.rank else None, r.total, r.rank)
            if results is not None:
                results[r.rank] = decoder(r.rank, buf)
    closing_status(comm, ex.records, root, decoder, "gather_object", op)
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

    One broadcast of ``src``'s slot (payload in it up to the predicted
    size, else one more broadcast of the rest). If ``src`` cannot serialize
    its list, or ``data`` is not a list there, every rank raises the same
    error naming ``src``. A non-list ``data`` on another rank raises
    [`CollectiveArgumentError`][hwdist.collectives.objects.CollectiveArgumentError] on that rank
    after it took part (the others complete). Ranks that disagree on ``src`` are undefined, as in
    torch, unless verification mode is on (then every rank raises first).

    Args:
        data: a list on every rank; its content matters on ``src`` only.
        src: source rank (global rank).
        group: process group (default group if None).
        map_location: device for tensors inside received objects (default CPU).
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].
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
    if not isinstance(data, list):
        bad = f"broadcast_object_list: data must be a list, got {type(data).__name__}"
        if world_size(group) == 1:
            raise ArgumentAssertionError(bad)
    else:
        bad = ""
    if world_size(group) == 1:
        return
    comm = Link(group)
    check(
        "broadcast_object_list", comm.group, lambda: (None, {"src": rank_field(src), "data_is_list": not bad})
    )
    op = OPS["broadcast_object_list"]
    try:
        root = check_root(comm, src, "src")
    except LocalFailure as fail:  # no rank to receive from: this rank cannot take part
        raise CollectiveArgumentError(f"broadcast_object_list: {fail}") from None
    if not bad and _native(comm.driver, map_location, serializer):
        torch_dist.broadcast_object_list(data, src=src, group=group)
        return
    # One broadcast of src's slot (status, size and the payload up to the predicted capacity): one
    # collective in the steady state where torch uses two. Only src can fail (it alone serializes); its
    # failure reaches every rank in the slot.
    own: Optional[np.ndarray] = None
    failure: Optional[LocalFailure] = None
    if comm.rank == root:
        try:
            if bad:
                raise LocalFailure(ASSERTED, f"data must be a list, got {type(data).__name__}")
            own = serialize(data, serializer, "data").to_numpy()
        except LocalFailure as fail:
            failure = fail
    source, head = broadcast_slot(comm, "broadcast_object_list", op, root, own, failure)
    if source.status == OK and (source.opcode != op or source.root != root):
        raise CollectiveArgumentError(
            f"broadcast_object_list: rank {root} sent {OP_NAMES.get(source.opcode, source.opcode)}"
            " with source"
            f" {source.root}; every rank must call broadcast_object_list with the same src"
        )
    raise_failures([source], "broadcast_object_list", op, root)
    buf = complete_broadcast(comm, source, head, own, root)
    if comm.rank == root:
        return
    if bad:  # raised after taking part, so src and the other ranks are not left waiting
        raise ArgumentAssertionError(bad)
    data[:] = decode(buf.copy() if source.inline is not None else buf, serializer, map_location)


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
        serializer: default: [`get_serializer`][hwdist.collectives.serialization.get_serializer].
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
        if bad:
            raise CollectiveArgumentError(f"scatter_object_list: {bad}")
        if scatter_object_input_list is None or len(scatter_object_input_list) < 1:
            raise CollectiveArgumentError(
                "scatter_object_list: scatter_object_input_list must hold one object per rank (1), got"
                f" {scatter_object_input_list!r}"
            )
        scatter_object_output_list[0] = scatter_object_input_list[0]
        return
    comm = Link(group)
    check("scatter_object_list", comm.group, lambda: (None, {"src": rank_field(src)}))
    op = OPS["scatter_object_list"]
    problem: Optional[CollectiveArgumentError] = None
    root = -1
    try:
        if bad:
            raise arg_error(bad)
        root = check_root(comm, src, "src")
        if _native(comm.driver, map_location, serializer):
            torch_dist.scatter_object_list(
                scatter_object_output_list, cast(Any, scatter_object_input_list), src=src, group=group
            )
            return
        if comm.rank == root:
            inp = scatter_object_input_list
            if not isinstance(inp, Sequence) or isinstance(inp, (str, bytes)) or len(inp) != world:
                got = f"{type(inp).__name__} of length {len(inp)}" if isinstance(inp, Sequence) else repr(inp)
                raise arg_error(
                    f"scatter_object_input_list must be a list of {world} objects on src, got {got}"
                )
    except LocalFailure as fail:
        problem = CollectiveArgumentError(f"scatter_object_list: {fail}")
    # Argument checks need agreement only (no data travels with them): one small exchange.
    agreed = agree("scatter_object_list", group, problem=problem, words=(op, root), driver=comm.driver)
    if not agreed.same:
        raise CollectiveArgumentError(
            "scatter_object_list: ranks disagree on src (group ranks"
            f" {agreed.lowest[1]} to {agreed.highest[1]});"
            " every rank must call scatter_object_list with the same src"
        )
    # src's record: its status (did every item serialize) and the size of each rank's item, in one broadcast.
    frames: list[Frame] = []
    table = 8 * world
    if comm.rank == root:
        try:
            frames = [
                serialize(item, serializer, f"scatter_object_input_list[{i}]")
                for i, item in enumerate(cast(Sequence[Any], scatter_object_input_list))
            ]
            sizes = np.array([f.nbytes for f in frames], dtype="<i8").view(np.uint8)
            inline = sizes if table <= INLINE_BYTES else None
            rec = make_record(op, total=table, root=root, inline=inline)
        except LocalFailure as fail:
            rec = failure_record(op, fail, root=root)
        comm.broadcast(rec, RECORD_BYTES, root)
        raise_failures([parse_record(root, rec)], "scatter_object_list", op, root)
        if table > INLINE_BYTES:
            comm.broadcast(sizes, table, root)
    else:
        source = parse_record(root, comm.broadcast(None, RECORD_BYTES, root))
        raise_failures([source], "scatter_object_list", op, root)
        sizes = source.inline if source.inline is not None else comm.broadcast(None, table, root)
    sizes = sizes.copy().view("<i8")
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
