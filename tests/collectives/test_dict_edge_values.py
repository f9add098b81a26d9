"""``all_reduce_dict`` at its edges, table-driven, on real gloo ranks.

* NaN and ``max``/``min``: a key's result must not depend on the size of the rest of the dict. Each
  key is compared with raw ``torch.distributed.all_reduce`` of that key's tensor alone (on gloo) and
  with ``hwdist.all_reduce`` of it, for a one-element dict, small dicts and large ones (many keys, or
  one large tensor beside the key), NaN on either rank. NaN inside a large tensor is not compared:
  gloo's own max/min gives NaN or the number depending on where the element falls in its ring
  chunks (raw torch 2.13, 2 ranks, 4,096 float32 with NaN at every 7th element on one rank: 293 of
  the 586 NaN positions come back NaN), so there is no one answer to compare with.
* Keys that ``sorted()`` orders only partially (``frozenset({1})`` and ``frozenset({2})``: neither is
  less than the other), equal on every rank but inserted in another order: each key must get its own
  sum with ``verify=False``, and ``verify=True`` must not report equal dicts as different.

The NaN shapes run in the fuzz too (``fuzz_programs.py``, ``edges=True``).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist.testing.pytest_plugin import one_backend

pytestmark = pytest.mark.dist



def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN, same dtype and shape."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    same_nan = torch.equal(got.isnan(), want.isnan())
    return bool(same_nan and torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)))


def _nan_dict(size: str, nan_rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """This rank's dict: key 'a' holds 0.5, or NaN on ``nan_rank``; the other keys plain numbers."""
    me = hwdist.get_rank()
    a = torch.tensor(math.nan if me == nan_rank else 0.5, dtype=dtype)
    data = {"a": a}
    if size == "two keys":
        data["b"] = torch.tensor(float(me), dtype=dtype)
    elif size == "64 keys":
        data.update({f"k{i:02d}": torch.tensor(float(me + i), dtype=dtype) for i in range(63)})
    elif size == "one large tensor":
        data["big"] = torch.arange(4096, dtype=dtype) + me
    return data


def _nan_case(size: str, op: str, nan_rank: int, dtype_name: str) -> list:
    dtype = getattr(torch, dtype_name)
    data = _nan_dict(size, nan_rank, dtype)
    alone = {k: v.clone() for k, v in data.items()}
    hwdist.all_reduce_dict(data, op)
    bad = []
    for key, value in alone.items():
        raw = value.clone()
        torch_dist.all_reduce(raw, getattr(torch_dist.ReduceOp, op.upper()))
        own = value.clone()
        hwdist.all_reduce(own, op)
        if not _same(data[key], raw):
            bad.append(f"{key}: all_reduce_dict gave {data[key].reshape(-1)[:8].tolist()},"
                       f" raw torch {raw.reshape(-1)[:8].tolist()}")  # fmt: skip
        if not _same(own, raw):
            bad.append(f"{key}: hwdist.all_reduce gave {own.reshape(-1)[:8].tolist()}")
    return bad


def _nan(size: str, op: str, nan_rank: int, dtype: str = "float32", defect: Optional[str] = None):
    marks = [pytest.mark.xfail(strict=True, reason=defect)] if defect else []
    return pytest.param(size, op, nan_rank, dtype, marks=marks, id=f"{size}-{op}-nan on {nan_rank}-{dtype}")


SIZES = ("one key", "two keys", "64 keys", "one large tensor")
NAN_TABLE = [
    _nan(size, op, nan_rank, dtype)
    for size in SIZES
    for op in ("max", "min")
    for nan_rank in (0, 1)
    for dtype in (("float32", "float64") if size == "one key" and op == "max" else ("float32",))
]


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("size, op, nan_rank, dtype", NAN_TABLE)
def test_a_nan_key_reduces_as_raw_torch_whatever_the_rest_of_the_dict(
    dist, backend, size, op, nan_rank, dtype
):
    if backend == "mpi":  # MPI's MAX/MIN on NaN depends on the buffer's length (vectorised loops)
        pytest.skip("MPI's own max/min with NaN differs between one element and a longer buffer")
    for rank, bad in enumerate(dist(_nan_case, 2, backend, size, op, nan_rank, dtype)):
        assert not bad, f"rank {rank}: " + "; ".join(bad)


# ------------------------------------------------------------------ keys sorted() orders only partially

KEY_SETS: dict[str, list[Any]] = {
    "two frozensets": [frozenset({1}), frozenset({2})],
    "three frozensets": [frozenset({1}), frozenset({2}), frozenset({3})],
    "frozensets and a str": [frozenset({1}), "loss", frozenset({2})],
    "tuples of one type": [(1, 2), (0, 5), (3,)],  # a total order: a control
}


def _keyed(keys_name: str, verify: bool) -> dict:
    me = hwdist.get_rank()
    keys = KEY_SETS[keys_name]
    order = keys if me == 0 else list(reversed(keys))  # equal dicts, inserted in another order
    # key i holds 10**i on rank 0 and 2 * 10**i on rank 1: each key's sum is 3 * 10**i
    data = {k: torch.tensor(float((me + 1) * 10 ** keys.index(k))) for k in order}
    try:
        hwdist.all_reduce_dict(data, verify=verify)
    except Exception as exc:  # noqa: BLE001 (the type and text are the result)
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"sums": [data[k].item() for k in keys]}


def _keys(name: str, verify: bool, defect: Optional[str] = None):
    marks = [pytest.mark.xfail(strict=True, reason=defect)] if defect else []
    return pytest.param(name, verify, marks=marks, id=f"{name}-verify={verify}")


KEYS_TABLE = [
    _keys("two frozensets", False),
    _keys("two frozensets", True),
    _keys("three frozensets", False),
    _keys("three frozensets", True),
    _keys("frozensets and a str", False),
    _keys("frozensets and a str", True),
    _keys("tuples of one type", False),
    _keys("tuples of one type", True),
]


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("keys_name, verify", KEYS_TABLE)
def test_keys_inserted_in_another_order_each_get_their_own_sum(dist, backend, keys_name, verify):
    want = [3.0 * 10**i for i in range(len(KEY_SETS[keys_name]))]
    for rank, res in enumerate(dist(_keyed, 2, backend, keys_name, verify)):
        assert res == {"sums": want}, f"rank {rank}: {res}"
