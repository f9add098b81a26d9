"""Size agreement by prediction on real ranks: an all_gather of uneven shapes driven over the transport.

Every rank gathers tensors whose shapes differ per rank and change from call to
call (uneven, growing, shrinking, alternating, more dims than the header holds);
each rank returns what it gave and what it got, and the test compares every
rank's result with what the other ranks say they gave. A dtype that differs on
one rank must make every rank raise the same error, after which the group still
works.
"""

from __future__ import annotations

import pytest
import torch

import hwdist
from hwdist.collectives import _sizes
from hwdist.testing.pytest_plugin import backends, world_sizes

PATTERNS = {
    "uneven": lambda call, rank: (3 + 5 * rank, 4),
    "growing": lambda call, rank: (10 + 7 * call + rank, 3),
    "shrinking": lambda call, rank: (max(400 - 37 * call - rank, 0), 2),
    "alternating": lambda call, rank: ((2000 + rank,) if call % 2 else (5, rank + 1)),
    "big_and_small": lambda call, rank: ((300_000 if call % 3 == 0 else 17) + rank,),  # 1.2 MB
}
CALLS = 9


def _value(pattern: str, call: int, rank: int) -> torch.Tensor:
    shape = PATTERNS[pattern](call, rank)
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float32) + 1000 * rank + call).reshape(shape)


def _gather_rank(patterns: list[str]):
    rank = hwdist.get_rank()
    out: dict = {}
    for pattern in patterns:
        got = []
        for call in range(CALLS):
            t = _value(pattern, call, rank)
            got.append([g.tolist() for g in _sizes.gather(t, None, op="all_gather", key=(pattern,))])
        hist = _sizes.history(None, "all_gather", (pattern,))
        out[pattern] = {"got": got, "hits": hist.hits, "redos": hist.redos, "explicit": hist.explicit}
    # a shape longer than the header, twice (explicit, then predicted)
    deep = torch.arange(2 * (rank + 1), dtype=torch.int16).reshape((1,) * 9 + (2, rank + 1))
    out["deep"] = [[g.tolist() for g in _sizes.gather(deep, None, key=("deep",))] for _ in range(2)]
    out["deep_gave"] = deep.tolist()
    # one rank with another dtype: every rank raises the same error, then the group still works
    for attempt in range(2):  # first call explicit, second call predicted
        bad = torch.zeros(4, dtype=torch.int64 if rank == 1 else torch.float32)
        try:
            _sizes.gather(torch.zeros(4), None, key=("mixed", attempt))  # seeds the history
            _sizes.gather(bad, None, key=("mixed", attempt))
            out[f"error{attempt}"] = None
        except Exception as exc:  # noqa: BLE001 - the test compares type and text
            out[f"error{attempt}"] = (isinstance(exc, TypeError), str(exc))
    out["after"] = [g.tolist() for g in _sizes.gather(torch.full((rank + 1,), float(rank)), None)]
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_predicted_gather_moves_what_each_rank_gave(dist, world_size, backend):
    patterns = list(PATTERNS)
    results = dist(_gather_rank, world_size, backend, patterns)
    for pattern in patterns:
        for res in results:
            for call in range(CALLS):
                want = [_value(pattern, call, r).tolist() for r in range(world_size)]
                assert res[pattern]["got"][call] == want, (pattern, call)
        counts = {(r[pattern]["hits"], r[pattern]["redos"], r[pattern]["explicit"]) for r in results}
        assert len(counts) == 1  # every rank's history moved the same way
        hits, redos, explicit = counts.pop()
        assert hits + redos + explicit == CALLS
        if pattern in ("uneven", "shrinking"):
            assert (hits, redos, explicit) == (CALLS - 1, 0, 1)  # one collective per call after the first
        if pattern in ("alternating", "big_and_small"):
            assert redos >= 1 and hits >= CALLS - 4, (pattern, hits, redos, explicit)  # the redo path ran too
    gave = [r["deep_gave"] for r in results]
    for res in results:
        assert res["deep"] == [gave, gave]
        assert res["after"] == [[float(r)] * (r + 1) for r in range(world_size)]
        for attempt in range(2):
            is_type_error, text = res[f"error{attempt}"]
            assert is_type_error
            names = ", ".join(f"rank {r}: {'int64' if r == 1 else 'float32'}" for r in range(world_size))
            assert text == f"all_gather: every rank must pass the same dtype; got {names}"
