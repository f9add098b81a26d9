"""torch 2.15's one-tensor spellings on real ranks: ``*_single`` and the older ``*_into_tensor`` /
``reduce_scatter_tensor``, which torch keeps as plain aliases and which neither warns.

Each rank calls every spelling with warnings turned into errors, synchronously and with
``async_op=True``, and returns what it got; the expected values are computed here from the rank
numbers.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import hwdist

from hwdist.testing.pytest_plugin import backends, world_sizes

pytestmark = pytest.mark.dist

SPELLINGS = (
    ("all_gather_single", "all_gather_into_tensor"),
    ("gather_single", "gather_into_tensor"),
    ("reduce_scatter_single", "reduce_scatter_tensor"),
)


def _mine(rank: int, n: int = 3) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 10 * rank


def _spellings_rank() -> dict[str, Any]:
    rank, ws = hwdist.get_rank(), hwdist.get_world_size()
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would fail the rank
        for async_op in (False, True):
            tag = "async" if async_op else "sync"
            for name in ("all_gather_single", "all_gather_into_tensor"):
                flat = torch.empty(3 * ws)
                h = getattr(hwdist, name)(flat, _mine(rank), async_op=async_op)
                if async_op:
                    h.wait()
                stacked = torch.empty(ws, 3)
                getattr(hwdist, name)(stacked, _mine(rank))
                out[f"{name}/{tag}"] = (flat.tolist(), stacked.tolist())
            for name in ("gather_single", "gather_into_tensor"):
                dst = ws - 1
                got = torch.full((ws * 3,), -1.0) if rank == dst else None
                h = getattr(hwdist, name)(_mine(rank), got, dst=dst, async_op=async_op)
                if async_op and h is not None:
                    h.wait()
                out[f"{name}/{tag}"] = None if got is None else got.tolist()
            for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
                mine = torch.arange(2 * ws, dtype=torch.int32) * (rank + 1)
                res = torch.empty(2, dtype=torch.int32)
                h = getattr(hwdist, name)(res, mine, "sum", async_op=async_op)
                if async_op:
                    h.wait()
                out[f"{name}/{tag}"] = res.tolist()
            pieces = torch.arange(2 * ws, dtype=torch.int32) + 100 * rank
            got_a2a = torch.empty(2 * ws, dtype=torch.int32)
            h = hwdist.all_to_all_single(got_a2a, pieces, async_op=async_op)
            if async_op:
                h.wait()
            out[f"all_to_all_single/{tag}"] = got_a2a.tolist()
    return out


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w in (2, 3)])
def test_single_and_into_tensor_spellings_agree_without_warnings(dist, world_size, backend):
    results = dist(_spellings_rank, world_size, backend)
    ws = world_size
    gathered = [x for r in range(ws) for x in _mine(r).tolist()]
    total = sum(r + 1 for r in range(ws))
    for rank, res in enumerate(results):
        for tag in ("sync", "async"):
            for name in ("all_gather_single", "all_gather_into_tensor"):
                flat, stacked = res[f"{name}/{tag}"]
                assert flat == gathered and [x for row in stacked for x in row] == gathered, (name, tag)
            for name in ("gather_single", "gather_into_tensor"):
                assert res[f"{name}/{tag}"] == (gathered if rank == ws - 1 else None), (name, tag, rank)
            for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
                assert res[f"{name}/{tag}"] == [(2 * rank + j) * total for j in range(2)], (name, tag)
            want = [100 * q + 2 * rank + j for q in range(ws) for j in range(2)]
            assert res[f"all_to_all_single/{tag}"] == want, (tag, rank)


def test_the_aliases_are_the_same_functions():
    """Both spellings are one function, an attribute of hwdist and public in hwdist.collectives.tensor
    (hwdist.__all__ keeps mmengine.dist's names and the core: docs/reference.md)."""
    from hwdist.collectives import tensor

    for single, older in SPELLINGS:
        assert getattr(hwdist, older) is getattr(hwdist, single)
        assert single in tensor.__all__ and older in tensor.__all__
    assert "all_to_all_single" in tensor.__all__ and hwdist.all_to_all_single is tensor.all_to_all_single
