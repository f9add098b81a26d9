"""Instructions the ``hwdist`` torch backend adds to a pass-through collective, counted with callgrind.

The timed figures of ``bench_backend.py`` move with the host by more than the cost they measure (on a
shared 2-core host, plain gloo's own call took 18 us of CPU one day and 42-52 us another). An
instruction count does not: it is the same on every run of the same code, so it tells whether a change
made the backend's path longer or shorter. It does not see what the instructions cost (cache misses,
the caller waiting for a core); the timed bench does.

Each row runs in a process of its own under ``valgrind --tool=callgrind``, with the counting off until
the process is set up: one rank, a one-rank group (no network), a one-element tensor, 200 calls to warm
up. Then the counting goes on and ``--calls`` ``all_reduce`` calls run; the table gives the calling
thread's instructions per call (callgrind counts each thread apart: the wrapped backend's thread and
hwdist's sweeper and watchdog threads are left out) and the difference from plain gloo.

* ``gloo``: ``dist.all_reduce`` on a gloo group;
* ``Python backend, forwarding only``: a Python backend whose ``allreduce`` calls gloo's, the cost of
  torch calling into any Python backend;
* ``hwdist, recorder off`` and ``hwdist``: the wrapper of gloo, with hwdist's flight recorder off and on.

Usage: ``python -m benchmarks.instructions_backend [--calls 2000]`` (torch >= 2.15; needs ``valgrind``
and ``callgrind_control`` on the PATH). A row takes about a minute: valgrind runs Python about 50 times
slower.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROWS = ("gloo", "Python backend, forwarding only", "hwdist, recorder off", "hwdist")


def _child(row: str, calls: int, tmp: str) -> None:
    """One row: set up, say so, wait until counting is on, run the calls, exit at once."""
    import torch
    import torch.distributed as dist

    import hwdist.backend
    import hwdist.flight

    from .bench_backend import FLOOR, _register_floor

    spec = hwdist.backend.register(wraps="gloo")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    if row == FLOOR:
        _register_floor()
        group = dist.new_group(backend="cpu:forward")
    else:
        group = dist.new_group(backend="gloo" if row == "gloo" else spec)
    hwdist.flight.enable(row != "hwdist, recorder off")
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t, group=group)
    open(os.path.join(tmp, "ready"), "w").close()
    while not os.path.exists(os.path.join(tmp, "go")):
        time.sleep(0.01)
    for _ in range(calls):
        dist.all_reduce(t, group=group)
    os._exit(0)  # no teardown in the count


def _count(row: str, calls: int) -> int:
    """The calling thread's instructions over ``calls`` calls of ``row``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg")
        cmd = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
            f"--callgrind-out-file={out}", sys.executable, "-m", "benchmarks.instructions_backend",
            "--child", row, "--calls", str(calls), "--tmp", tmp,
        ]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1")
        with open(os.path.join(tmp, "log"), "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                while not os.path.exists(os.path.join(tmp, "ready")):
                    if proc.poll() is not None:
                        raise RuntimeError(f"row {row!r} exited early: {open(log.name).read()[-2000:]}")
                    time.sleep(0.2)
                on = ["callgrind_control", "-i", "on", str(proc.pid)]
                subprocess.run(on, check=True, capture_output=True)
                open(os.path.join(tmp, "go"), "w").close()
                proc.wait(timeout=1800)
            finally:
                if proc.poll() is None:
                    proc.kill()
        with open(out + "-01") as f:  # thread 1: the calling (main) thread
            for line in f:
                if line.startswith("summary:"):
                    return int(line.split()[1])
    raise RuntimeError(f"row {row!r}: no summary in callgrind's output")


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.calls, args.tmp)
        return 0
    import torch

    import hwdist.backend

    why = hwdist.backend.unsupported_reason()
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"needs {' and '.join(missing)} on the PATH", file=sys.stderr)
        return 2
    counts = {row: _count(row, args.calls) / args.calls for row in ROWS}
    head = f"torch {torch.__version__}, Python {sys.version.split()[0]}"
    print(f"{head}; {args.calls} calls a row; the calling thread")
    print()
    print("| row | instructions per all_reduce | added to gloo |")
    print("|---|---:|---:|")
    for row, n in counts.items():
        print(f"| {row} | {n / 1e3:.1f}k | {(n - counts['gloo']) / 1e3:+.1f}k |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
