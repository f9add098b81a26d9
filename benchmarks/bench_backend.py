"""Cost of the ``hwdist`` torch backend around gloo (pass-through plans), paired against plain gloo.

Every rank holds three process groups over the same ranks: ``gloo``, ``gloo (control)`` (a second
plain gloo group) and ``hwdist`` (``cpu:hwdist`` wrapping gloo: every plan here is a pass-through but
FSDP2's AVG reduce_scatter, a SUM then the division). Rows are interleaved round by round, each round
starting one row further on, so that a loaded machine slows every row alike and no row always runs
first; the control row's distance to ``gloo`` is the machine's noise.

* DDP step of a small CNN (two conv layers and a linear head, 16 images of 3x32x32);
* FSDP2 step of a small MLP sharded per layer (``fully_shard`` on a mesh over the group);
* one 1-element all_reduce on a one-rank group of each kind (no network), many calls a round: the CPU
  a pass-through adds per collective (torch's call into Python, the route look-up, the flight
  recorder's entry and its completion). It is timed as the process's CPU time (``time.process_time``:
  every thread of the rank, the wrapped backend's and the sweeper's included, and none of the time the
  rank waits for a core), so a loaded shared host changes it far less than the wall clock; the wall
  time is shown beside it. An extra row runs the wrapper with hwdist's flight recorder off.

Steps are timed on the wall clock (their communication waits for the other rank); FSDP2's also as
rank 0's CPU time (every thread of the process). A run's figure is the median over its rounds (the
per-call rows also give the minimum's difference). One run on a 2-core shared host moves by more than
the targets (its control row reads 0.90-1.07x of gloo), so ``--runs K`` repeats the whole run K times,
each with fresh processes, and every cell is the median over runs with the range beside it. The load
average is printed before and after.

Usage: ``OMP_NUM_THREADS=1 python -m benchmarks.bench_backend [--runs 5] [--rounds 9] [--steps 10]
[--calls 500] [--quick]`` (torch >= 2.15; ``--quick``: 3 rounds of 4 steps, 100 calls, a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ROWS = ("gloo", "hwdist", "gloo (control)")
FLOOR = "Python backend, forwarding only"
CALL_ROWS = ROWS + ("hwdist, recorder off", FLOOR)


def _register_floor() -> None:
    """A Python backend that only forwards ``allreduce`` to a gloo backend: what torch's call into a
    Python backend costs by itself (the floor under the wrapper's figure)."""
    from torch._C._distributed_c10d import Backend

    from hwdist import registry
    from hwdist.backend.wrapper import _inner_backend

    class Forward(Backend):  # type: ignore[misc]
        def __init__(self, opts: Any, inner: Any) -> None:
            super().__init__(opts.group_rank, opts.group_size)
            self.inner = inner
            self._opts = Backend.Options("forward", timeout=opts.timeout)

        @property
        def options(self) -> Any:
            return self._opts

        def getBackendName(self) -> str:  # noqa: N802 (torch's name)
            return "forward"

        def allreduce(self, tensors: Any, opts: Any) -> Any:
            return self.inner.allreduce(tensors, opts)

    def create(opts: Any, backend_options: Any = None) -> Any:
        inner = _inner_backend(registry.get_driver("gloo"), opts, backend_options, opts.store)
        return Forward(opts, inner)

    dist.Backend.register_backend("forward", create, extended_api=True, devices=["cpu"])


def _cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 16, 10),
    )


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])


def _timed(step: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


def _cpu_timed(step: Callable[[], None], n: int) -> tuple[float, float]:
    """(CPU seconds of the process, wall seconds) per call of ``step``."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        step()
    return (time.process_time() - c0) / n, (time.perf_counter() - t0) / n


def _rotated(rows: tuple[str, ...], i: int) -> tuple[str, ...]:
    """``rows`` starting at row ``i`` (mod their number): every row takes every place in a round in turn,
    so no row always follows the same one (on a 2-core host, with a fixed order, two FSDP2 runs read
    the control row at 0.91x and 0.95x of the row before it)."""
    k = i % len(rows)
    return rows[k:] + rows[:k]


def _trainer(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out, y) if y.numel() else out.sum()
        loss.backward()
        opt.step()

    return step


def _rank(rank: int, world: int, store: str, args: Any, out: str) -> None:
    import hwdist.backend
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    spec = hwdist.backend.register(wraps="gloo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    groups = {
        "gloo": dist.new_group(backend="gloo"),
        "hwdist": dist.new_group(backend=spec),
        "gloo (control)": dist.new_group(backend="gloo"),
    }
    g = torch.Generator().manual_seed(rank)
    images, labels = torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    feats = torch.randn(32, 512, generator=g)
    ddp, fsdp, single = {}, {}, {}
    for name, group in groups.items():
        model = torch.nn.parallel.DistributedDataParallel(_cnn(), process_group=group)
        ddp[name] = _trainer(model, images, labels)
        mesh = DeviceMesh.from_group(group, "cpu")
        mlp = _mlp()
        for layer in mlp:
            fully_shard(layer, mesh=mesh)
        fully_shard(mlp, mesh=mesh)
        fsdp[name] = _trainer(mlp, feats, torch.empty(0))
        backend = spec if name == "hwdist" else "gloo"
        solo = [dist.new_group([r], backend=backend) for r in range(world)][rank]  # no network: CPU only
        t = torch.ones(1)
        single[name] = lambda t=t, group=solo: dist.all_reduce(t, group=group)
    single["hwdist, recorder off"] = single["hwdist"]
    _register_floor()
    floor = [dist.new_group([r], backend="cpu:forward") for r in range(world)][rank]
    one = torch.ones(1)
    single[FLOOR] = lambda t=one, group=floor: dist.all_reduce(t, group=group)
    import hwdist.flight

    results: dict[str, dict[str, list[float]]] = {k: {} for k in ("ddp", "fsdp", "ddp cpu", "fsdp cpu")}
    results.update(call={}, wall={})
    for kind, table, n in (("ddp", ddp, args.steps), ("fsdp", fsdp, args.steps)):
        for name in ROWS:
            _timed(table[name], max(2, n // 5))  # warm up
            results[kind][name], results[kind + " cpu"][name] = [], []
        for i in range(args.rounds):
            for name in _rotated(ROWS, i):
                dist.barrier()
                cpu, wall = _cpu_timed(table[name], n)
                results[kind][name].append(wall)
                results[kind + " cpu"][name].append(cpu)
    for name in CALL_ROWS:
        _cpu_timed(single[name], max(2, args.calls // 5))
        results["call"][name], results["wall"][name] = [], []
    for i in range(args.rounds * 3):  # no network: each rank alone, short rounds, many of them
        for name in _rotated(CALL_ROWS, i):
            was = hwdist.flight.enable(name != "hwdist, recorder off")
            cpu, wall = _cpu_timed(single[name], args.calls)
            hwdist.flight.enable(was)
            results["call"][name].append(cpu)
            results["wall"][name].append(wall)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _one_run(args: Any) -> dict[str, dict[str, list[float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_rank, args=(2, os.path.join(tmp, "store"), args, out), nprocs=2)
        with open(out) as f:
            return json.load(f)  # type: ignore[no-any-return]


def _spread(values: list[float], fmt: str, unit: str) -> str:
    """The median of ``values`` and its unit, with their range when there are several."""
    mid = format(statistics.median(values), fmt) + unit
    if len(values) == 1 or min(values) == max(values):
        return mid
    return f"{mid} ({format(min(values), fmt)} to {format(max(values), fmt)})"


def _print_tables(runs: list[dict[str, dict[str, list[float]]]]) -> None:
    """Each cell: the median over runs of the run's median over rounds, and the range over runs."""
    med = [{k: {n: statistics.median(v) for n, v in rows.items()} for k, rows in r.items()} for r in runs]
    low = [{k: {n: min(v) for n, v in rows.items()} for k, rows in r.items()} for r in runs]
    steps = (("ddp", "DDP step (CNN)"), ("fsdp", "FSDP2 step (MLP)"), ("fsdp cpu", "FSDP2 step, CPU"))
    print("| row | " + " | ".join(f"{title} | vs gloo" for _, title in steps) + " |")
    print("|---|" + "---:|---:|" * len(steps))
    for name in ROWS:
        cells = []
        for kind, _ in steps:
            cells.append(_spread([m[kind][name] * 1e3 for m in med], ".2f", " ms"))
            cells.append(_spread([m[kind][name] / m[kind]["gloo"] for m in med], ".3f", "x"))
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n| row | CPU per all_reduce | added (median) | added (min) | wall per all_reduce | added |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in CALL_ROWS:
        cells = [
            _spread([m["call"][name] * 1e6 for m in med], ".1f", " us"),
            _spread([(m["call"][name] - m["call"]["gloo"]) * 1e6 for m in med], "+.1f", " us"),
            _spread([(lo["call"][name] - lo["call"]["gloo"]) * 1e6 for lo in low], "+.1f", " us"),
            _spread([m["wall"][name] * 1e6 for m in med], ".1f", " us"),
            _spread([(m["wall"][name] - m["wall"]["gloo"]) * 1e6 for m in med], "+.1f", " us"),
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1, help="whole runs, each with fresh processes")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 4 steps, 100 calls (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.calls = min(args.rounds, 3), min(args.steps, 4), min(args.calls, 100)
    import hwdist.backend

    why = hwdist.backend.unsupported_reason()
    if why is not None:
        print(f"bench_backend: skipped: {why}", file=sys.stderr)
        return 0
    before = _load()
    runs = [_one_run(args) for _ in range(args.runs)]
    print(
        f"torch {torch.__version__}, 2 ranks, {os.cpu_count()} cores, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', '-')}; load average before {before}, after {_load()}"
    )
    print(
        f"{args.runs} run(s); each: {args.rounds} rounds of {args.steps} steps, {args.rounds * 3} rounds of"
        f" {args.calls} calls, rows interleaved; median over runs of each run's median over rounds"
        + (" (range over runs)" if args.runs > 1 else "")
        + "\n"
    )
    _print_tables(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
