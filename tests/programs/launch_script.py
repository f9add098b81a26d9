"""Started by a real launcher (torchrun, mpiexec, torchrun in network namespaces).

Calls ``hwdist.init_dist()`` with everything inferred, runs every collective
and the local groups, and writes ``rank<N>.json`` into the directory given as
the first argument. The tests compute the expected values from rank numbers.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as tdist

import hwdist


def run(out_dir: str) -> None:
    info = hwdist.init_dist(timeout=60)
    assert info is not None
    r, n = hwdist.get_rank(), hwdist.get_world_size()
    res: dict = {
        "info": {
            "launcher": info.launcher,
            "rank": info.rank,
            "world_size": info.world_size,
            "local_rank": info.local_rank,
            "node_rank": info.node_rank,
            "backend": info.backend,
            "torch_backend": hwdist.get_backend(),
            "detected": hwdist.detect().backend,
        }
    }
    # hwdist's own collectives, so real launchers exercise the registry -> driver path.
    t = torch.tensor([float(r + 1)])
    hwdist.all_reduce(t)
    res["all_reduce"] = t.item()
    res["all_gather"] = [o.item() for o in hwdist.all_gather(torch.tensor([float(r)]))]
    t = torch.tensor([float(r)])
    hwdist.broadcast(t, src=n - 1)
    res["broadcast"] = t.item()
    t = torch.tensor([float(r + 1)])
    hwdist.reduce(t, dst=0)
    res["reduce"] = t.item() if r == 0 else None
    g = hwdist.gather(torch.tensor([float(r)]), dst=0)
    res["gather"] = [x.item() for x in g] if g else None
    o = torch.zeros(1)
    hwdist.scatter(o, [torch.tensor([10.0 * i]) for i in range(n)] if r == 0 else None, src=0)
    res["scatter"] = o.item()
    o = torch.zeros(1)
    hwdist.reduce_scatter(o, [torch.tensor([float(q + r)]) for q in range(n)])
    res["reduce_scatter"] = o.item()
    outs = [torch.zeros(1) for _ in range(n)]
    hwdist.all_to_all(outs, [torch.tensor([float(q + 10 * r)]) for q in range(n)])
    res["all_to_all"] = [x.item() for x in outs]
    got = torch.zeros(1)
    ops = [
        tdist.P2POp(tdist.isend, torch.tensor([float(r)]), (r + 1) % n),
        tdist.P2POp(tdist.irecv, got, (r - 1) % n),
    ]
    for work in tdist.batch_isend_irecv(ops):  # torch's batched p2p on hwdist's group
        work.wait()
    res["ring"] = got.item()
    res["all_gather_object"] = hwdist.all_gather_object({"rank": r})
    hwdist.barrier()
    local = hwdist.get_local_group()
    t = torch.tensor([float(r)])
    hwdist.all_reduce(t, group=local)
    res["local_sum"] = t.item()
    res["local"] = [hwdist.get_local_rank(), hwdist.get_local_size()]
    per_node = info.local_world_size or n
    node = info.node_rank if info.node_rank is not None else r // per_node
    explicit = hwdist.init_local_group(node, per_node)
    t = torch.tensor([float(r)])
    hwdist.all_reduce(t, group=explicit)
    res["explicit_local_sum"] = t.item()
    res["explicit_local"] = [hwdist.get_local_rank(), hwdist.get_local_size()]
    hwdist.destroy()
    hwdist.destroy()  # safe twice
    res["after_destroy"] = [hwdist.is_distributed(), hwdist.get_local_group()]
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as fh:
        json.dump(res, fh)


def expected(rank: int, world: int, per_node: int) -> dict:
    """What ``run`` must report on ``rank`` (computed from rank numbers only)."""
    node = rank // per_node
    node_ranks = range(node * per_node, (node + 1) * per_node)
    return {
        "all_reduce": world * (world + 1) / 2,
        "all_gather": [float(q) for q in range(world)],
        "broadcast": float(world - 1),
        "reduce": world * (world + 1) / 2 if rank == 0 else None,
        "gather": [float(q) for q in range(world)] if rank == 0 else None,
        "scatter": 10.0 * rank,
        "reduce_scatter": float(sum(rank + q for q in range(world))),
        "all_to_all": [float(rank + 10 * q) for q in range(world)],
        "ring": float((rank - 1) % world),
        "all_gather_object": [{"rank": q} for q in range(world)],
        "local_sum": float(sum(node_ranks)),
        "local": [rank - node * per_node, per_node],
        "explicit_local_sum": float(sum(node_ranks)),
        "explicit_local": [rank - node * per_node, per_node],
        "after_destroy": [False, None],
    }


if __name__ == "__main__":
    run(sys.argv[1])
