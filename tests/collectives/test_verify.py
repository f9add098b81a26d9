"""Verification (on by default): mismatched calls raise on every rank, listing each rank's value.

Verification on every collective (one case per public collective), its cost when off (never
reaching the check), the ``HWDIST_VERIFY`` and ``HWDIST_DEBUG`` switches and ``verify=False``;
the protocol's own cases (a barrier, a skipped call with the same signature) come first.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import pytest
import torch

import hwdist
from hwdist.collectives import verify
from hwdist.testing.pytest_plugin import one_backend, world_sizes

pytestmark = pytest.mark.dist


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
    # off: no exchange at all, even if the arguments differ
    with verify.verification(False):
        verify.check_call("all_reduce", None, drv, tensor=verify.describe_tensor(t))
        out["enabled_inside"] = verify.verification_enabled()
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
        assert res["enabled_inside"] is False and res["enabled_after"] is True


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
    with verify.verification(call_sites=True):  # debug mode: the calling lines are compared too
        try:
            if rank != skipper:
                hwdist.all_reduce(a)
            hwdist.all_reduce(b)
            out["raised"] = None
        except verify.CollectiveMismatch as exc:
            out["raised"] = str(exc)
        out["seconds"] = time.monotonic() - start
        out["b"] = b.tolist()
        # call sites off (the default): the same skip goes through (the skipper gets the other call's data)
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


# ---------------------------------------------------------------------------
# verification mode: a mismatch in any collective raises on every rank, naming each rank's value
# ---------------------------------------------------------------------------


def _catch(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__ + ("+ValueError" if isinstance(exc, ValueError) else ""), str(exc)
    return "none", ""


def _odd(rank: int, normal: Any, odd: Any) -> Any:
    """Rank 1's value is ``odd``, every other rank's ``normal``."""
    return odd if rank == 1 else normal


def _verification_cases() -> dict[str, tuple[str, str]]:
    rank, ws = hwdist.get_rank(), hwdist.get_world_size()
    f32 = torch.float32
    out: dict[str, tuple[str, str]] = {}
    with hwdist.verification():
        # matching calls work as usual (and the uneven all_gather still may differ in shape)
        t = torch.full((2,), float(rank + 1))
        hwdist.all_reduce(t)
        got = hwdist.all_gather(torch.arange(rank + 1.0))
        d = {"b": torch.tensor(1.0), "a": torch.tensor([float(rank)])}
        hwdist.all_reduce_dict(d)
        objs = hwdist.all_gather_object({"r": rank})
        assert t.tolist() == [ws * (ws + 1) / 2] * 2
        assert [g.tolist() for g in got] == [list(map(float, range(r + 1))) for r in range(ws)]
        assert d["b"].item() == ws and d["a"].item() == sum(range(ws))
        assert objs == [{"r": r} for r in range(ws)]
        cases: dict[str, Callable[[], Any]] = {
            "all_reduce dtype": lambda: hwdist.all_reduce(
                torch.zeros(4, 3, dtype=_odd(rank, f32, torch.float64))
            ),
            "all_reduce shape": lambda: hwdist.all_reduce(torch.zeros(_odd(rank, 4, 5))),
            "all_reduce op": lambda: hwdist.all_reduce(torch.zeros(2), op=_odd(rank, "sum", "max")),
            "all_reduce non-tensor": lambda: hwdist.all_reduce(_odd(rank, torch.zeros(2), [0.0, 0.0])),
            "all_gather dtype": lambda: hwdist.all_gather(torch.zeros(2, dtype=_odd(rank, f32, torch.int32))),
            "all_gather same_shape": lambda: hwdist.all_gather(
                torch.zeros(_odd(rank, 2, 3)), same_shape=True
            ),
            "gather dst": lambda: hwdist.gather(torch.zeros(2), dst=_odd(rank, 0, 1)),
            "broadcast shape": lambda: hwdist.broadcast(torch.zeros(_odd(rank, 2, 3))),
            "broadcast src": lambda: hwdist.broadcast(torch.zeros(2), src=_odd(rank, 0, 1)),
            "reduce dst": lambda: hwdist.reduce(torch.zeros(2), dst=_odd(rank, 0, 1)),
            "scatter shape": lambda: hwdist.scatter(
                torch.zeros(_odd(rank, 2, 3)), [torch.zeros(2)] * ws if rank == 0 else None
            ),
            "reduce_scatter shape": lambda: hwdist.reduce_scatter(
                torch.zeros(_odd(rank, 2, 1)), [torch.ones(_odd(rank, 2, 1))] * ws
            ),
            "all_to_all sizes": lambda: hwdist.all_to_all(
                [torch.zeros(1) for _ in range(ws)], [torch.zeros(_odd(rank, 1, 2)) for _ in range(ws)]
            ),
            "different collectives": lambda: (
                hwdist.broadcast(torch.zeros(2)) if rank == 1 else hwdist.all_reduce(torch.zeros(2))
            ),
            "tensor vs object collective": lambda: (
                hwdist.all_gather_object(rank) if rank == 1 else hwdist.all_reduce(torch.zeros(2))
            ),
            "all_reduce_dict keys": lambda: hwdist.all_reduce_dict(
                {"a": torch.ones(2), **({"c": torch.ones(1)} if rank == 1 else {})}
            ),
            "all_reduce_dict shape": lambda: hwdist.all_reduce_dict({"a": torch.ones(_odd(rank, 2, 3))}),
            "all_reduce_params": lambda: hwdist.all_reduce_params(
                [torch.ones(3), torch.ones(_odd(rank, 2, 4))]
            ),
            "broadcast_object_list src": lambda: hwdist.broadcast_object_list([rank], src=_odd(rank, 0, 1)),
            # a non-source rank's bad data: only verification mode makes every rank raise
            # (one broadcast otherwise)
            "broadcast_object_list data": lambda: hwdist.broadcast_object_list(
                "x" if rank == 1 else [rank], src=0
            ),
            "collect_results size": lambda: hwdist.collect_results([rank], _odd(rank, ws, ws + 1)),
        }
        for name, case in cases.items():
            out[name] = _catch(case)
        # the group is healthy afterwards, still in verification mode
        t = torch.ones(1)
        hwdist.all_reduce(t)
        assert t.item() == ws
    return out


def _ranks(field: str, normal: str, odd: str, ws: int) -> str:
    return f"{field}: " + "; ".join(f"rank {r}: {odd if r == 1 else normal}" for r in range(ws))


@pytest.mark.slow
@pytest.mark.parametrize("backend", one_backend())
def test_verification_mode_catches_mismatches_in_every_collective(dist, backend):
    ws = 3
    per_rank = dist(_verification_cases, ws, backend)
    expect = {
        "all_reduce dtype": _ranks("data", "float32[4, 3]@cpu", "float64[4, 3]@cpu", ws),
        "all_reduce shape": _ranks("data", "float32[4]@cpu", "float32[5]@cpu", ws),
        "all_reduce op": _ranks("reduce_op", "sum", "max", ws),
        "all_reduce non-tensor": _ranks("data", "float32[2]@cpu", "list", ws),
        "all_gather dtype": _ranks("data", "float32@cpu", "int32@cpu", ws),
        "all_gather same_shape": _ranks("data", "float32[2]@cpu", "float32[3]@cpu", ws),
        "gather dst": _ranks("dst", "0", "1", ws),
        "broadcast shape": _ranks("data", "float32[2]@cpu", "float32[3]@cpu", ws),
        "broadcast src": _ranks("src", "0", "1", ws),
        "reduce dst": _ranks("dst", "0", "1", ws),
        "scatter shape": _ranks("data", "float32[2]@cpu", "float32[3]@cpu", ws),
        "reduce_scatter shape": _ranks("output", "float32[2]@cpu", "float32[1]@cpu", ws),
        "all_to_all sizes": "rank 1 sends 2 elements to rank 0, which expects 1",
        "different collectives": _ranks("op", "all_reduce", "broadcast", ws),
        "tensor vs object collective": _ranks("op", "all_reduce", "all_gather_object", ws),
        "all_reduce_dict keys": _ranks("data['c']", "(missing)", "float32[1]@cpu", ws),
        "all_reduce_dict shape": _ranks("data['a']", "float32[2]@cpu", "float32[3]@cpu", ws),
        "all_reduce_params": _ranks("params[1]", "float32[2]@cpu", "float32[4]@cpu", ws),
        "broadcast_object_list src": _ranks("src", "0", "1", ws),
        # a non-list on one rank is that rank's failed record, on every rank
        "broadcast_object_list data": "failed on rank(s) 1: rank 1: data must be a list, got str",
        "collect_results size": _ranks("size", str(ws), str(ws + 1), ws),
    }
    for rank, got in enumerate(per_rank):
        assert set(got) == set(expect)
        for name, text in expect.items():
            kind, msg = got[name]
            odd = name == "broadcast_object_list data"
            assert kind.endswith("+ValueError") or odd, (rank, name, kind, msg)
            assert text in msg, (rank, name, msg)
            if name == "broadcast_object_list data":
                assert kind.startswith("ArgumentAssertionError"), (rank, name, kind)
                continue
            if name != "all_to_all sizes":  # on 'emu' that one is the emulated path's own ValueError
                assert kind.startswith("CollectiveMismatch") and "(verification)" in msg, (rank, name, msg)


def _cost_when_off() -> list:
    # with the mode off, check_call is never reached: a collective's call count of it stays 0
    calls = []
    original = verify.check_call
    verify.check_call = lambda *a, **k: calls.append(a[0])  # type: ignore[assignment]
    try:
        t = torch.ones(2)
        with hwdist.verification(False):
            hwdist.all_reduce(t)
            hwdist.broadcast(t)
            hwdist.all_gather(t, same_shape=True)
            hwdist.all_reduce_dict({"a": t})
            hwdist.all_gather_object(1)
            hwdist.collect_results([1], 2)
        hwdist.all_reduce(t, verify=False)  # off for one call
        off = len(calls)
        hwdist.all_reduce(t)
        hwdist.all_gather_object(1)
    finally:
        verify.check_call = original  # type: ignore[assignment]
    return [off, calls]


@pytest.mark.slow
def test_verification_mode_off_never_reaches_the_check(dist):
    # (spying on hwdist's own verify.check_call, not on torch.distributed)
    for off, calls in dist(_cost_when_off, 2, "gloo"):
        assert off == 0
        # the object collective's check rides in its records (no check_call of its own)
        assert calls == ["all_reduce"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "env, enabled, call_sites",
    [
        ({}, True, False),
        ({"HWDIST_VERIFY": "0"}, False, False),
        ({"HWDIST_DEBUG": "1"}, True, True),
        ({"HWDIST_VERIFY": "0", "HWDIST_DEBUG": "1"}, True, True),
    ],
)
def test_env_variables_switch_verification(env, enabled, call_sites):
    """On by default; HWDIST_VERIFY=0 turns it off; HWDIST_DEBUG=1 adds the call sites (and turns it on)."""
    code = (
        "import sys, hwdist; from hwdist.collectives import verify;"
        " print(hwdist.verification_enabled(), verify._call_sites)"
    )
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base = {k: v for k, v in os.environ.items() if k not in ("HWDIST_VERIFY", "HWDIST_DEBUG")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(base, PYTHONPATH=root, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split() == [str(enabled), str(call_sites)], done.stdout + done.stderr


def _forced_cases() -> dict[str, tuple[str, str]]:
    rank = hwdist.get_rank()
    out: dict[str, tuple[str, str]] = {}
    with hwdist.verification(False):  # off for the process: each call asks with verify=True
        cases: dict[str, Callable[[], Any]] = {
            "all_reduce": lambda: hwdist.all_reduce(torch.zeros(_odd(rank, 4, 5)), verify=True),
            "all_gather": lambda: hwdist.all_gather(
                torch.zeros(2, dtype=_odd(rank, torch.float32, torch.int32)), verify=True
            ),
            "all_reduce_dict": lambda: hwdist.all_reduce_dict(
                {"a": torch.ones(_odd(rank, 2, 3))}, verify=True
            ),
            "all_reduce_params": lambda: hwdist.all_reduce_params(
                iter([torch.ones(3), torch.ones(_odd(rank, 2, 4))]),
                verify=True,  # an iterator, consumed once
            ),
            "broadcast_object_list": lambda: hwdist.broadcast_object_list(
                [rank], src=_odd(rank, 0, 1), verify=True
            ),
            "collect_results": lambda: hwdist.collect_results([rank], _odd(rank, 2, 3), verify=True),
        }
        for name, case in cases.items():
            out[name] = _catch(case)
        t = torch.ones(1)
        hwdist.all_reduce(t)  # healthy afterwards, unverified
        out["healthy"] = ("", str(t.item()))
    return out


@pytest.mark.parametrize("backend", one_backend())
def test_verify_true_verifies_one_call_of_every_kind_while_verification_is_off(dist, backend):
    for got in dist(_forced_cases, 2, backend):
        assert got.pop("healthy") == ("", "2.0")
        for name, (kind, msg) in got.items():
            assert kind.startswith("CollectiveMismatch") and "(verification)" in msg, (name, kind, msg)
            assert f"mismatch in '{name}'" in msg, (name, msg)  # the call itself, not one it is built on
            assert "rank 0: " in msg and "rank 1: " in msg, (name, msg)
