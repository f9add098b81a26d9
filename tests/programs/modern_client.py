"""A short training program written the modern way, started by torchrun (tests/drivers/test_generic.py).

torch's own ``init_process_group()`` without a backend, a DeviceMesh, a model sharded with FSDP2's
``fully_shard`` (HSDP on a 2-D mesh), and what a training loop needs from hwdist: a seed shared by every
rank (``sync_random_seed``), metrics (``all_reduce_dict``, on the default group and on a mesh dimension's
group) and the predictions gathered in dataset order (``collect_results``). With ``--raw`` the same
program makes those calls with ``torch.distributed`` itself, so the two runs can be compared.

Usage::

    python -m torch.distributed.run --standalone --nproc-per-node 2 modern_client.py OUT_DIR [--raw]
    python -m torch.distributed.run --standalone --nproc-per-node 4 modern_client.py OUT_DIR --mesh 2x2

Each rank writes ``OUT_DIR/rank<R>.json``. Needs torch >= 2.6.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import hwdist

N_TRAIN, N_EVAL, FEATURES, CLASSES = 32, 13, 8, 4  # 13 eval items: the sampler pads, collect truncates
EPOCHS, BATCH, LR = 2, 4, 0.2


# ---- the three calls this program makes through hwdist, or through torch.distributed (--raw) ------


def seed_hwdist() -> int:
    return hwdist.sync_random_seed()


def seed_raw() -> int:
    """mmengine's sync_random_seed: rank 0 draws, every rank receives it."""
    seed = torch.tensor(int(np.random.randint(2**31)) if dist.get_rank() == 0 else 0, dtype=torch.int32)
    dist.broadcast(seed, src=0)
    return int(seed.item())


def reduce_hwdist(metrics: dict[str, torch.Tensor], op: str, group: Any = None) -> dict[str, torch.Tensor]:
    hwdist.all_reduce_dict(metrics, op=op, group=group)
    return metrics


def reduce_raw(metrics: dict[str, torch.Tensor], op: str, group: Any = None) -> dict[str, torch.Tensor]:
    n = dist.get_world_size(group)
    for key in sorted(metrics):
        t = metrics[key]
        dist.all_reduce(t, group=group)
        if op == "mean":
            metrics[key] = t / n
    return metrics


def collect_hwdist(results: list[Any], size: int) -> Optional[list[Any]]:
    return hwdist.collect_results(results, size)


def collect_raw(results: list[Any], size: int) -> Optional[list[Any]]:
    """mmengine's collect_results over communication: rank 0 interleaves the ranks' parts, truncates."""
    parts: Optional[list[Any]] = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(results, parts, dst=0)
    if parts is None:
        return None
    return [item for row in zip(*parts) for item in row][:size]


# ---- the program --------------------------------------------------------------------------------


def shard(indices: list[int], rank: int, world: int) -> list[int]:
    """DistributedSampler without shuffling: pad by wrapping around to a multiple of ``world``."""
    padded = indices + indices[: (-len(indices)) % world]
    return padded[rank::world]


def build_mesh(shape: tuple[int, ...]) -> DeviceMesh:
    names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def train(out_dir: str, raw: bool, shape: tuple[int, ...]) -> None:
    dist.init_process_group(timeout=timedelta(seconds=60))  # no backend: torch picks one per device
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = build_mesh(shape)
    sync_seed: Callable[[], int] = seed_raw if raw else seed_hwdist
    reduce = reduce_raw if raw else reduce_hwdist
    collect = collect_raw if raw else collect_hwdist

    np.random.seed(1000 + rank)  # each rank draws a different number: only the shared seed agrees
    seed = sync_seed()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N_TRAIN + N_EVAL, FEATURES, generator=gen)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=gen)).argmax(1)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # HSDP on a 2-D mesh: replicate x shard
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    mine = shard(list(range(N_TRAIN)), rank, world)
    losses, shard_losses = [], []
    for _ in range(EPOCHS):
        for start in range(0, len(mine), BATCH):
            idx = mine[start : start + BATCH]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(reduce({"loss": loss.detach().clone()}, "mean")["loss"].item())
            shard_group = mesh.get_group("shard")  # a group torch made for a mesh dimension
            shard_losses.append(reduce({"loss": loss.detach().clone()}, "mean", shard_group)["loss"].item())

    model.eval()
    eval_idx = shard(list(range(N_TRAIN, N_TRAIN + N_EVAL)), rank, world)
    with torch.no_grad():
        logits = model(x[eval_idx])
    labels = y[eval_idx]
    probs = logits.softmax(1)
    metrics = reduce(
        {
            "correct": (logits.argmax(1) == labels).sum(),
            "count": torch.tensor(len(eval_idx)),
            "loss_sum": F.cross_entropy(logits, labels, reduction="sum"),
        },
        "sum",
    )
    results = [
        {"index": i, "pred": int(p.argmax()), "label": int(t), "score": float(p.max())}
        for i, p, t in zip(eval_idx, probs, labels)
    ]
    gathered = collect(results, N_EVAL)

    out = {
        "api": "torch.distributed" if raw else "hwdist",
        # the drivers hwdist finds for the default group and a mesh dimension's group (both made by torch)
        "drivers": [hwdist.get_driver(g).name for g in (None, mesh.get_group("shard"))],
        "rank": rank,
        "world_size": world,
        "mesh": list(shape),
        "backend_config": str(dist.get_backend_config()),
        "seed": seed,
        "losses": losses,
        "shard_losses": shard_losses,
        "metrics": {k: v.item() for k, v in metrics.items()},
        "metric_dtypes": {k: str(v.dtype) for k, v in metrics.items()},
        "results": gathered,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--raw", action="store_true", help="torch.distributed calls instead of hwdist's")
    parser.add_argument("--mesh", default=None, help="mesh shape, e.g. 2 or 2x2 (default: the world size)")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.mesh.split("x")) if args.mesh else (int(os.environ["WORLD_SIZE"]),)
    train(args.out_dir, args.raw, shape)


if __name__ == "__main__":
    main()
