"""hwdist's internal transport and agreement primitive, on real ranks.

Every other module's own traffic (shape exchanges, records, digests, the
launcher's node table) goes through these functions, so they are checked here
on their own with values that differ per rank.
"""

from __future__ import annotations

import pytest

import hwdist
from hwdist.collectives import _agree, _transport
from hwdist.testing.pytest_plugin import backends, world_sizes


def _transport_rank():
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    out = {}
    out["ints"] = _transport.gather_ints([rank, rank * 10, -rank], None)
    out["bytes"] = _transport.gather_bytes(b"x" * (rank * 7 + 1), None)
    out["empty"] = _transport.gather_bytes(b"", None)
    out["bcast"] = _transport.broadcast_bytes(b"hello from the last" if rank == world - 1 else None, world - 1)
    out["maxmin"] = _transport.max_and_min([rank, 5 - rank], None, world, hwdist.resolve())
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
    got = _agree.agree("op", None, words=[7, rank % 2], flag=rank)
    out["flag"], out["same"] = got.flag, got.same
    problem = ValueError("x must be positive, got -1") if rank == bad_rank else None
    try:
        _agree.agree("op", None, problem=problem, words=[1])
        out["raised"] = None
    except Exception as exc:  # noqa: BLE001 - the test compares the type and text
        out["raised"] = (type(exc).__name__, str(exc), isinstance(exc, ValueError), isinstance(exc, hwdist.HwdistError))
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
            assert f"op: rank {bad} was given invalid arguments (ValueError: x must be positive, got -1)" in text
