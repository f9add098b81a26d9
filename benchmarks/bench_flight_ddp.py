"""Cost of recording torch.distributed's own calls through torch's hooks, on a DDP step (gloo, 2 ranks).

Rows, interleaved round by round so that a loaded machine slows every row alike:

* ``off``: DDP steps with hwdist's hooks detached (raw torch);
* ``on``: the same steps with the recorder attached to the group through torch's hooks;
* ``off (control)``: ``off`` again: its distance to ``off`` is the noise of the machine.

Usage: ``python -m benchmarks.bench_flight --ddp [--rounds 7] [--steps 30]`` (torch >= 2.14).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - t0) / n


def _rank(rank: int, world: int, store: str, rounds: int, steps: int, out: str) -> None:
    import hwdist
    from hwdist.flight import torch_hooks

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.01)  # several buckets per step
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 64)
    rec = hwdist.flight._recorder
    _steps(model, opt, x, 5)  # warm up
    before = len(rec.ring)
    torch_hooks.attach(rec, None)
    _steps(model, opt, x, 1)
    per_step = len(rec.ring) - before  # collectives one DDP step issues
    torch_hooks.detach_all()
    rows: dict[str, list[float]] = {"off": [], "on": [], "off (control)": []}
    for _ in range(rounds):
        for name in rows:
            if name == "on":
                torch_hooks.attach(rec, None)
            dist.barrier()
            rows[name].append(_steps(model, opt, x, steps))
            torch_hooks.detach_all()
    if rank == 0:
        with open(out, "w") as f:
            off = statistics.median(rows["off"])
            for name, vals in rows.items():
                med = statistics.median(vals)
                f.write(
                    f"| {name} | {med * 1e3:.3f} ms | {min(vals) * 1e3:.3f}-{max(vals) * 1e3:.3f} ms"
                    f" | {(med - off) / off * 100:+.1f}% |\n"
                )
            cost = (statistics.median(rows["on"]) - off) / max(per_step, 1)
            f.write(f"\ncollectives per step: {per_step}; cost per collective: {cost * 1e6:.1f} us\n")
    dist.destroy_process_group()


def _micro(store: str, rounds: int, calls: int = 2000) -> str:
    """Per-call cost of the hooks without network: all_reduce of 1 element on a 1-rank gloo group."""
    import hwdist
    from hwdist.flight import torch_hooks

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    rec, t = hwdist.flight._recorder, torch.ones(1)
    rows: dict[str, list[float]] = {"off": [], "on": [], "off (control)": []}
    for _ in range(rounds):
        for name in rows:
            if name == "on":
                torch_hooks.attach(rec, None)
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            rows[name].append((time.perf_counter() - t0) / calls)
            torch_hooks.detach_all()
    dist.destroy_process_group()
    off = statistics.median(rows["off"])
    lines = [
        f"| 1-rank all_reduce, {name} | {statistics.median(v) * 1e6:.1f} us"
        f" | {min(v) * 1e6:.1f}-{max(v) * 1e6:.1f} us | {(statistics.median(v) - off) * 1e6:+.1f} us |"
        for name, v in rows.items()
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args(argv)
    from hwdist import _compat

    if not _compat.PG_HAS_HOOKS:
        print(f"torch {torch.__version__} has no per-group collective hooks (torch >= 2.14)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        micro = _micro(os.path.join(tmp, "store1"), a.rounds)
        out = os.path.join(tmp, "out.md")
        mp.spawn(_rank, (2, os.path.join(tmp, "store"), a.rounds, a.steps, out), nprocs=2)
        print(f"torch {torch.__version__}, gloo, 2 ranks, DDP step of 4 Linear(64, 64), {a.steps} steps/row")
        print("| row | median step | spread (min-max) | vs off |\n|---|---|---|---|")
        print(open(out).read(), end="")
        print("\n| row | median per call | spread | vs off |\n|---|---|---|---|")
        print(micro, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
