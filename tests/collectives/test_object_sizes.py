"""Object collectives across sizes on real ranks: gloo and emu, 2 and 3 ranks.

Each rank builds its objects from (pattern, call, rank) and returns what it got;
the test rebuilds what every rank gave and compares. The collectives hwdist
issues are counted by wrapping ``protocol.issue`` (the engine entry every
internal exchange goes through) inside the rank process: an object that fits its
record (the fixed 1 KiB header) is one collective, a larger one takes one record
exchange plus its exact-size route, on every call alike (nothing is predicted
from earlier calls). Failures injected on one rank after earlier calls must
raise the same error on every rank within seconds.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import hwdist
from hwdist.testing.pytest_plugin import backends

pytestmark = pytest.mark.dist

CALLS = 6
#: pattern -> payload length in characters for (call, rank)
PATTERNS = {
    "small": lambda call, rank: 40,
    "medium": lambda call, rank: 4000 + 7 * rank,
    "growing": lambda call, rank: 30 + 600 * call + 7 * rank,
    "shrinking": lambda call, rank: max(3000 - 600 * call - rank, 0),
    "alternating": lambda call, rank: 5000 + rank if call % 2 else 20,
    "one_rank_big": lambda call, rank: 200_000 if (call == 4 and rank == 1) else 50,
    "large": lambda call, rank: 400_000 + 7 * rank,
}
OPS = ("all_gather_object", "gather_object", "broadcast_object_list", "collect_results")


def _value(pattern: str, call: int, rank: int):
    n = PATTERNS[pattern](call, rank)
    return {"rank": rank, "call": call, "text": chr(97 + (rank + call) % 26) * n,
            "arr": np.arange(rank + 1, dtype=np.int32) + call}


def _plain(obj):
    """A comparable form (arrays as lists)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return (str(obj.dtype), obj.tolist())
    return obj


class _Count:
    """Counts the collectives hwdist issues in this process (wraps ``protocol.issue``)."""

    def __init__(self) -> None:
        from hwdist.collectives import protocol

        self.mod, self.orig, self.n = protocol, protocol.issue, 0

    def __enter__(self) -> "_Count":
        def counted(*args, **kwargs):
            self.n += 1
            return self.orig(*args, **kwargs)

        self.mod.issue = counted
        return self

    def __exit__(self, *exc) -> None:
        self.mod.issue = self.orig


def _call(op: str, obj, world: int):
    if op == "all_gather_object":
        return hwdist.all_gather_object(obj)
    if op == "gather_object":
        return hwdist.gather_object(obj, dst=0)
    if op == "broadcast_object_list":
        box = [obj]
        hwdist.broadcast_object_list(box, src=1)
        return box
    return hwdist.collect_results([obj, obj], 2 * world)


def _run_patterns() -> dict:
    from hwdist.collectives.objects import INLINE_BYTES

    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    from hwdist.collectives import protocol

    out: dict = {"inline": INLINE_BYTES, "gathers": protocol.gathers(hwdist.registry.resolve(None))}
    for op in OPS:
        for pattern in PATTERNS:
            got, counts = [], []
            for call in range(CALLS):
                with _Count() as c:
                    res = _call(op, _value(pattern, call, rank), world)
                got.append(_plain(res))
                counts.append(c.n)
            out[(op, pattern)] = {"got": got, "counts": counts}
    return out


def _expected(op: str, pattern: str, call: int, rank: int, world: int):
    vals = [_plain(_value(pattern, call, r)) for r in range(world)]
    if op == "all_gather_object":
        return vals
    if op == "gather_object":
        return vals if rank == 0 else None
    if op == "broadcast_object_list":
        return [vals[1]]
    return vals + vals if rank == 0 else None  # item i is on rank i % W; two items per rank


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_size_arrives_and_a_small_object_is_one_collective(dist, world_size, backend):
    results = dist(_run_patterns, world_size, backend)
    assert results[0]["inline"] == 832  # a small dict of 40 characters fits, one of 4,000 does not
    for rank, res in enumerate(results):
        for op in OPS:
            for pattern in PATTERNS:
                got = res[(op, pattern)]["got"]
                for call in range(CALLS):
                    assert got[call] == _expected(op, pattern, call, rank, world_size), (op, pattern, call)
    w = world_size
    for rank, res in enumerate(results):
        for op in OPS:
            # an object that fits its record: the record exchange is the whole collective, on every rank
            assert res[(op, "small")]["counts"] == [1] * CALLS, (op, rank, res[(op, "small")]["counts"])
            # one rank over its record on one call: that call costs more, the next ones are one again
            big = res[(op, "one_rank_big")]["counts"]
            assert big[:4] == [1] * 4 and big[5:] == [1] * (CALLS - 5), (op, rank, big)
        medium = {op: res[(op, "medium")]["counts"] for op in OPS}
        # every rank over its record: the record exchange, then one padded all_gather / one broadcast /
        # one gather of the rest, on every call
        for op in ("all_gather_object", "gather_object", "broadcast_object_list"):
            assert medium[op] == [2] * CALLS, medium
        large = {op: res[(op, "large")]["counts"] for op in OPS}
        # all_gather_object: one padded all_gather up to 1 MiB in all (2 ranks), else a broadcast from each
        assert large["all_gather_object"] == [2 if w == 2 else 1 + w] * CALLS, large
        assert large["broadcast_object_list"] == [2] * CALLS, large
        # gather_object: one gather to the root where the backend has gather; else point to point (the
        # root receives from each other rank, which sends once), then the root's closing status
        to_root = 2 if w == 2 else (1 + w if rank == 0 else 3)
        want = ([2] if res["gathers"] else [to_root]) * CALLS
        assert large["gather_object"] == want, (res["gathers"], large)
        if rank == 0:  # the root gets each other rank's chunk table and chunk, then sends its closing status
            assert medium["collect_results"] == [1 + 2 * (w - 1) + 1] * CALLS, medium


class _Unpicklable:
    def __init__(self) -> None:
        self.lock = threading.Lock()


def _failures_after_good_calls(verified: bool) -> list:
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    bad_rank = world - 1
    seen: list = []

    def attempt(fn) -> None:
        start = time.monotonic()
        try:
            with hwdist.verification(verified):
                fn()
        except (hwdist.ObjectCollectiveError, hwdist.CollectiveMismatch) as exc:
            seen.append((type(exc).__name__, str(exc), sorted(getattr(exc, "failures", {}) or {}),
                         time.monotonic() - start < 10))
            return
        seen.append(None)

    small = {"rank": rank}
    odd = _Unpicklable() if rank == bad_rank else small
    cases = [
        # serialization failures on one rank
        ("all_gather_object", lambda: hwdist.all_gather_object(odd)),
        ("gather_object", lambda: hwdist.gather_object(odd)),
        ("broadcast_object_list", lambda: hwdist.broadcast_object_list([odd], src=bad_rank)),
        ("collect_results", lambda: hwdist.collect_results([small, odd], 2 * world)),
        # bad arguments on one rank
        ("gather_object", lambda: hwdist.gather_object(small, dst=world + 5 if rank == bad_rank else 0)),
        ("collect_results",
         lambda: hwdist.collect_results("not a list" if rank == bad_rank else [small], world)),
        # different collectives on different ranks
        ("gather_object",
         lambda: hwdist.all_gather_object(small) if rank == bad_rank else hwdist.gather_object(small)),
    ]
    for op, fn in cases:
        for _ in range(2):  # earlier calls that went well
            _call(op, small, world)
        attempt(fn)
        # the group still works, and the next call is right
        assert hwdist.all_gather_object(rank) == list(range(world))
    return seen


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_failure_on_one_rank_after_good_calls_raises_the_same_error_on_every_rank(
    dist, world_size, backend
):
    for verified in (False, True):
        _check_failures(dist(_failures_after_good_calls, world_size, backend, verified), world_size, verified)


def _check_failures(per_rank: list, world_size: int, verified: bool) -> None:
    bad = world_size - 1
    kinds = ["SerializationError"] * 4 + ["CollectiveArgumentError"] * 3
    if verified:  # a bad dst and another collective on one rank: verification sees them first
        kinds[4] = kinds[6] = "CollectiveMismatch"
    for seen in per_rank:
        assert len(seen) == len(kinds) and all(s is not None for s in seen), seen
        for (kind, msg, _, fast), want in zip(seen, kinds):
            assert kind == want, (kind, msg)
            assert fast, msg
        for _, msg, failures, _ in seen[:4]:
            assert failures == [bad] and f"rank(s) {bad}" in msg, msg
            assert "_Unpicklable" in msg and "lock" in msg, msg  # the whole message reached every rank
        assert "results must be a list, got str" in seen[5][1]
        if verified:
            dsts = "; ".join(f"rank {r}: {world_size + 5 if r == bad else 0}" for r in range(world_size))
            assert f"dst: {dsts}" in seen[4][1]
            assert "op: " in seen[6][1] and "gather_object" in seen[6][1]
            continue
        assert f"dst={world_size + 5} is not a rank of the group" in seen[4][1]
        assert "different object collectives" in seen[6][1]
    # every rank raised the same text (different collectives: each names its own call first, as before)
    for i in range(len(kinds) - 1):
        assert len({seen[i][1] for seen in per_rank}) == 1, [seen[i][1] for seen in per_rank]
