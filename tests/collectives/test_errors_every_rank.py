"""Clear errors, raised alike on every rank, where a call cannot go on: on real gloo ranks.

* ``collect_results(..., weights_only=True)`` where a rank's results hold a type allowed nowhere: each
  sender reads its own items back through the restricted loader before it sends them (as the other
  object collectives do), so every rank raises ``WeightsOnlyRefused`` naming the rank, the item and
  the type, through communication and through ``tmpdir`` alike.
* A group whose only backend serves a device this machine lacks (a backend registered with torch for
  ``hpu``, which torch knows without its hardware): every operation raises ``BackendError`` naming the
  device-to-backend map, the device and the fix, on every rank, before anything is sent.
* ``broadcast_object_list`` checks ``src`` as ``broadcast`` does: the same words, on every rank that
  passed it, in a group of one too.
"""

from __future__ import annotations

import builtins
import os
import pickle
import time

import pytest
import torch
import torch.distributed as dist

import hwdist
from hwdist import _compat
from hwdist.testing import RankPool
from hwdist.testing.pytest_plugin import one_backend

pytestmark = pytest.mark.dist

TIMEOUT = float(os.environ.get("HWDIST_TEST_TIMEOUT", "240"))


class Nowhere:
    """A user type no allow-list names."""

    def __init__(self, x: int) -> None:
        self.x = x


# ------------------------------------------------------------------ collect_results(weights_only=True)


def _part(rank: int, bad: int, big: bool) -> list:
    """Rank ``rank``'s results; rank ``bad`` holds a ``Nowhere`` at its item 1 (global item 1 * W + bad)."""
    pad = bytes(5000) if big else b""  # big: the part does not fit its 1 KiB record
    return [{"i": rank, "pad": pad}, Nowhere(rank) if rank == bad else {"i": rank + 10}]


def _collect_refused(tmp: str) -> list:
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    bad = world - 1
    out = []
    for big in (False, True):
        for where in (None, os.path.join(tmp, f"shared-{big}")):
            part = _part(rank, bad, big)
            start = time.monotonic()
            try:
                hwdist.collect_results(part, 2 * world, tmpdir=where, weights_only=True)
                out.append(("no error", "", 0.0))
            except Exception as exc:  # noqa: BLE001 (the type and text are the result)
                right = isinstance(exc, (hwdist.WeightsOnlyRefused, pickle.UnpicklingError))
                out.append((type(exc).__name__ if right else f"wrong type {type(exc).__name__}", str(exc),
                            time.monotonic() - start))  # fmt: skip
            # the group still works, and a good collection after it is right
            good = hwdist.collect_results([rank], world, weights_only=True)
            assert good == (list(range(world)) if rank == 0 else None), good
    return out


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", [2, 3])
def test_collect_results_weights_only_refuses_a_type_allowed_nowhere_on_every_rank(
    dist, world_size, backend, tmp_path
):
    """Before the fix: rank 0 raised ``UnpicklingRefused`` while decoding, the others
    ``ObjectCollectiveError``."""
    per_rank = dist(_collect_refused, world_size, backend, str(tmp_path))
    bad = world_size - 1
    for seen in per_rank:
        assert len(seen) == 4
        for kind, msg, seconds in seen:
            assert kind == "WeightsOnlyRefused", (kind, msg)
            assert f"rank(s) {bad}" in msg and "result item 1 (of its part)" in msg, msg
            assert "Nowhere" in msg and "add_safe_globals" in msg, msg
            assert seconds < 30, msg
    for i in range(4):  # the same words on every rank
        assert len({seen[i][1] for seen in per_rank}) == 1, [seen[i][1] for seen in per_rank]


# ------------------------------------------------------------------ a backend for a device this machine lacks


@pytest.fixture(scope="module")
def ranks():
    """``run(fn, *args)``: ``fn`` on 2 live ranks without a process group (each ``fn`` makes its own)."""
    pool = None

    def run(fn, *args):
        nonlocal pool
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
            pool = RankPool(2, None, timeout=TIMEOUT, pg_timeout=60)
        return pool.run(fn, *args)

    yield run
    if pool is not None:
        pool.close()


MISSING_DEVICE_BACKEND = "hpuonly"


def _create(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _error(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 (the type and text are the result)
        return type(exc).__name__, str(exc), time.monotonic() - start
    return None


def _every_op() -> dict:
    t = lambda: torch.ones(2)  # noqa: E731
    me = dist.get_rank()
    calls = {
        "all_reduce": lambda: hwdist.all_reduce(t()),
        "broadcast": lambda: hwdist.broadcast(t(), src=0),
        "all_gather": lambda: hwdist.all_gather(t()),
        "barrier": hwdist.barrier,
        "all_reduce_dict": lambda: hwdist.all_reduce_dict({"loss": t()}),
        "all_gather_object": lambda: hwdist.all_gather_object(me),
        "gather_object": lambda: hwdist.gather_object(me),
        "broadcast_object_list": lambda: hwdist.broadcast_object_list([me]),
        "collect_results": lambda: hwdist.collect_results([me], 2),
        "sync_random_seed": hwdist.sync_random_seed,
    }
    return {op: _error(call) for op, call in calls.items()}


def _rank_missing_device(store: str) -> dict:
    if MISSING_DEVICE_BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(MISSING_DEVICE_BACKEND, _create, devices=["hpu"])
    rank = int(os.environ["RANK"])
    dist.init_process_group(f"hpu:{MISSING_DEVICE_BACKEND}", init_method=f"file://{store}", rank=rank,
                            world_size=2)  # fmt: skip
    try:
        # rank 1 alone first: were anything sent, its first call would wait for rank 0 (60 s timeout)
        alone = _every_op() if rank == 1 else None
        return {"alone": alone, "both": _every_op()}
    finally:
        hwdist.destroy()


def test_a_group_whose_backend_serves_a_missing_device_is_refused_on_every_rank(ranks, tmp_path):
    """Before the fix: ``AttributeError: 'NoneType' object has no attribute 'current_device'`` from every
    operation, and torch's ``No backend type associated with device type cpu`` from ``barrier``."""
    if not _compat.REGISTER_BACKEND_HAS_DEVICES:
        pytest.skip(f"torch {torch.__version__}: register_backend has no devices= (torch >= 2.2)")
    if hasattr(torch, "hpu"):
        pytest.skip("this torch has a torch.hpu module: the device may be present")
    results = ranks(_rank_missing_device, str(tmp_path / "store"))
    ops = list(results[0]["both"])
    for res in (results[1]["alone"], results[0]["both"], results[1]["both"]):
        for op in ops:
            assert res[op] is not None, f"{op} ran on a group whose device is missing"
            kind, msg, seconds = res[op]
            assert kind == "BackendError", (op, kind, msg)
            assert msg.startswith("the default process group cannot be used here: "), (op, msg)
            assert f"goes to its backend '{MISSING_DEVICE_BACKEND}' on device 'hpu'" in msg, (op, msg)
            assert f"device-to-backend map 'hpu:{MISSING_DEVICE_BACKEND}'" in msg, (op, msg)
            assert "no hpu device is visible" in msg and "Fix: run where 'hpu' devices are visible" in msg
            assert f"init_process_group(backend='hpu:{MISSING_DEVICE_BACKEND},cpu:<backend>')" in msg
            assert seconds < 10, (op, seconds)
    for op in ops:  # the same words on every rank
        assert results[0]["both"][op][1] == results[1]["both"][op][1], op


# ------------------------------------------------------------------ broadcast_object_list's src


def _src_checks(store: str) -> dict:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        one = dist.new_group([1])  # rank 0 is not a member
        both = dist.new_group([0, 1])
        out = {}
        for name, src, group in (
            ("not in a group of one", 0, one),
            ("not in the group", 5, both),
            ("out of the world", 7, None),
            ("not an int", "0", None),
            ("a bool", True, None),
        ):
            data = ["kept"]
            bol = hwdist.broadcast_object_list
            out[name] = {
                "broadcast": _error(lambda: hwdist.broadcast(torch.ones(1), src=src, group=group)),
                "broadcast_object_list": _error(lambda: bol(data, src=src, group=group)),
                "broadcast_object": _error(lambda: hwdist.broadcast_object(rank, src=src, group=group)),
                "data": data,
            }
        box = [f"from {rank}"]
        # a good src in a group of one: nothing moves; outside the group: torch's error (docs/collectives.md)
        out["group of one"] = _error(lambda: hwdist.broadcast_object_list(box, src=1, group=one)), box
        out["after"] = hwdist.broadcast_object(f"from {rank}", src=1, group=both)
        return out
    finally:
        hwdist.destroy()


def test_broadcast_object_list_checks_src_as_broadcast_does(ranks, tmp_path):
    """Before: with a group of one that does not hold ``src`` the call returned with the list unchanged
    on the member and raised torch's ``Invalid process group specified`` on the other rank, while
    ``broadcast`` raised ``ValueError`` on both; other bad sources were reported in other words."""
    for rank, res in enumerate(ranks(_src_checks, str(tmp_path / "store"))):
        for name in ("not in a group of one", "not in the group", "out of the world", "not an int", "a bool"):
            case = res[name]
            kind, want, _ = case["broadcast"]
            assert kind in ("ValueError", "TypeError"), (name, case["broadcast"])
            for op in ("broadcast_object_list", "broadcast_object"):
                assert case[op] is not None, (rank, name, op)
                got_kind, got, _ = case[op]
                assert got_kind == "CollectiveArgumentError", (name, op, got)
                assert issubclass(hwdist.CollectiveArgumentError, getattr(builtins, kind))  # broadcast's kind
                # the same words as broadcast's, naming the call
                assert got == want.replace("broadcast:", "broadcast_object_list:", 1), (name, op, got, want)
            assert case["data"] == ["kept"]
        error, box = res["group of one"]
        assert box == [f"from {rank}"]
        if rank == 1:
            assert error is None
        else:
            # torch's own error: a ValueError (a RuntimeError on torch 2.1)
            assert error[0] in ("ValueError", "RuntimeError") and "Invalid process group" in error[1], error
        assert res["after"] == "from 1"
