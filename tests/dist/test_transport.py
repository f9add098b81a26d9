"""hwdist's internal transport and agreement primitive, on real ranks.

Every other module's own traffic (shape exchanges, records, digests, the
launcher's node table) goes through these functions, so they are checked here
on their own with values that differ per rank.
"""

from __future__ import annotations

import pytest

import hwdist
from hwdist.collectives import consensus, transport
from hwdist.testing.pytest_plugin import backends, world_sizes


def _transport_rank():
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    out = {}
    out["ints"] = transport.gather_ints([rank, rank * 10, -rank], None)
    out["bytes"] = transport.gather_bytes(b"x" * (rank * 7 + 1), None)
    out["empty"] = transport.gather_bytes(b"", None)
    out["bcast"] = transport.broadcast_bytes(b"hello from the last" if rank == world - 1 else None, world - 1)
    out["maxmin"] = transport.max_and_min([rank, 5 - rank], None, world, hwdist.resolve())
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", world_sizes())
def test_transport_moves_what_each_rank_gave(dist, world_size, backend):
    for res in dist(_transport_rank, world_size, backend):
        assert res["ints"] == [[r, r * 10, -r] for r in range(world_size)]
        assert res["bytes"] == [b"x" * (r * 7 + 1) for r in range(world_size)]
        assert res["empty"] == [b""] * world_size
        assert res["bcast"] == b"hello from the last"
        assert res["maxmin"] == ([world_size - 1, 5], [0, 5 - (world_size - 1)])


def _agree_rank(bad_rank: int):
    rank = hwdist.get_rank()
    out = {}
    got = consensus.agree("op", None, words=[7, rank % 2], flag=rank)
    out["flag"], out["same"] = got.flag, got.same
    problem = ValueError("x must be positive, got -1") if rank == bad_rank else None
    try:
        consensus.agree("op", None, problem=problem, words=[1])
        out["raised"] = None
    except Exception as exc:  # noqa: BLE001 - the test compares the type and text
        out["raised"] = (
            type(exc).__name__,
            str(exc),
            isinstance(exc, ValueError),
            isinstance(exc, hwdist.HwdistError),
        )
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_agree_raises_on_every_rank_naming_the_bad_one(dist, world_size, backend):
    bad = world_size - 1
    for rank, res in enumerate(dist(_agree_rank, world_size, backend, bad)):
        assert res["flag"] == world_size - 1
        assert res["same"] is False  # rank % 2 differs
        name, text, is_value_error, is_hwdist = res["raised"]
        assert is_value_error
        if rank == bad:
            assert (name, text) == ("ValueError", "x must be positive, got -1")
        else:
            assert name == "CollectiveArgumentError" and is_hwdist
            assert (
                f"op: rank {bad} was given invalid arguments (ValueError: x must be positive, got -1)" in text
            )


def _reducer_rank(gather_limit):
    import dataclasses
    import gc
    import time
    import weakref

    import torch

    from hwdist.drivers import tuning

    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    driver = hwdist.resolve()
    old = tuning.tuning(driver)
    # both routes on every backend: the gather route (limit large) and one all_reduce (limit 0)
    tuning.set_tuning(driver.name, dataclasses.replace(old, reduce_by_gather_max_bytes=gather_limit))
    try:
        out = {}
        like = torch.zeros(3, 2, dtype=torch.int32)
        reducer = transport.FlatReducer(like, "sum", None, world, driver)
        out["route"] = "gather" if reducer.gathered is not None else "all_reduce"
        sums = []
        for step in range(3):  # one reducer, many calls: new values each call (nothing stale kept)
            buf = torch.arange(6, dtype=torch.int32).reshape(3, 2) * (rank + 1) + step
            reducer(buf)
            sums.append(buf.tolist())
        out["sums"] = sums
        probe = torch.ones(3, 2, dtype=torch.int32)
        reducer(probe)
        ref = weakref.ref(probe)
        del probe
        # the reducer must not hold the caller's buffer. torch's gloo worker thread may still hold its
        # finished Work (and so the buffer) for a moment after the call returned: wait up to 2 s
        for _ in range(200):
            gc.collect()
            if ref() is None:
                break
            time.sleep(0.01)
        out["kept"] = ref() is not None
        out["current"] = reducer.current()
        tuning.set_tuning(driver.name, tuning.tuning(driver))  # any set_tuning: the route may be stale
        out["current_after_set"] = reducer.current()
        maxed = torch.tensor([float(rank), -float(rank)])
        transport.FlatReducer(maxed, "max", None, world, driver)(maxed)  # one reducer for one call
        out["max"] = maxed.tolist()
        return out
    finally:
        tuning.set_tuning(driver.name, old)


@pytest.mark.parametrize("gather_limit", [1 << 20, 0], ids=["gather-route", "all-reduce-route"])
@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", world_sizes())
def test_flat_reducer_reused_across_calls(dist, world_size, backend, gather_limit):
    """A kept FlatReducer gives each call's own sums (N-D buffers, both routes) and keeps no buffer."""
    tri = world_size * (world_size + 1) // 2  # sum over ranks of (rank + 1)
    for res in dist(_reducer_rank, world_size, backend, gather_limit):
        assert res["route"] == ("all_reduce" if gather_limit == 0 else "gather")
        for step, got in enumerate(res["sums"]):
            assert got == [[v * tri + step * world_size for v in (2 * i, 2 * i + 1)] for i in range(3)]
        assert res["kept"] is False
        assert res["current"] is True and res["current_after_set"] is False
        assert res["max"] == [float(world_size - 1), 0.0]


def _dict_across_tuning_rank():
    import dataclasses

    import torch

    from hwdist.drivers import tuning

    import torch.distributed as tdist

    rank = hwdist.get_rank()
    driver = hwdist.resolve()
    old = tuning.tuning(driver)
    real = tdist.all_reduce
    counted = []

    def counting(*args, **kwargs):  # observes which route a call took (the collective still runs)
        counted.append(1)
        return real(*args, **kwargs)

    sums, routes = [], []
    tdist.all_reduce = counting
    try:
        for step, limit in enumerate([1 << 20, 1 << 20, 0, 0, 1 << 20]):  # the route changes between calls
            tuning.set_tuning(driver.name, dataclasses.replace(old, reduce_by_gather_max_bytes=limit))
            d = {"a": torch.tensor(float(rank + step)), "b": torch.tensor(2.0 * rank)}
            before = len(counted)
            hwdist.all_reduce_dict(d)
            routes.append(len(counted) > before)
            sums.append((d["a"].item(), d["b"].item()))
    finally:
        tdist.all_reduce = real
        tuning.set_tuning(driver.name, old)
    return sums, routes


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_all_reduce_dict_follows_set_tuning_between_calls(dist, world_size, backend):
    """all_reduce_dict keeps a reducer per layout; a set_tuning between calls remakes it (no stale route)."""
    ranks = sum(range(world_size))
    for sums, routes in dist(_dict_across_tuning_rank, world_size, backend):
        assert sums == [(float(ranks + step * world_size), 2.0 * ranks) for step in range(5)]
        # one layout throughout; only the route changes: an all_reduce exactly where the limit is 0
        assert routes == [False, False, True, True, False]
