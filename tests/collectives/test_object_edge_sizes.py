"""Object sizes at the edges of the record protocol, table-driven, on real gloo ranks.

Every object collective sends one *record* per rank: the one 1 KiB header of hwdist's protocol, with the
payload inline when it fits (832 bytes); a larger payload moves afterwards at its exact size. The record
size never changes, whatever the group carried before (docs/objects.md, "How an object travels"). The
tables here sit on that edge:

* ``gather_object`` with payloads around and above the record, the destination's payload the largest
  or not, at 2 ranks (``dst=0``) and 3 ranks (``dst=2``), in a fresh group and in one that has just
  carried a 500,000-byte object (an ``all_gather_object`` first). Every rank recomputes what every rank
  sent; the destination must get exactly that.
* Ranks that call different object collectives, after small and after large objects: with
  verification (the default) ``CollectiveMismatch`` naming each rank's call, without it
  ``CollectiveArgumentError: ... ranks called different object collectives``, on every rank, and a
  group that still works afterwards.

The same shapes run in the fuzz (``fuzz_programs.py``, ``edges=True``).
"""

from __future__ import annotations

import os
from typing import Optional

import pytest

import hwdist
from hwdist.testing import RankPool

pytestmark = pytest.mark.dist

TIMEOUT = float(os.environ.get("HWDIST_TEST_TIMEOUT", "240"))
#: The process-group timeout of these pools: a rank left waiting by a broken call gives up after this.
PG_TIMEOUT = 20
#: One all_gather_object of this many bytes grows a group's records past gather_object's 384 KiB cap.
GROWN = 500_000



@pytest.fixture(scope="module")
def gloo():
    """``run(fn, *args, world=2)`` on a pooled gloo group of ``world`` ranks (replaced when broken)."""
    pools: dict[int, RankPool] = {}

    def run(fn, *args, world: int = 2):
        pool = pools.get(world)
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
            pool = pools[world] = RankPool(world, "gloo", timeout=TIMEOUT, pg_timeout=PG_TIMEOUT)
        return pool.run(fn, *args)

    yield run
    for pool in pools.values():
        pool.close()


def payload(rank: int, n: int, tag: int = 0) -> bytes:
    """``n`` bytes that say who sent them (every rank can rebuild every rank's payload)."""
    unit = bytes([(rank * 37 + tag) % 256, (n + tag) % 256, rank % 256, 7])
    return (unit * (n // 4 + 1))[:n]


def _grow_records(world: int) -> None:
    """One all_gather_object of GROWN bytes from rank 0: the group's records grow to carry it."""
    me = hwdist.get_rank()
    got = hwdist.all_gather_object(payload(me, GROWN if me == 0 else 10, 1))
    assert [len(g) for g in got] == [GROWN] + [10] * (world - 1)


def _gather_sizes(sizes: tuple[int, ...], dst: int, grown: bool, repeat: int) -> list:
    me, world = hwdist.get_rank(), hwdist.get_world_size()
    assert len(sizes) == world
    if grown:
        _grow_records(world)
    seen = []
    for call in range(repeat):  # the records learn from each call: later calls take other routes
        got = hwdist.gather_object(payload(me, sizes[me], call), dst=dst)
        want = [payload(r, sizes[r], call) for r in range(world)]
        if me == dst:
            seen.append(got == want or [len(g) if isinstance(g, bytes) else repr(g)[:40] for g in got])
        else:
            seen.append(got is None or f"non-destination got {type(got).__name__}")
    # the group still works, and small objects are right after the large ones
    assert hwdist.all_gather_object(me) == list(range(world))
    return seen


def _case(world: int, dst: int, sizes: tuple[int, ...], grown: bool, defect: Optional[str] = None):
    records = "after a large object" if grown else "fresh group"
    marks = [pytest.mark.xfail(strict=True, reason=defect)] if defect else []
    return pytest.param(world, dst, sizes, grown, marks=marks,
                        id=f"{world}ranks-dst{dst}-{'-'.join(map(str, sizes))}-{records}")  # fmt: skip


# (world, dst, payload bytes per rank, records grown first, the defect it shows if any)
GATHER_TABLE = [
    # around the 1 KiB record (960 bytes of payload fit inline with the header)
    _case(2, 0, (900, 900), False),
    _case(2, 0, (900, 1100), False),
    _case(2, 0, (1100, 900), False),
    _case(2, 0, (1000, 1100), False),
    _case(2, 0, (1100, 1000), False),
    _case(2, 0, (3000, 5000), False),
    _case(2, 0, (5000, 3000), False),
    _case(2, 0, (5000, 5000), False),
    _case(2, 1, (5000, 3000), False),
    _case(3, 2, (3000, 4000, 5000), False, ),
    _case(3, 2, (5000, 4000, 3000), False),
    _case(3, 2, (1100, 1100, 1200), False),
    _case(3, 0, (5000, 100, 3000), False),
    # after the records grew past gather_object's cap
    _case(2, 0, (900, 900), True),
    _case(2, 0, (5000, 3000), True, ),
    _case(2, 0, (3000, 5000), True),
    _case(2, 0, (5000, 5000), True),
    _case(2, 0, (400_000, 300_000), True, ),
    _case(3, 2, (3000, 4000, 5000), True, ),
    _case(3, 2, (5000, 4000, 3000), True),
]


@pytest.mark.parametrize("world, dst, sizes, grown", GATHER_TABLE)
def test_gather_object_payloads_around_the_record(gloo, world, dst, sizes, grown):
    for rank, seen in enumerate(gloo(_gather_sizes, sizes, dst, grown, 3, world=world)):
        assert seen == [True, True, True], f"rank {rank}: {seen}"


# ------------------------------------------------------------------ different collectives on different ranks


def _call(op: str, me: int, world: int) -> None:
    obj = {"rank": me}
    if op == "gather_object":
        hwdist.gather_object(obj, dst=0)
    elif op == "all_gather_object":
        hwdist.all_gather_object(obj)
    elif op == "collect_results":
        hwdist.collect_results([obj], world)
    else:  # broadcast_object_list
        hwdist.broadcast_object_list([obj], src=0)


def _mismatch(ops: tuple[str, ...], grown: bool, verified: bool) -> list:
    me, world = hwdist.get_rank(), hwdist.get_world_size()
    if grown:
        _grow_records(world)
    try:
        with hwdist.verification(verified):
            _call(ops[me], me, world)
        outcome: tuple = ("no error", "")
    except Exception as exc:  # noqa: BLE001 (the type and text are the result)
        outcome = (type(exc).__name__, str(exc))
    return [outcome, hwdist.all_gather_object(me)]  # the group still works


def _mixed(ops: tuple[str, ...], grown: bool, defect: Optional[str] = None):
    marks = [pytest.mark.xfail(strict=True, reason=defect)] if defect else []
    return pytest.param(ops, grown, marks=marks,
                        id=f"{'-vs-'.join(ops)}-{'after a large object' if grown else 'fresh'}")  # fmt: skip


MIXED_TABLE = [
    _mixed(("gather_object", "all_gather_object"), False),
    _mixed(("collect_results", "gather_object"), False),
    _mixed(("gather_object", "all_gather_object"), True),
    _mixed(("all_gather_object", "gather_object"), True),
    _mixed(("collect_results", "gather_object"), True),
    _mixed(("gather_object", "collect_results"), True),
    _mixed(("collect_results", "all_gather_object"), True),
]


@pytest.mark.parametrize("verified", [True, False], ids=["verified", "unverified"])
@pytest.mark.parametrize("ops, grown", MIXED_TABLE)
def test_different_object_collectives_raise_on_every_rank(gloo, ops, grown, verified):
    results = gloo(_mismatch, ops, grown, verified)
    for rank, ((kind, msg), after) in enumerate(results):
        if verified:
            assert kind == "CollectiveMismatch", f"rank {rank}: {kind}: {msg}"
            assert f"op: rank 0: {ops[0]}; rank 1: {ops[1]}" in msg, f"rank {rank}: {msg}"
        else:
            assert kind == "CollectiveArgumentError", f"rank {rank}: {kind}: {msg}"
            assert "ranks called different object collectives" in msg, f"rank {rank}: {msg}"
        assert after == [0, 1], f"rank {rank}: the group broke: {after}"
