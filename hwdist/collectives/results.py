"""Results collection (mmengine's ``collect_results``) and a shared temporary directory.

Items come back in mmengine's interleaved sampler order (rank ``r`` holds
items ``r, r + W, ...``), truncated to ``size``; ``None`` results are kept and
parts may differ in length. Over communication each rank serializes its part
in chunks of about ``CHUNK_BYTES`` and sends one record (the part itself when
it fits), then its chunks point to point; rank 0 decodes one chunk at a time.
Through ``tmpdir``, a probe file first checks that the directory is shared,
parts are written atomically into a private sub-directory that is removed
even on error. docs/objects.md.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from itertools import chain
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import CollectiveArgumentError, ObjectCollectiveError
from .. import serialization as _ser
from ..serialization import weights_only as _weights_only
from .call_entry import collective
from ._objwire import ARGUMENT, CONFIRM, INLINE_BYTES, IO, OPS, REFUSED, SERIALIZE, Decoder, Link, world_size
from ._objwire import LocalFailure, closing_status, decode, describe, failure_record, make_record, may_refuse
from ..serialization import Frame, MapLocation, Serializer

__all__ = ["collect_results", "collect_results_cpu", "collect_results_gpu", "create_tmpdir"]

#: Target size of one serialized chunk of results (bytes).
CHUNK_BYTES = 16 << 20
_FIRST_CHUNK = 64  # items in the first chunk, which measures the size of an item
#: Mode of the directories hwdist creates (the ranks of one job run as one user).
_PRIVATE = 0o700


# ---- helpers ------------------------------------------------------------------------------


def _check_args(result_part: Any, size: Any) -> list[Any]:
    if not isinstance(result_part, Sequence) or isinstance(result_part, (str, bytes)):
        raise LocalFailure(ARGUMENT, f"results must be a list, got {type(result_part).__name__}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise LocalFailure(ARGUMENT, f"size must be a non-negative int, got {type(size).__name__}: {size!r}")
    return result_part if isinstance(result_part, list) else list(result_part)


def _local(result_part: Any, size: Any) -> list[Any]:
    """Non-distributed result (mmengine): ``result_part[:size]``, bad input raised here."""
    try:
        part = _check_args(result_part, size)
    except LocalFailure as fail:
        raise CollectiveArgumentError(f"collect_results: {fail}") from None
    return part[: int(size)]


def _interleave(parts: Sequence[Sequence[Any]], size: int) -> list[Any]:
    """Items in sampler order (part r holds items r, r+W, ...), truncated to ``size``."""
    lengths = {len(p) for p in parts}
    if len(lengths) == 1:
        out = list(chain.from_iterable(zip(*parts)))
    else:
        out = []
        for i in range(max(lengths)):
            for p in parts:
                if i < len(p):
                    out.append(p[i])
    del out[size:]
    return out


def _encode_chunks(items: list[Any], serializer: Optional[Serializer], target: int) -> list[Frame]:
    """Serialize ``items`` as a few lists of about ``target`` bytes each (at least one frame)."""
    frames: list[Frame] = []
    i, step = 0, min(len(items), _FIRST_CHUNK)
    if not items:
        return [_ser.encode([], serializer)]
    while i < len(items):
        chunk = items[i : i + step]
        try:
            frame = _ser.encode(chunk, serializer)
        except Exception as exc:
            raise LocalFailure(SERIALIZE, _which_item(chunk, i, serializer, exc)) from exc
        if _weights_only.check_own(frame, serializer) is not None:  # weights_only=True: refused on every rank
            raise LocalFailure(REFUSED, _refused_item(chunk, i, serializer))
        frames.append(frame)
        i += len(chunk)
        per_item = max(1.0, frame.nbytes / len(chunk))
        step = max(1, int(target // per_item))
    return frames


def _which_item(chunk: list[Any], start: int, serializer: Optional[Serializer], exc: BaseException) -> str:
    for j, item in enumerate(chunk):
        try:
            _ser.encode(item, serializer)
        except Exception as inner:
            return describe(inner, item, serializer, f"result item {start + j} (of its part)")
    return describe(exc, chunk, serializer, "its results")


def _refused_item(chunk: list[Any], start: int, serializer: Optional[Serializer]) -> str:
    for j, item in enumerate(chunk):
        why = _weights_only.check_own(_ser.encode(item, serializer), serializer)
        if why is not None:
            kind = type(item).__qualname__
            return f"result item {start + j} (of its part) of type '{kind}' is refused: {why}"
    return "its results are refused"  # pragma: no cover (a refused chunk holds a refused item)


def _part_record(op: int, frames: list[Frame]) -> np.ndarray:
    """This rank's record: its chunk count and size, and the part itself when it is one small chunk."""
    total = sum(f.nbytes for f in frames)
    if len(frames) == 1 and total <= INLINE_BYTES:
        return make_record(op, total=total, nchunks=1, root=0, inline=frames[0].to_numpy())
    return make_record(op, total=total, nchunks=len(frames), root=0)


def _status(op: int, problem: Optional[str] = None) -> np.ndarray:
    """A status record to rank 0's collective: fine, or the filesystem ``problem`` (an ``IO`` failure)."""
    if problem:
        return failure_record(op, LocalFailure(IO, problem), root=0)
    return make_record(op, root=0)


def _chunk_table(frames: list[Frame]) -> np.ndarray:
    return np.array([f.nbytes for f in frames], dtype="<i8").view(np.uint8)


# ---- over communication ------------------------------------------------------------------


def _collect_comm(
    result_part: Any,
    size: Any,
    group: Any,
    what: str,
    serializer: Optional[Serializer],
    map_location: MapLocation,
    bad: str = "",
) -> Optional[list[Any]]:
    comm = Link(group)
    comm.verify("collect_results", {"size": repr(size), "transport": "communication"})
    op = OPS["collect_results"]
    frames: list[Frame] = []
    part: list[Any] = []
    try:
        if bad:
            raise LocalFailure(ARGUMENT, bad)
        part = _check_args(result_part, size)
        if comm.rank != 0:
            frames = _encode_chunks(part, serializer, CHUNK_BYTES)
            rec = _part_record(op, frames)
        else:
            rec = make_record(op, root=0, token=CONFIRM if may_refuse(serializer) else 0)
    except LocalFailure as fail:
        rec = failure_record(op, fail, root=0)
    # One record per rank: a part of one small chunk travels in it; a larger one moves point to point
    # to rank 0 below.
    records = comm.exchange(rec, what, op, 0)
    p2p = comm.has("send") and comm.has("recv")
    parts: list[list[Any]] = [part] + [[] for _ in range(comm.world - 1)]
    me = comm.rank
    decoder = Decoder(serializer, map_location, comm)  # a refused chunk: keep receiving, report at the end
    for r in records[1:]:
        if r.inline is not None:
            if me == 0:
                parts[r.rank] = decoder(r.rank, r.inline.copy()) or []
            continue
        nbytes = 8 * r.nchunks
        if p2p:
            if me == r.rank:
                comm.send(_chunk_table(frames), 0)
                for f in frames:
                    comm.send(f.to_numpy(), 0)
            elif me == 0:
                table = comm.recv(nbytes, r.rank).view("<i8").tolist()
                for n in table:
                    parts[r.rank].extend(decoder(r.rank, comm.recv(int(n), r.rank)) or [])
        else:  # no point to point: broadcast chunk by chunk, only rank 0 keeps them
            mine = _chunk_table(frames) if me == r.rank else None
            table = comm.broadcast(mine, nbytes, r.rank).view("<i8").tolist()
            for k, n in enumerate(table):
                buf = comm.broadcast(frames[k].to_numpy() if me == r.rank else None, int(n), r.rank)
                if me == 0:
                    parts[r.rank].extend(decoder(r.rank, buf) or [])
    closing_status(comm, records, 0, decoder, what, op, moved=any(r.inline is None for r in records[1:]))
    if me != 0:
        return None
    return _interleave(parts, int(size))


# ---- through a shared directory -------------------------------------------------------------


def _read_part(
    path: str, nchunks: int, serializer: Optional[Serializer], map_location: MapLocation
) -> list[Any]:
    items: list[Any] = []
    with open(path, "rb") as fh:
        for _ in range(nchunks):
            head = np.empty(64, dtype=np.uint8)
            if fh.readinto(memoryview(head)) != head.size:  # type: ignore[arg-type]
                raise EOFError(f"result part file {path!r} is truncated")
            total = _ser.frame_length(head)
            buf = np.empty(total, dtype=np.uint8)
            buf[:64] = head
            if fh.readinto(memoryview(buf)[64:]) != total - 64:  # type: ignore[arg-type]
                raise EOFError(f"result part file {path!r} is truncated")
            items.extend(decode(buf, serializer, map_location))
    return items


def _write_atomic(path: str, chunks: Sequence[Any]) -> None:
    """``chunks`` written under a temporary name, then renamed to ``path`` (removed on failure)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _workdir(tmpdir: str, token: int) -> str:
    return os.path.join(tmpdir, f"hwdist-collect-{token:016x}")


def _probe_ok(path: str, token: int) -> Optional[str]:
    try:
        with open(path) as fh:
            content = fh.read().strip()
    except OSError as exc:
        return f"cannot read rank 0's probe file {path!r}: {exc.strerror or exc}"
    if content != f"{token:016x}":
        return f"the probe file {path!r} holds another token: a different directory with the same path"
    return None


def _not_shared(tmpdir: str, why: str) -> str:
    return (
        f"tmpdir {tmpdir!r} is not shared with rank 0 ({why}); checked before any rank wrote results."
        " Use a directory on a filesystem every rank sees, or tmpdir=None to collect over communication"
    )


def _collect_files(
    result_part: Any,
    size: Any,
    tmpdir: Any,
    group: Any,
    serializer: Optional[Serializer],
    map_location: MapLocation,
) -> Optional[list[Any]]:
    comm = Link(group)
    op = OPS["collect_results(tmpdir)"]
    what = "collect_results(device='cpu', tmpdir=...)"
    comm.verify("collect_results(tmpdir)", {"size": repr(size), "transport": "tmpdir"})
    me = comm.rank
    frames: list[Frame] = []
    part: list[Any] = []
    workdir: Optional[str] = None
    created: Optional[str] = None
    shared_token = 0  # rank 0's token (never 0), once every rank knows it
    try:
        try:
            part = _check_args(result_part, size)
            if not isinstance(tmpdir, (str, os.PathLike)):
                raise LocalFailure(ARGUMENT, _not_a_path(tmpdir))
            tmpdir = os.fspath(tmpdir)
            token = 0
            if me != 0:
                frames = _encode_chunks(part, serializer, CHUNK_BYTES)
            else:
                token = secrets.randbits(62) | 1
                try:
                    if not os.path.isdir(tmpdir):
                        os.makedirs(tmpdir, mode=_PRIVATE, exist_ok=True)
                        created = tmpdir
                    workdir = _workdir(tmpdir, token)
                    os.mkdir(workdir, mode=_PRIVATE)
                    _write_atomic(os.path.join(workdir, "probe"), [f"{token:016x}\n".encode()])
                except OSError as exc:
                    raise LocalFailure(
                        IO, f"cannot create a working directory in tmpdir {tmpdir!r}: {exc}"
                    ) from exc
            rec = make_record(
                op, total=sum(f.nbytes for f in frames), nchunks=len(frames), root=0, token=token
            )
        except LocalFailure as fail:
            rec = failure_record(op, fail, root=0)
        records = comm.exchange(rec, what, op, 0)
        token = records[0].token
        shared_token = token
        # 1. is the directory shared? (nobody has written results yet)
        why = _probe_ok(os.path.join(_workdir(tmpdir, token), "probe"), token) if me != 0 else None
        comm.exchange(_status(op, why and _not_shared(tmpdir, why)), what, op, 0)
        # 2. write the parts (atomically), then tell everyone how it went
        problem = None
        if me != 0:
            try:
                path = os.path.join(_workdir(tmpdir, token), f"part_{me}.bin")
                _write_atomic(path, [f.to_numpy().data for f in frames])
            except OSError as exc:
                problem = f"cannot write its results into {tmpdir!r}: {exc}"
        frames = []
        comm.exchange(_status(op, problem), what, op, 0)
        # 3. rank 0 reads the parts while the others wait for its status: if it dies or fails
        # there, they know, and clean up (below) instead of leaving their parts behind
        parts: list[list[Any]] = [part]
        status = _status(op)
        read_error: Optional[BaseException] = None
        if me == 0:
            assert workdir is not None
            try:
                for r in records[1:]:
                    parts.append(
                        _read_part(
                            os.path.join(workdir, f"part_{r.rank}.bin"), r.nchunks, serializer, map_location
                        )
                    )
            except Exception as exc:
                read_error = exc
                status = _status(op, f"could not read the results: {type(exc).__name__}: {exc}")
            except BaseException as exc:  # KeyboardInterrupt & co.: the others must not wait for the status
                comm.post_failure(f"{type(exc).__name__} while reading the results")
                raise
        try:
            comm.exchange(status, what, op, 0)
        except ObjectCollectiveError:
            if read_error is None:
                raise
        if read_error is not None:
            raise read_error
        return _interleave(parts, int(size)) if me == 0 else None
    except BaseException:
        if me != 0 and shared_token:  # rank 0 may be gone: remove what this rank can see
            shutil.rmtree(_workdir(tmpdir, shared_token), ignore_errors=True)
        raise
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        if created is not None:
            try:
                os.rmdir(created)
            except OSError:
                pass


# ---- public ------------------------------------------------------------------------------------


@collective(4)
def collect_results(
    results: list[Any],
    size: int,
    device: str = "cpu",
    tmpdir: Optional[str] = None,
    *,
    group: Optional[Any] = None,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
) -> Optional[list[Any]]:
    """Collect every rank's results on rank 0, in sampler order, truncated to ``size``.

    Outside a process group returns ``results[:size]`` (mmengine).

    Args:
        results: this rank's results; rank ``r`` holds items ``r, r+W, r+2W, ...``.
        size: number of results wanted (the dataset length; drops sampler padding).
        device: ``'cpu'`` (through ``tmpdir`` if given, else over communication)
            or ``'gpu'`` (over communication on the backend's device).
        tmpdir: a directory every rank sees; ``device='cpu'`` only.
        group: process group (default group if None); its rank 0 collects.
        map_location: device for tensors inside the results (default CPU).
        serializer: default: [`hwdist.get_serializer`][hwdist.serialization.serializers.get_serializer].
        weights_only: as the object collectives' (torch's keyword): True reads only safe types.

    Returns:
        The ordered results on rank 0, None elsewhere.

    Raises:
        CollectiveArgumentError: bad arguments on any rank (raised on every rank).
        SerializationError: a result could not be serialized on some rank
            (raised on every rank, naming the rank, the item and its type).
        ObjectCollectiveError: ``tmpdir`` is not shared by all ranks, or writing failed.

    Examples:
        >>> part = ["foo", {1: 2}] if hwdist.get_rank() == 0 else [24, {"a": "b"}]
        >>> hwdist.collect_results(part, size=4)
        ['foo', 24, {1: 2}, {'a': 'b'}]   # rank 0
        None                              # rank 1
    """
    serializer = _weights_only.for_call(serializer, weights_only, "collect_results")
    bad = ""
    if device not in ("cpu", "gpu"):
        bad = f"device must be 'cpu' or 'gpu', got {device!r}"
    elif device == "gpu" and tmpdir is not None:
        bad = f"tmpdir must be None when device='gpu', got {tmpdir!r}"
    if world_size(group) == 1:
        if bad:
            raise CollectiveArgumentError(f"collect_results: {bad}")
        return _local(results, size)
    if bad:
        return _collect_comm(results, size, group, "collect_results", serializer, map_location, bad)
    if device == "cpu" and tmpdir is not None:
        return _collect_files(results, size, tmpdir, group, serializer, map_location)
    return _collect_comm(results, size, group, "collect_results", serializer, map_location)


@collective(3)
def collect_results_cpu(
    result_part: list[Any],
    size: int,
    tmpdir: Optional[str] = None,
    *,
    group: Optional[Any] = None,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
) -> Optional[list[Any]]:
    """[`collect_results`][hwdist.collectives.results.collect_results] with ``device='cpu'``.

    Through ``tmpdir`` if given, else over communication.

    Examples:
        >>> hwdist.collect_results_cpu([hwdist.get_rank()] * 2, size=4, tmpdir="/shared/tmp")
        [0, 1, 0, 1]   # rank 0
        None           # rank 1
    """
    return collect_results(
        result_part, size, "cpu", tmpdir, group=group, map_location=map_location, serializer=serializer,
        weights_only=weights_only,
    )  # fmt: skip


@collective(2)
def collect_results_gpu(
    result_part: list[Any],
    size: int,
    *,
    group: Optional[Any] = None,
    map_location: MapLocation = None,
    serializer: Optional[Serializer] = None,
    weights_only: bool = False,
) -> Optional[list[Any]]:
    """[`collect_results`][hwdist.collectives.results.collect_results] over communication (mmengine's gpu).

    The bytes travel on the backend's communication device.

    Examples:
        >>> hwdist.collect_results_gpu([hwdist.get_rank()], size=2)
        [0, 1]   # rank 0
        None     # rank 1
    """
    return collect_results(
        result_part, size, "gpu", None, group=group, map_location=map_location, serializer=serializer,
        weights_only=weights_only,
    )  # fmt: skip


def _not_a_path(tmpdir: Any) -> str:
    return f"tmpdir must be a path (str), got {type(tmpdir).__name__}"


@collective(2)
def create_tmpdir(
    rank: Optional[int] = None, tmpdir: Optional[str] = None, *, group: Optional[Any] = None
) -> str:
    """One temporary directory, created by rank 0 and checked to be visible on every rank (vis4d).

    Args:
        rank: accepted for vis4d compatibility; the group's own rank is used.
        tmpdir: the directory to use (created if missing); default: a new
            ``tempfile.mkdtemp()`` on rank 0 whose path is sent to all ranks.
        group: process group (default group if None).

    Returns:
        The directory path, the same on every rank.

    Raises:
        ObjectCollectiveError: some rank cannot see the directory (raised on every rank).
        TypeError: ``tmpdir`` is not a path (on every rank: a
            [`CollectiveArgumentError`][hwdist.collectives.objects.CollectiveArgumentError] where the
            group has more than one rank).

    Examples:
        >>> hwdist.create_tmpdir()
        '/tmp/hwdist-k2j3h4'   # rank 0
        '/tmp/hwdist-k2j3h4'   # rank 1
    """
    del rank
    if world_size(group) == 1:
        if tmpdir is not None and not isinstance(tmpdir, (str, os.PathLike)):
            raise TypeError(f"create_tmpdir: {_not_a_path(tmpdir)}")
        if tmpdir is None:
            return tempfile.mkdtemp(prefix="hwdist-")
        os.makedirs(tmpdir, mode=_PRIVATE, exist_ok=True)
        return os.fspath(tmpdir)
    comm = Link(group)
    comm.verify("create_tmpdir", {"tmpdir_given": tmpdir is not None})
    op = OPS["create_tmpdir"]
    what = "create_tmpdir"
    probe: Optional[str] = None
    try:
        path = ""
        bad: Optional[LocalFailure] = None
        if tmpdir is not None and not isinstance(tmpdir, (str, os.PathLike)):
            bad = LocalFailure(ARGUMENT, _not_a_path(tmpdir))
        elif tmpdir is not None:
            path = os.fspath(tmpdir)
        if bad is not None:  # in the exchange, so that every rank raises
            rec = failure_record(op, bad, root=0)
        elif comm.rank == 0:
            token = secrets.randbits(62) | 1
            try:
                if tmpdir is None:
                    path = tempfile.mkdtemp(prefix="hwdist-")
                else:
                    os.makedirs(path, mode=_PRIVATE, exist_ok=True)
                probe = os.path.join(path, f".hwdist-probe-{token:016x}")
                _write_atomic(probe, [f"{token:016x}\n".encode()])
                raw = np.frombuffer(path.encode(), dtype=np.uint8)
                if raw.size > INLINE_BYTES:
                    raise LocalFailure(ARGUMENT, f"tmpdir path is longer than {INLINE_BYTES} bytes: {path!r}")
                rec = make_record(op, root=0, token=token, inline=raw)
            except OSError as exc:
                rec = _status(op, f"cannot create tmpdir {path!r}: {exc}")
            except LocalFailure as fail:
                rec = failure_record(op, fail, root=0)
        else:
            rec = make_record(op, root=0)
        records = comm.exchange(rec, what, op, 0)
        head = records[0]
        if tmpdir is None:
            path = bytes(head.inline).decode() if head.inline is not None else ""
        why = None
        if comm.rank != 0:
            why = _probe_ok(os.path.join(path, f".hwdist-probe-{head.token:016x}"), head.token)
        try:
            problem = why and f"directory {path!r} is not shared with rank 0 ({why})"
            comm.exchange(_status(op, problem), what, op, 0)
        except BaseException:
            if comm.rank == 0 and tmpdir is None and path:
                shutil.rmtree(path, ignore_errors=True)
            raise
        return path
    finally:
        if probe is not None:
            try:
                os.unlink(probe)
            except OSError:
                pass
