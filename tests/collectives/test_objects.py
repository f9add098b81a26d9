"""Object collectives on real ranks (gloo and the emulated accelerator), both paths, world sizes 1-3.

Expected values are built in each rank from rank numbers, never taken from hwdist.
The emulated accelerator 'emu' has ``native_object_collectives = False`` and
refuses int64 on the wire, so on 'emu' the portable path runs under the
driver's byte plan; on gloo each check runs once per path ('portable', 'native').

Rows of docs/reliability.md's fault table, at the end: a payload the
destination cannot decode (refused by the restricted serializer, or failing in
the unpickler) in ``gather_object`` and ``collect_results`` over the network:
the destination keeps receiving (drains) and reports the failure in a closing
status, so no sender waits in ``send``; a dead peer (SIGKILL) in
``broadcast_object_list``: the rank that noticed posts a notice on the group's
store (hwdist/collectives/_objwire.py) and every rank waiting in that object
collective raises ``PeerFailure`` (the destination that leaves, and rank 0
dying in ``collect_results``, are in test_results.py). Each check measures how
long each rank took to raise and asserts it is far below the process-group
timeout. Fault injection: a class whose unpickling raises on the destination,
and ``os.kill(SIGKILL)``; torch.distributed is never mocked. Big-endian numpy
arrays keep their byte order through object collectives.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

import hwdist
from hwdist.testing import RankFailure, run_distributed
from hwdist.testing.pytest_plugin import backends, world_sizes

from tests.programs._faults import FAST, PG_TIMEOUT, notices_need_torch_2_4, read_outcomes, timed
from tests.programs._faults import write_outcome

pytestmark = pytest.mark.dist

PATHS = ("portable", "native")


def _obj(rank: int, big: bool = False) -> dict:
    """Rank ``rank``'s object; ``big`` adds arrays/tensors that travel out of band."""
    out = {
        "rank": rank,
        "name": f"r{rank}",
        "none": None,
        "nested": [rank, (rank, "x"), {"k": rank * 2}],
        "t": torch.arange(3, dtype=torch.int64) + rank,
        "arr": np.full(4, rank, dtype=np.float32),
    }
    if big:
        out["big_arr"] = np.full(300_000 + rank * 1000, rank, dtype=np.float64)
        out["big_t"] = torch.full((200, 300 + rank), float(rank), dtype=torch.bfloat16)
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
        )
    return a == b


def _check_all(verified: bool) -> dict:
    """Every object collective, small and large payloads; returns what each check saw."""
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    report = {}
    with hwdist.verification(verified):
        for big in (False, True):
            got = hwdist.all_gather_object(_obj(rank, big))
            assert len(got) == world
            assert all(_same(got[r], _obj(r, big)) for r in range(world)), f"all_gather_object big={big}"
            for dst in range(world):
                got = hwdist.gather_object(_obj(rank, big), dst=dst)
                if rank == dst:
                    assert got is not None and all(_same(got[r], _obj(r, big)) for r in range(world))
                else:
                    assert got is None
            for src in range(world):
                # torch needs equal lengths; the portable path also resizes (checked below)
                data = [_obj(rank, big), "tail"] if rank == src else [None, None]
                hwdist.broadcast_object_list(data, src=src)
                assert len(data) == 2 and _same(data[0], _obj(src, big)) and data[1] == "tail"
                assert _same(
                    hwdist.broadcast_object(_obj(rank, big) if rank == src else None, src=src), _obj(src, big)
                )
                out = [None]
                inp = [_obj(r, big) for r in range(world)] if rank == src else None
                hwdist.scatter_object_list(out, inp, src=src)
                assert _same(out[0], _obj(rank, big))
            # vis4d: rank_zero_return_only
            got = hwdist.all_gather_object(_obj(rank, big), rank_zero_return_only=True)
            assert (got is None) == (rank != 0)
            if rank == 0:
                assert all(_same(got[r], _obj(r, big)) for r in range(world))
        # unequal sizes: one rank big, the others inline-sized
        mixed = _obj(rank, big=(rank == world - 1))
        got = hwdist.all_gather_object(mixed)
        assert all(_same(got[r], _obj(r, big=(r == world - 1))) for r in range(world))
        # mid-sized payloads on every rank (the padded all_gather)
        mid = {"rank": rank, "pad": "y" * (2000 + 100 * rank)}
        got = hwdist.all_gather_object(mid)
        assert got == [{"rank": r, "pad": "y" * (2000 + 100 * r)} for r in range(world)]
        data = ["a", "b", "c"] if rank == 0 else [None]
        hwdist.broadcast_object_list(data, src=0)
        assert data == ["a", "b", "c"]
        report["objects"] = True
    return report


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", world_sizes())
def test_object_collectives(dist, world_size, backend):
    for verified in (True, False):
        results = dist(_check_all, world_size, backend, verified)
        assert all(r["objects"] for r in results)


def _check_tensors_land_on_cpu_and_map_location() -> list:
    rank = hwdist.get_rank()
    got = hwdist.all_gather_object({"t": torch.ones(2) * rank, "p": torch.nn.Parameter(torch.ones(1))})
    devices = [g["t"].device.type for g in got]
    assert all(isinstance(g["p"], torch.nn.Parameter) and g["p"].requires_grad for g in got)
    got = hwdist.all_gather_object(torch.ones(2), map_location="meta")
    return devices + [g.device.type for g in got]


@pytest.mark.parametrize("backend", backends())
def test_tensors_land_on_cpu_or_map_location(dist, backend):
    for devices in dist(_check_tensors_land_on_cpu_and_map_location, 2, backend):
        assert devices == ["cpu", "cpu", "meta", "meta"]


class _Unpicklable:
    def __init__(self) -> None:
        self.lock = threading.Lock()


def _unpicklable_on_last_rank(op: str) -> str:
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    obj = _Unpicklable() if rank == world - 1 else {"ok": rank}
    start = time.monotonic()
    try:
        if op == "all_gather":
            hwdist.all_gather_object(obj)
        elif op == "gather":
            hwdist.gather_object(obj, dst=0)
        elif op == "broadcast":
            hwdist.broadcast_object_list([obj], src=world - 1)
        elif op == "scatter":
            hwdist.scatter_object_list([None], [obj] * world if rank == world - 1 else None, src=world - 1)
        elif op == "collect":
            hwdist.collect_results([{"ok": 1}, obj], size=2 * world)
    except hwdist.SerializationError as exc:
        assert time.monotonic() - start < 10
        assert exc.failures.keys() == {world - 1}
        return str(exc)
    raise AssertionError("no error raised")


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [2, 3])
def test_unpicklable_object_fails_fast_on_every_rank(dist, world_size, backend):
    for op in ("all_gather", "gather", "broadcast", "scatter", "collect"):
        messages = dist(_unpicklable_on_last_rank, world_size, backend, op)
        for msg in messages:
            assert f"rank {world_size - 1}" in msg, msg
            assert "_Unpicklable" in msg and "lock" in msg, msg


def _bad_arguments(verified: bool) -> list:
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    cases = [
        # a bad list on a non-src rank; without verification only src's record travels (one broadcast):
        # that rank raises after taking part, the others complete
        lambda: hwdist.broadcast_object_list("not a list" if rank == 1 else [1], src=0),
        lambda: hwdist.broadcast_object_list("not a list" if rank == 0 else [1], src=0),  # bad on src
        lambda: hwdist.gather_object(1, dst=world if rank == 0 else 0),
        lambda: hwdist.scatter_object_list([None], [1] if rank == 0 else None, src=0),  # wrong length on src
        lambda: hwdist.scatter_object_list([] if rank == 1 else [None], [1] * world if rank == 0 else None),
        lambda: hwdist.all_gather_object(1) if rank == 0 else hwdist.gather_object(1),  # different calls
        # a serializer that is not one, on rank 1 only: named as such, not blamed on the object
        lambda: hwdist.all_gather_object({"t": 1}, serializer="pickle" if rank == 1 else None),
    ]
    seen: list = []
    with hwdist.verification(verified):
        for case in cases:
            try:
                case()
                seen.append(None)
            except (hwdist.CollectiveArgumentError, hwdist.CollectiveMismatch) as exc:
                seen.append((type(exc).__name__, str(exc)))
        # the group still works afterwards
        assert hwdist.all_gather_object(rank) == list(range(world))
    return seen


@pytest.mark.parametrize("backend", backends())
def test_bad_arguments_raise_on_every_rank(dist, backend):
    """Without verification: each rank's bad argument reaches every rank through the records; with it
    (the default), a disagreement in what the ranks called raises CollectiveMismatch first."""
    per_rank = dist(_bad_arguments, 2, backend, False)
    assert per_rank[0][0] is None
    assert per_rank[1][0] == ("ArgumentAssertionError", "broadcast_object_list: data must be a list, got str")
    for msgs in per_rank:
        texts = [m[1] for m in msgs[1:]]
        assert "broadcast_object_list failed on rank(s) 0" in texts[0]
        assert "data must be a list, got str" in texts[0]
        assert "dst=2 is not a rank of the group" in texts[1]
        assert "scatter_object_input_list must be a list of 2 objects" in texts[2]
        assert "scatter_object_output_list must be a non-empty list" in texts[3]
        assert "different object collectives" in texts[4]
        assert "failed on rank(s) 1: rank 1: serializer must be a hwdist Serializer or None" in texts[5]
    for msgs in dist(_bad_arguments, 2, backend, True):
        kinds = [m[0] for m in msgs]
        assert kinds == ["ArgumentAssertionError"] * 2 + ["CollectiveMismatch"] + [
            "CollectiveArgumentError"
        ] * 2 + ["CollectiveMismatch", "CollectiveArgumentError"], msgs
        # a non-list on one rank: every rank learns it from the all-gathered records (an AssertionError, as
        # mmengine's assert, on every rank)
        assert "failed on rank(s) 1" in msgs[0][1] and "data must be a list, got str" in msgs[0][1]
        assert "failed on rank(s) 0" in msgs[1][1] and "data must be a list, got str" in msgs[1][1]
        assert "dst: rank 0: 2; rank 1: 0" in msgs[2][1]
        assert "scatter_object_input_list must be a list of 2 objects" in msgs[3][1]
        assert "scatter_object_output_list must be a non-empty list" in msgs[4][1]
        assert "op: rank 0: all_gather_object; rank 1: gather_object" in msgs[5][1]
        assert "serializer must be a hwdist Serializer or None, got str" in msgs[6][1]


def _restricted_refuses(marker: str) -> list:
    rank = hwdist.get_rank()
    payload = _Evil(marker) if rank == 1 else {"rank": rank, "a": np.arange(3), "t": torch.ones(2)}
    out = []
    with hwdist.use_serializer(hwdist.RestrictedPickleSerializer()):
        try:
            hwdist.all_gather_object(payload)
        except hwdist.UnpicklingRefused as exc:
            out.append(str(exc))
        # allowed content passes
        got = hwdist.all_gather_object({"rank": rank, "a": np.arange(3), "t": torch.ones(2)})
        out.append([g["rank"] for g in got])
    return out


class _Evil:
    """Unpickling this would create ``marker`` (via ``__reduce__``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("backend", backends())
def test_restricted_unpickler_refuses_and_runs_nothing(dist, backend, tmp_path):
    marker = tmp_path / "pwned"
    for out in dist(_restricted_refuses, 2, backend, str(marker)):
        # pickle names open by its module: 'io.open' before Python 3.12, '_io.open' from 3.12
        name = "io.open" if sys.version_info < (3, 12) else "_io.open"
        assert f"refused global '{name}'" in out[0] and "allow-list" in out[0]
        assert out[1] == [0, 1]
    assert not marker.exists()


def _object_to_tensor_roundtrip() -> bool:
    t = hwdist.object_to_tensor({"rank": hwdist.get_rank(), "a": np.arange(5)})
    assert t.dtype == torch.uint8 and t.device == hwdist.get_comm_device()
    back = hwdist.tensor2obj(hwdist.obj2tensor([1, None]))
    assert back == [1, None]
    obj = hwdist.tensor_to_object(t)
    return obj["rank"] == hwdist.get_rank() and obj["a"].tolist() == [0, 1, 2, 3, 4]


def test_object_to_tensor_in_a_group(dist):
    assert dist(_object_to_tensor_roundtrip, 2, "gloo") == [True, True]


def test_non_distributed_semantics():
    # Outside a process group: mmengine's single-process results.
    assert not hwdist.is_distributed()
    data = {"a": 1}
    assert hwdist.all_gather_object(data) == [data]
    assert hwdist.all_gather_object(data, rank_zero_return_only=True) == [data]
    assert hwdist.gather_object(data) == [data]
    lst = ["foo", 12]
    hwdist.broadcast_object_list(lst)
    assert lst == ["foo", 12]
    assert hwdist.broadcast_object(data) is data
    out = [None]
    hwdist.scatter_object_list(out, ["x"])
    assert out == ["x"]
    with pytest.raises(hwdist.CollectiveArgumentError, match="data must be a list, got tuple"):
        hwdist.broadcast_object_list(("a",))


def _scatter_src_disagreement(verified: bool) -> list:
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    out: list = []
    start = time.monotonic()
    try:  # rank 0 says src=0, the others src=1: the records' roots (or verification) disagree
        with hwdist.verification(verified):
            hwdist.scatter_object_list([None], [f"item{i}" for i in range(world)], src=min(rank, 1))
        out.append(None)
    except (hwdist.CollectiveArgumentError, hwdist.CollectiveMismatch) as exc:
        out.append(str(exc))
    assert time.monotonic() - start < 10
    got = [None]
    hwdist.scatter_object_list(
        got, [i * 10 for i in range(world)] if rank == world - 1 else None, src=world - 1
    )
    out.append(got[0])
    return out


@pytest.mark.parametrize("backend", backends())
def test_scatter_object_list_ranks_disagreeing_on_src_raise_on_every_rank(dist, backend):
    for rank, (msg, item) in enumerate(dist(_scatter_src_disagreement, 2, backend, False)):
        assert msg and "ranks disagree on the source/destination rank (rank 0: 0, rank 1: 1)" in msg
        assert item == rank * 10  # the group still works
    for rank, (msg, item) in enumerate(dist(_scatter_src_disagreement, 2, backend, True)):
        assert msg is not None and "src: rank 0: 0; rank 1: 1" in msg, msg
        assert item == rank * 10


class _Calls:
    def __init__(self) -> None:
        self.ops: list = []

    def begin(self, op: str, group: object, args: tuple, kwargs: dict) -> str:
        return op

    def end(self, token: str, error: object) -> None:
        self.ops.append((token, error is None))


def _observed_calls() -> list:
    import shutil

    from hwdist.collectives import call_entry

    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    seen = _Calls()
    call_entry.add_observer(seen)
    try:
        hwdist.all_gather_object(rank)
        hwdist.all_gather_object(rank, rank_zero_return_only=True)  # built on gather_object: seen once
        hwdist.gather_object(rank)
        hwdist.broadcast_object_list([rank])
        hwdist.broadcast_object(rank)  # built on broadcast_object_list: seen once
        hwdist.scatter_object_list([None], list(range(world)) if rank == 0 else None)
        hwdist.collect_results([rank], world)
        tmp = (
            hwdist.create_tmpdir()
        )  # shared by every rank (rank 0 makes it; the ranks may have their own tmp_path)
        hwdist.collect_results_cpu([rank], world, tmp)
        hwdist.collect_results_gpu([rank], world)
    finally:
        call_entry.remove_observer(seen)
    hwdist.barrier()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    return seen.ops


@pytest.mark.parametrize("backend", backends())
def test_every_object_collective_is_one_observed_call(dist, backend):
    expected = [
        "all_gather_object",
        "all_gather_object",
        "gather_object",
        "broadcast_object_list",
        "broadcast_object",
        "scatter_object_list",
        "collect_results",
        "create_tmpdir",
        "collect_results_cpu",
        "collect_results_gpu",
    ]
    for ops in dist(_observed_calls, 2, backend):
        assert ops == [(name, True) for name in expected]


# ---------------------------------------------------------------------------
# faults: a payload the destination cannot decode; a dead peer (every rank raises fast)
# ---------------------------------------------------------------------------
class _NotAllowed:
    """Picklable by plain pickle; refused by the restricted serializer (not on its allow-list)."""

    def __init__(self, size: int) -> None:
        self.pad = b"x" * size


def _explode_on_rank0(pad: bytes) -> bytes:
    if hwdist.get_rank() == 0:
        raise ValueError("this payload cannot be decoded on rank 0")
    return pad


class _FailsToDecode:
    """Serializes fine; unpickling it on rank 0 raises (a decode error with plain pickle)."""

    def __init__(self, size: int) -> None:
        self.pad = b"y" * size

    def __reduce__(self) -> Any:
        return (_explode_on_rank0, (self.pad,))


def _undecodable(op: str, size: int, restricted: bool) -> dict:
    """Rank 1 sends what rank 0 cannot decode; rank 2 (and any other) sends a good payload after it."""
    rank = hwdist.get_rank()
    if rank == 1:
        bad: Any = _NotAllowed(size) if restricted else _FailsToDecode(size)
    else:
        bad = {"rank": rank, "pad": np.zeros(max(1, size // 8))}
    ser = hwdist.RestrictedPickleSerializer() if restricted and rank == 0 else None
    if op == "gather_object":
        outcome = timed(lambda: hwdist.gather_object(bad, dst=0, serializer=ser))
    else:
        outcome = timed(lambda: hwdist.collect_results([bad], hwdist.get_world_size(), serializer=ser))
    # the group is still in step and usable
    t = torch.ones(1)
    hwdist.all_reduce(t)
    return {"outcome": outcome, "after": t.item()}


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("op", ["gather_object", "collect_results"])
def test_undecodable_payload_raises_on_every_rank_fast(dist, backend, op):
    ws = 3
    # big payloads travel point to point after the record exchange (gather_object: over 2 MiB in all),
    # mid-size ones in one padded gather or all_gather, small ones ride in it
    for size, restricted in ((200_000, True), (100, True), (800_000, False)):
        results = dist(_undecodable, ws, backend, op, size, restricted)
        kind0, msg0, secs0 = results[0]["outcome"]
        if restricted:
            assert kind0 == "UnpicklingRefused" and "_NotAllowed" in msg0, results[0]
        else:
            assert kind0 == "ValueError" and "cannot be decoded on rank 0" in msg0, results[0]
        for rank in range(1, ws):
            kind, msg, secs = results[rank]["outcome"]
            assert kind == "ObjectCollectiveError", (size, restricted, rank, results[rank])
            assert "failed on rank(s) 0: rank 0: could not decode the object from rank 1" in msg, msg
            assert secs < FAST, (rank, secs)
        assert secs0 < FAST
        assert all(r["after"] == ws for r in results)


def _bcast_with_dead_peer(outdir: str) -> None:
    """Rank 2 dies; src 0 and rank 1 broadcast a large object (it moves after the record)."""
    hwdist.barrier()
    if hwdist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    data = [np.arange(100_000)] if hwdist.get_rank() == 0 else [None]
    write_outcome(outdir, timed(lambda: hwdist.broadcast_object_list(data, src=0)))


@pytest.mark.slow
@notices_need_torch_2_4
def test_dead_peer_in_broadcast_object_list_every_survivor_raises_fast(tmp_path):
    with pytest.raises(RankFailure, match="root cause: rank 2 died"):
        run_distributed(_bcast_with_dead_peer, 3, "gloo", str(tmp_path), pg_timeout=PG_TIMEOUT, timeout=90)
    got = read_outcomes(tmp_path, (0, 1))
    assert got.keys() == {0, 1}, got  # both survivors raised before the harness's 1.5 s grace ran out
    for rank, (kind, msg, secs) in got.items():
        assert kind != "no error" and secs < FAST, (rank, kind, msg, secs)
    # rank 0 saw the broken connection; rank 1 too (verification all-gathers the records: every rank meets
    # the dead one), or, where only src's record is broadcast, from rank 0's notice
    assert (got[1][0] == "PeerFailure" and "failed on rank 0 of this group" in got[1][1]) or (
        got[1][0] == "RuntimeError" and "Connection" in got[1][1] or "Read error" in got[1][1]
    ), got[1]


# ---------------------------------------------------------------------------
# object round trips keep the dtype, byte order included
# ---------------------------------------------------------------------------
def _arrays(rank: int) -> dict[str, np.ndarray]:
    return {
        "1d >i4": np.arange(3, dtype=">i4") + rank,
        "2d >f8": np.arange(6, dtype=">f8").reshape(2, 3) + rank,
        "transposed >f8": (np.arange(6, dtype=">f8").reshape(2, 3) + rank).T,
        "0-d >i4": np.array(5 + rank, dtype=">i4"),
        "0-d >f8": np.array(0.5 + rank, dtype=">f8"),
        "empty >f8": np.empty(0, dtype=">f8"),
        "empty 2d >i4": np.empty((0, 2), dtype=">i4"),
        "large >i4": np.arange(40_000, dtype=">i4") + rank,
        "record": np.array([(rank, 1.5)], dtype=[("a", ">i4"), ("b", "<f8")]),
        "native 2d": np.arange(6, dtype="<i4").reshape(3, 2) + rank,
    }


def check_byte_orders() -> dict:
    r = hwdist.get_rank()
    out = {}
    for name, ser in (("default", None), ("restricted", hwdist.RestrictedPickleSerializer())):
        got = hwdist.all_gather_object(_arrays(r), serializer=ser)
        box = [_arrays(r)]
        hwdist.broadcast_object_list(box, src=0, serializer=ser)
        out[name] = [
            {k: (a.dtype.descr, a.shape, a.tolist()) for k, a in d.items()} for d in got + box
        ]
    return out


@pytest.mark.parametrize("combo", [(2, "gloo"), (3, "gloo"), (3, "emu")], ids=["2-gloo", "3-gloo", "3-emu"])
def test_object_round_trips_keep_byte_order(dist, combo):
    ws, backend = combo

    def described(rank: int) -> dict:
        return {k: (a.dtype.descr, a.shape, a.tolist()) for k, a in _arrays(rank).items()}

    want = [described(q) for q in range(ws)] + [described(0)]
    for res in dist(check_byte_orders, ws, backend):
        assert res["default"] == want
        assert res["restricted"] == want
