"""``weights_only=`` on every object collective, on real gloo ranks, as torch's keyword behaves.

Expected values are built in each rank from rank numbers. The error type is compared with the one
torch's own ``all_gather_object(weights_only=True)`` raises where torch has the keyword (2.14+).
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist import _compat
from tests.programs import torch_kinds

pytestmark = pytest.mark.dist


@dataclasses.dataclass
class Box:
    """A user type: refused with weights_only=True until allowed."""

    x: int


def _safe(rank: int) -> dict:
    return {"rank": rank, "t": torch.arange(3) + rank, "nested": [rank, (rank, "x")], "s": f"r{rank}"}


def _same(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _every_collective(make) -> list[bool]:
    """Each object collective with weights_only=True on ``make(rank)`` objects; True where it matched."""
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    want = [make(r) for r in range(world)]
    got = []
    got.append(_same(hwdist.all_gather_object(make(rank), weights_only=True), want))
    out = hwdist.gather_object(make(rank), dst=1, weights_only=True)
    got.append(_same(out, want) if rank == 1 else out is None)
    box = [make(rank), make(rank)]
    hwdist.broadcast_object_list(box, src=1, weights_only=True)
    got.append(_same(box, [make(1), make(1)]))
    got.append(_same(hwdist.broadcast_object(make(rank), src=0, weights_only=True), make(0)))
    scattered = [None]
    hwdist.scatter_object_list(scattered, want if rank == 0 else None, src=0, weights_only=True)
    got.append(_same(scattered[0], make(rank)))
    part = hwdist.collect_results([make(rank)], size=world, weights_only=True)
    got.append(_same(part, want) if rank == 0 else part is None)
    return got


def _safe_types_travel() -> list[bool]:
    return _every_collective(_safe)


def _registered_types_travel() -> list[bool]:
    with torch.serialization.safe_globals([Box]):  # the user's registration is honoured
        return _every_collective(lambda r: {"box": Box(r), "t": torch.ones(2) * r})


def _refused_everywhere() -> list[tuple[str, str, bool]]:
    """Rank 1's object holds a Box; every collective must fail on every rank with the same type."""
    rank = hwdist.get_rank()
    obj = {"box": Box(1)} if rank == 1 else {"ok": rank}
    calls = {
        "all_gather_object": lambda: hwdist.all_gather_object(obj, weights_only=True),
        "gather_object": lambda: hwdist.gather_object(obj, dst=0, weights_only=True),
        "broadcast_object_list": lambda: hwdist.broadcast_object_list([obj], src=1, weights_only=True),
        "scatter_object_list": lambda: hwdist.scatter_object_list(
            [None], [{"ok": 0}, {"box": Box(1)}] if rank == 1 else None, src=1, weights_only=True
        ),
    }
    out = []
    for name, call in calls.items():
        try:
            call()
            out.append((name, "no error", False))
        except Exception as exc:  # noqa: BLE001 (the type is the result)
            right = isinstance(exc, pickle.UnpicklingError) and type(exc).__name__ == "WeightsOnlyRefused"
            out.append((name, str(exc), right))
    hwdist.barrier()
    return out


def _torch_kinds_travel() -> list[bool]:
    """State dicts, sparse, quantized and meta tensors through all_gather_object and broadcast_object_list."""
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    got = []
    gathered = hwdist.all_gather_object(torch_kinds.everything(rank), weights_only=True)
    want = [torch_kinds.everything(r) for r in range(world)]
    got.append(len(gathered) == world and all(torch_kinds.same(w, g) for w, g in zip(want, gathered)))
    box = [torch_kinds.model(rank).state_dict(), torch_kinds.everything(rank)]
    hwdist.broadcast_object_list(box, src=1, weights_only=True)
    got.append(torch_kinds.same(box[0], torch_kinds.model(1).state_dict()))
    got.append(torch_kinds.same(box[1], torch_kinds.everything(1)))
    fresh = torch_kinds.model(7)
    fresh.load_state_dict(box[0])  # strict, and _metadata's versions came along
    x = torch.ones(4, 3)
    got.append(torch.equal(fresh.eval()(x), torch_kinds.model(1).eval()(x)))
    return got


def _torch_accepts_state_dicts() -> bool:
    """torch's own all_gather_object(weights_only=True) with a module's state_dict (torch >= 2.14)."""
    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    out: list = [None] * world
    torch_dist.all_gather_object(out, torch_kinds.model(rank).state_dict(), weights_only=True)
    return all(torch_kinds.same(torch_kinds.model(r).state_dict(), o) for r, o in enumerate(out))


def _bad_keyword() -> str:
    try:
        hwdist.all_gather_object(1, weights_only="yes")
    except hwdist.CollectiveArgumentError as exc:
        return str(exc)
    return "no error"


def _default_is_pickle() -> bool:
    """Without the keyword (mmengine's calls), a user type travels as before."""
    return hwdist.all_gather_object(Box(hwdist.get_rank())) == [Box(0), Box(1)]


def _torch_error_type() -> str:
    out: list = [None, None]
    try:
        torch_dist.all_gather_object(out, Box(1), weights_only=True)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__module__}.{type(exc).__qualname__}"
    return "no error"


def test_safe_objects_travel_through_every_collective(dist):
    assert dist(_safe_types_travel, 2, "gloo") == [[True] * 6] * 2


@pytest.mark.skipif(not _compat.HAS_SAFE_GLOBALS, reason=f"torch {torch.__version__} has no add_safe_globals")
def test_types_registered_with_torch_safe_globals_are_allowed(dist):
    assert dist(_registered_types_travel, 2, "gloo") == [[True] * 6] * 2


def test_a_type_not_allowed_raises_unpickling_error_on_every_rank(dist):
    for per_rank in dist(_refused_everywhere, 2, "gloo"):
        assert [name for name, _, _ in per_rank] == [
            "all_gather_object",
            "gather_object",
            "broadcast_object_list",
            "scatter_object_list",
        ]
        for name, message, right_type in per_rank:
            assert right_type, (name, message)
            assert "Box" in message and "add_safe_globals" in message, (name, message)
            assert "rank(s) 1" in message, (name, message)


def test_state_dicts_sparse_and_quantized_tensors_travel_with_weights_only(dist):
    """What torch's weights_only=True loader accepts travels with hwdist's weights_only=True, any torch."""
    assert not torch_kinds.same(torch_kinds.everything(0), torch_kinds.everything(1))  # ranks differ
    assert dist(_torch_kinds_travel, 2, "gloo") == [[True] * 4] * 2


_TORCH_HAS_WEIGHTS_ONLY = _compat.DIST_AVAILABLE and (
    "weights_only" in inspect.signature(torch_dist.all_gather_object).parameters
)


@pytest.mark.skipif(
    not _TORCH_HAS_WEIGHTS_ONLY,
    reason=f"torch {torch.__version__}'s all_gather_object has no weights_only (torch >= 2.14)",
)
def test_torchs_own_weights_only_accepts_the_state_dict_too(dist):
    assert dist(_torch_accepts_state_dicts, 2, "gloo") == [True, True]


def test_bad_weights_only_names_the_argument_and_default_stays_pickle(dist):
    for message in dist(_bad_keyword, 2, "gloo"):
        assert "weights_only must be True or False" in message and "'yes'" in message
    assert dist(_default_is_pickle, 2, "gloo") == [True, True]


@pytest.mark.skipif(
    not _TORCH_HAS_WEIGHTS_ONLY,
    reason=f"torch {torch.__version__}'s all_gather_object has no weights_only (torch >= 2.14)",
)
def test_the_error_type_is_the_one_torch_raises(dist):
    for torch_type in dist(_torch_error_type, 2, "gloo"):
        assert torch_type == "_pickle.UnpicklingError"
        assert issubclass(hwdist.WeightsOnlyRefused, pickle.UnpicklingError)
