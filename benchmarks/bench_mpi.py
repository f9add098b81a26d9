"""all_reduce of 16 MiB fp32 on 2 ranks: backend 'mpi' (mpi4py process group) vs 'gloo', same run.

    python benchmarks/bench_mpi.py            # starts `mpiexec -n 2` itself
    python benchmarks/bench_mpi.py --size-mib 64 --iters 30

Both process groups live in the same two MPI processes (the default group on
'mpi', a gloo group over the same ranks), so the ratio compares like with
like. Needs mpi4py and mpiexec (`pip install mpi4py mpich`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

CHILD = "HWDIST_BENCH_MPI_CHILD"


def _time(fn, iters: int, warmup: int) -> list[float]:
    import torch.distributed as tdist

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        tdist.barrier()
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as tdist

    import hwdist

    hwdist.init_dist("mpi", backend="mpi", local_group=False)
    gloo = tdist.new_group(backend="gloo")
    numel = args.size_mib * (1 << 20) // 4
    t = torch.ones(numel, dtype=torch.float32)
    rows = []
    for name, group in (("mpi", None), ("gloo", gloo)):
        times = _time(lambda g=group: tdist.all_reduce(t, group=g), args.iters, args.warmup)
        worst = torch.tensor([statistics.median(times)])
        tdist.all_reduce(worst, op=tdist.ReduceOp.MAX)  # the slowest rank's median
        rows.append((name, worst.item()))
    if tdist.get_rank() == 0:
        nbytes = numel * 4
        print(f"all_reduce {args.size_mib} MiB fp32, {tdist.get_world_size()} ranks, median of {args.iters}")
        print(f"{'backend':8} {'ms':>9} {'GB/s (algbw)':>13}")
        for name, sec in rows:
            print(f"{name:8} {sec * 1e3:9.2f} {nbytes / sec / 1e9:13.2f}")
        print(f"mpi speed-up over gloo: {rows[1][1] / rows[0][1]:.2f}x")
    hwdist.destroy()


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=16)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (the runner's --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.iters, args.warmup = min(args.iters, 5), min(args.warmup, 1)
    if os.environ.get(CHILD) == "1" or any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")):
        child(args)
        return 0
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        print("bench_mpi: skipped: mpiexec not found (pip install mpi4py mpich)", file=sys.stderr)
        return 0
    env = {**os.environ, CHILD: "1"}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [mpiexec, "-n", str(args.nprocs), sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    return subprocess.run(cmd, env=env, timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main())
