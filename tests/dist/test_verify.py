"""Verification mode: mismatched calls raise on every rank, listing each rank's value."""

from __future__ import annotations

import time

import pytest
import torch

import hwdist
from hwdist.collectives import verify
from hwdist.testing.pytest_plugin import one_backend, world_sizes


def _mismatch_rank():
    rank = hwdist.get_rank()
    drv = hwdist.resolve()
    dtype = torch.float64 if rank == 1 else torch.float32
    t = torch.zeros(4, 3, dtype=dtype)
    out = {}
    with verify.verification():
        verify.check_call("all_reduce", None, drv, tensor=verify.describe_tensor(torch.zeros(2)))  # agrees
        try:
            verify.check_call("all_reduce", None, drv, tensor=verify.describe_tensor(t))
            out["raised"] = None
        except verify.CollectiveMismatch as exc:
            out["raised"] = str(exc)
    # off again: no exchange at all, even if the arguments differ
    verify.check_call("all_reduce", None, drv, tensor=verify.describe_tensor(t))
    out["enabled_after"] = verify.verification_enabled()
    return out


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_mismatch_raises_on_every_rank(dist, world_size, backend):
    results = dist(_mismatch_rank, world_size, backend)
    expected = "tensor: " + "; ".join(
        f"rank {r}: {'float64' if r == 1 else 'float32'}[4, 3]@cpu" for r in range(world_size)
    )
    for res in results:
        assert res["raised"] is not None
        assert "collective mismatch in 'all_reduce'" in res["raised"]
        assert expected in res["raised"]
        assert res["enabled_after"] is False


def test_env_flag_parsing(monkeypatch):
    for value, expected in [("1", True), ("true", True), ("0", False), ("", False), ("no", False)]:
        monkeypatch.setenv(verify.ENV_DEBUG, value)
        assert verify._env_flag(verify.ENV_DEBUG) is expected


def _barrier_vs_all_reduce():
    with verify.verification():
        try:
            if hwdist.get_rank() == 0:
                hwdist.barrier()
            else:
                hwdist.all_reduce(torch.ones(1))
        except verify.CollectiveMismatch as exc:
            return str(exc)
    return None


@pytest.mark.parametrize("backend", one_backend())
def test_barrier_takes_part_in_verification(dist, backend):
    results = dist(_barrier_vs_all_reduce, 2, backend)
    for msg in results:
        assert msg is not None and "rank 0: barrier; rank 1: all_reduce" in msg, msg


def _skip_one_of_two_equal_calls(skipper: int):
    """Rank ``skipper`` skips the first of two all_reduce calls with the same signature."""
    rank = hwdist.get_rank()
    a, b = torch.full((2,), 1.0), torch.full((2,), 100.0)
    start = time.monotonic()
    out: dict = {}
    with verify.verification():
        try:
            if rank != skipper:
                hwdist.all_reduce(a)
            hwdist.all_reduce(b)
            out["raised"] = None
        except verify.CollectiveMismatch as exc:
            out["raised"] = str(exc)
        out["seconds"] = time.monotonic() - start
        out["b"] = b.tolist()
        # call sites off: the same skip goes through (the skipper gets the other call's data)
        with verify.verification(call_sites=False):
            a, b = torch.full((2,), 1.0), torch.full((2,), 100.0)
            if rank != skipper:
                hwdist.all_reduce(a)
            hwdist.all_reduce(b)
            if rank == skipper:  # the ranks are back in step: the others' second call meets this one
                hwdist.all_reduce(torch.zeros(2))
        out["b_without_call_sites"] = b.tolist()
    t = torch.ones(1)
    hwdist.all_reduce(t)  # the group is still usable
    out["after"] = t.item()
    return out


@pytest.mark.parametrize("backend", one_backend())
def test_a_skipped_call_with_the_same_signature_raises_on_every_rank(dist, backend):
    ws = 3
    results = dist(_skip_one_of_two_equal_calls, ws, backend, 1)
    for rank, res in enumerate(results):
        msg = res["raised"]
        assert msg is not None, (rank, res)
        assert "collective mismatch in 'all_reduce' (call #1 on this group)" in msg, msg
        lines = [f"rank {r}: test_verify.py:" for r in range(ws)]
        assert all(x in msg for x in lines) and "call site" in msg and "HINT: a rank skipped" in msg, msg
        assert res["b"] == [100.0, 100.0], res  # nobody's data was reduced
        assert res["seconds"] < 10
        assert res["after"] == ws
    # the control: without call sites the skipping rank silently gets the wrong sum (1 + 1 + 100)
    assert results[1]["b_without_call_sites"] == [102.0, 102.0]
