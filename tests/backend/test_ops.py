"""DDP, FSDP2 and DTensor through the hwdist backend, against the same training on plain gloo.

Each rank trains twice in one call: on plain gloo, then on ``hwdist:emu-strict`` (no bfloat16, no int64,
no MAX, no AVG, no PREMUL_SUM: tests/backend/_strict.py), from the same seeds; the parent compares
the final parameters bit for bit. Where a plan reorders a floating sum (bfloat16 summed in float32 on
more than two ranks) the comparison states its tolerance instead.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as torch_dist
import torch.nn.functional as F

from hwdist import _compat

from . import _strict

NEED = ".".join(map(str, _compat.PYTHON_BACKENDS_TORCH))
pytestmark = [
    pytest.mark.skipif(not _compat.PYTHON_BACKENDS, reason=f"needs torch >= {NEED} (Python backends)"),
    pytest.mark.timeout(480),
]
BACKEND = f"hwdist:{_strict.STRICT}"
STEPS = 20


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 4),
    )
    return model.to(dtype)


def _batch(rank: int, step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g).to(dtype), torch.randn(8, 4, generator=g).to(dtype)


def _train(kind: str, backend: str, store: str, dtype: torch.dtype) -> tuple[list[torch.Tensor], list]:
    _strict.init(backend, store)
    rank = torch_dist.get_rank()
    try:
        model = _model(dtype)
        if kind == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer)
            fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step in range(STEPS):
            x, y = _batch(rank, step, dtype)
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
            opt.step()
        params = [
            (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()
        ]
        return params, _strict.calls()
    finally:
        _strict.done()


def _both(kind: str, store_dir: str, dtype_name: str) -> dict:
    dtype = getattr(torch, dtype_name)
    plain, _ = _train(kind, "gloo", os.path.join(store_dir, "plain"), dtype)
    wrapped, calls = _train(kind, BACKEND, os.path.join(store_dir, "wrapped"), dtype)
    return {"plain": plain, "wrapped": wrapped, "calls": sorted(set(calls))}


def _check(results: list, exact: bool, tol: float = 0.0) -> None:
    for res in results:
        for a, b in zip(res["plain"], res["wrapped"]):
            if exact:
                assert _strict.same_bits(a, b), (a - b).abs().max()
            else:
                assert torch.allclose(a.float(), b.float(), atol=tol, rtol=tol), (a - b).abs().max()
    first = results[0]["plain"]
    for res in results[1:]:  # every rank ends with the same model
        assert all(_strict.same_bits(a, b) for a, b in zip(first, res["wrapped"]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ddp_trains_bit_identical_to_plain_gloo(dist, tmp_path, dtype):
    results = dist(_both, 2, None, "ddp", str(tmp_path), dtype)
    _check(results, exact=True)
    # bfloat16 gradients travel as float32 (no bfloat16 on the strict table); float32 passes through
    assert ("all_reduce", "sum", "float32") in results[0]["calls"], results[0]["calls"]
    assert not any(c[2] == "bfloat16" for c in results[0]["calls"]), results[0]["calls"]


def test_fsdp2_trains_bit_identical_to_plain_gloo(dist, tmp_path):
    results = dist(_both, 2, None, "fsdp", str(tmp_path), "float32")
    _check(results, exact=True)
    calls = results[0]["calls"]
    # FSDP2 asks reduce_scatter AVG; the strict table has neither: SUM all_reduce, then / world size
    assert ("all_reduce", "sum", "float32") in calls and ("all_gather", None, "float32") in calls, calls
    assert not any(c[0] == "reduce_scatter" or c[1] == "avg" for c in calls), calls


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_four_ranks_train_like_plain_gloo(dist, tmp_path, kind):
    # float32 on 4 ranks: the plans add in gloo's order (pass-through all_reduce; FSDP2's mean as SUM then
    # a division, where gloo's AVG divides the same sum), so the parameters stay bit-identical
    _check(dist(_both, 4, None, kind, str(tmp_path), "float32"), exact=True)


def _dtensor(store: str, backend: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    _strict.init(backend, store)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        a, b = torch.randn(8, 12), torch.randn(12, 6)
        da = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
        db = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
        out = {
            "replicate": da.redistribute(mesh, [Replicate(), Replicate()]).to_local(),
            "shard_swap": da.redistribute(mesh, [Shard(1), Shard(0)]).full_tensor(),
            "matmul": (
                da @ db
            ).full_tensor(),  # contracted dim sharded on tp: a Partial reduced by all_reduce
            "partial": distribute_tensor(a, mesh, [Shard(0), Replicate()])
            .redistribute(mesh, [Partial(), Replicate()])
            .redistribute(mesh, [Replicate(), Shard(1)])
            .full_tensor(),
            "ref": (a, a @ b),
            "calls": sorted(set(_strict.calls())),
        }
        return out
    finally:
        _strict.done()


def _dtensor_both(store_dir: str) -> dict:
    return {
        "plain": _dtensor(os.path.join(store_dir, "plain"), "gloo"),
        "wrapped": _dtensor(os.path.join(store_dir, "wrapped"), BACKEND),
    }


def test_dtensor_redistribute_and_sharded_matmul_on_a_2d_mesh(dist, tmp_path):
    for res in dist(_dtensor_both, 4, None, str(tmp_path)):
        plain, wrapped = res["plain"], res["wrapped"]
        a, ab = wrapped["ref"]
        for key in ("replicate", "shard_swap", "matmul", "partial"):
            assert _strict.same_bits(plain[key], wrapped[key]), key
        assert torch.equal(wrapped["replicate"], a) and torch.equal(wrapped["shard_swap"], a)
        assert torch.allclose(wrapped["matmul"], ab, atol=1e-5)
        assert torch.allclose(wrapped["partial"], a, atol=1e-6)  # redistribute keeps the logical value
        ops = {c[0] for c in wrapped["calls"]}
        # DTensor on CPU swaps shards by all_gather and a chunk; the Partial's sum is an all_reduce
        assert {"all_gather", "all_reduce"} <= ops, wrapped["calls"]
