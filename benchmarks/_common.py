"""What every benchmark module shares: interleaved timing, formatting and the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch
import torch.distributed as tdist

from hwdist.testing import RankPool

KiB = 1024
MiB = 1024 * 1024
# One intra-op thread per rank, as torchrun sets it: 2 ranks on 2 cores must not oversubscribe.
ENV = {"OMP_NUM_THREADS": "1"}


def measure(
    cases: dict[str, Callable[[], Any]],
    iters: int,
    samples: int,
    context: Optional[Callable[[str], ContextManager[Any]]] = None,
) -> dict[str, list[float]]:
    """Per-call seconds of each case, sampled interleaved (the order alternates each sample).

    ``context(name)``, if given, wraps each sample of case ``name`` (e.g. a mode switch).
    """
    times: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    ctx = context or (lambda name: contextlib.nullcontext())

    def once(name: str, n: int) -> float:
        fn = cases[name]
        with ctx(name):
            tdist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n

    for name in names:  # warm up (plans, caches, gloo buffers)
        once(name, 1)
    for s in range(samples):
        for name in names if s % 2 == 0 else reversed(names):
            times[name].append(once(name, iters))
    return times


def raw_all_gather_list(t: Any, world_size: int) -> list[Any]:
    """The baseline of the gather benches: raw ``torch.distributed.all_gather`` into a new list.

    A bench times it under two names, the second as the noise-floor control row.
    """
    out = [torch.empty_like(t) for _ in range(world_size)]
    tdist.all_gather(out, t)
    return out


def fmt_us(us: float) -> str:
    """Microseconds as ``12.3 us`` or ``1.23 ms``."""
    return f"{us / 1000:.2f} ms" if abs(us) >= 1000 else f"{us:.1f} us"


def bench_main(
    argv: Sequence[str],
    description: str,
    stages: Sequence[tuple[int, Callable[[bool], list[dict[str, Any]]]]],
    format_table: Callable[[list[dict[str, Any]]], str],
) -> int:
    """Parse ``--quick``/``--json``, run each (world size, rank function) on gloo, print the table."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer samples")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(list(argv))
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for world_size, fn in stages:
        with RankPool(world_size, "gloo", timeout=600, env=ENV) as pool:
            rows += pool.run(fn, args.quick, timeout=600)[0]
    report(rows, f"gloo, ranks on one host; {time.perf_counter() - start:.0f}s", format_table, args.json)
    return 0


def report(
    rows: list[dict[str, Any]],
    setting: str,
    format_table: Callable[[list[dict[str, Any]]], str],
    json_path: Optional[str] = None,
) -> None:
    """Print torch's version and ``setting``, then the table; write the rows as JSON if asked."""
    print(f"torch {torch.__version__}, {setting}\n")
    print(format_table(rows))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(rows, fh, indent=1)
