"""Object collectives and results collection: hwdist vs raw torch.distributed, same run.

Usage::

    python benchmarks/bench_objects.py [--quick] [--world-sizes 2,3] [--json out.json]

Ranks are real processes on gloo (``hwdist.testing.RankPool``). Each case is
timed on every rank between barriers; the reported time is rank 0's best of
``reps`` runs. Ratios are hwdist / torch (lower is better).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Optional

import numpy as np

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BIG_BYTES = 32 << 20
N_RESULTS = 20_000


def _time(fn: Callable[[], Any], reps: int, inner: int = 1) -> float:
    import torch.distributed as dist

    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        dist.barrier()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def _interleave_zip(parts: list, size: int) -> list:
    out = []
    longest = max(len(p) for p in parts)
    for i in range(longest):
        for p in parts:
            if i < len(p):
                out.append(p[i])
    return out[:size]


def _mmengine_collect() -> Optional[Callable[..., Any]]:
    try:
        from mmengine.dist import collect_results as mm_collect  # type: ignore[import-not-found]
    except Exception:
        return None
    return mm_collect


def _cases(quick: bool) -> dict[str, float]:
    """Run on every rank; returns rank 0's timings in seconds."""
    import torch.distributed as dist

    import hwdist

    rank, world = hwdist.get_rank(), hwdist.get_world_size()
    reps = 3 if quick else 5
    out: dict[str, float] = {}

    # 1. a 32 MiB numpy array per rank
    arr = np.full(BIG_BYTES // 8, float(rank))

    def torch_ag() -> None:
        lst: list = [None] * world
        dist.all_gather_object(lst, arr)

    def torch_g() -> None:
        lst = [None] * world if rank == 0 else None
        dist.gather_object(arr, lst, dst=0)

    out["big/torch all_gather_object"] = _time(torch_ag, reps)
    out["big/torch gather_object"] = _time(torch_g, reps)
    out["big/hwdist all_gather_object"] = _time(lambda: hwdist.all_gather_object(arr), reps)
    out["big/hwdist gather_object"] = _time(lambda: hwdist.gather_object(arr, dst=0), reps)

    # 2. 20k result dicts with a 64-element array each, split as a sampler would
    part = [
        {"idx": i, "pred": np.full(64, i, dtype=np.float32), "label": i % 10}
        for i in range(rank, N_RESULTS, world)
    ]

    def torch_collect() -> None:
        lst = [None] * world if rank == 0 else None
        dist.gather_object(part, lst, dst=0)
        if rank == 0:
            _interleave_zip(lst, N_RESULTS)  # type: ignore[arg-type]

    out["results/torch gather_object"] = _time(torch_collect, reps)
    out["results/hwdist collect_results(comm)"] = _time(lambda: hwdist.collect_results(part, N_RESULTS), reps)
    shared = os.environ["HWDIST_BENCH_TMP"]
    out["results/hwdist collect_results(tmpdir)"] = _time(
        lambda: hwdist.collect_results(part, N_RESULTS, tmpdir=shared), reps
    )
    mm = _mmengine_collect()
    if mm is not None:
        out["results/mmengine collect_results(cpu)"] = _time(lambda: mm(part, N_RESULTS, device="cpu"), reps)

    # 3. small objects
    small = {"loss": 0.25 * rank, "step": 100, "tag": "train"}
    inner = 50 if quick else 200

    def torch_small() -> None:
        lst: list = [None] * world
        dist.all_gather_object(lst, small)

    def torch_small_g() -> None:
        lst = [None] * world if rank == 0 else None
        dist.gather_object(small, lst, dst=0)

    def torch_small_b() -> None:
        dist.broadcast_object_list([small], src=0)

    pairs = {
        "all_gather_object": (torch_small, lambda: hwdist.all_gather_object(small)),
        "gather_object": (torch_small_g, lambda: hwdist.gather_object(small)),
        "broadcast_object_list": (torch_small_b, lambda: hwdist.broadcast_object_list([small])),
    }
    # Alternate torch and hwdist rounds so scheduler drift hits both alike.
    for name, (theirs, ours) in pairs.items():
        t_best = h_best = float("inf")
        for _ in range(reps + 2):
            t_best = min(t_best, _time(theirs, 1, inner))
            h_best = min(h_best, _time(ours, 1, inner))
        out[f"small/torch {name}"] = t_best
        out[f"small/hwdist {name}"] = h_best
    return out


#: (label, hwdist key, torch key, target ratio or None)
ROWS = [
    (
        "all_gather_object, 32 MiB numpy array",
        "big/hwdist all_gather_object",
        "big/torch all_gather_object",
        0.25,
    ),
    (
        "gather_object, 32 MiB numpy array (vs torch all_gather_object)",
        "big/hwdist gather_object",
        "big/torch all_gather_object",
        0.25,
    ),
    (
        "gather_object, 32 MiB numpy array (vs torch gather_object)",
        "big/hwdist gather_object",
        "big/torch gather_object",
        None,
    ),
    (
        "collect_results, 20k dicts (comm)",
        "results/hwdist collect_results(comm)",
        "results/torch gather_object",
        1.0,
    ),
    (
        "collect_results, 20k dicts (tmpdir)",
        "results/hwdist collect_results(tmpdir)",
        "results/torch gather_object",
        1.0,
    ),
    (
        "collect_results, 20k dicts (comm) vs mmengine cpu",
        "results/hwdist collect_results(comm)",
        "results/mmengine collect_results(cpu)",
        0.5,
    ),
    ("all_gather_object, small dict", "small/hwdist all_gather_object", "small/torch all_gather_object", 1.0),
    ("gather_object, small dict", "small/hwdist gather_object", "small/torch gather_object", 1.0),
    (
        "broadcast_object_list, small dict",
        "small/hwdist broadcast_object_list",
        "small/torch broadcast_object_list",
        1.0,
    ),
]


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def table(results: dict[int, dict[str, float]]) -> str:
    """Markdown table of ratios, one block of rows per world size."""
    lines = [
        "| world | case | hwdist | torch | ratio | target |",
        "| ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for world, res in sorted(results.items()):
        for label, ours, theirs, target in ROWS:
            if ours not in res or theirs not in res:
                continue
            ratio = res[ours] / res[theirs]
            mark = "" if target is None else (f"<= {target:g}x " + ("ok" if ratio <= target else "MISSED"))
            lines.append(
                f"| {world} | {label} | {_fmt(res[ours])} | {_fmt(res[theirs])} | {ratio:.2f}x | {mark} |"
            )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark; print a Markdown table; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, world size 2 only")
    parser.add_argument("--world-sizes", default=None, help="comma-separated (default 2,3; --quick: 2)")
    parser.add_argument("--json", default=None, help="also write the raw timings here")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in (args.world_sizes or ("2" if args.quick else "2,3")).split(",")]

    from hwdist.testing import RankPool

    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="hwdist-bench-") as tmp:
        for world in sizes:
            env = {"HWDIST_BENCH_TMP": os.path.join(tmp, "shared"), "OMP_NUM_THREADS": "1"}
            with RankPool(world, "gloo", timeout=600, pg_timeout=300, env=env) as pool:
                results[world] = pool.run(_cases, args.quick, timeout=600)[0]
    if _mmengine_collect() is None:
        print("(mmengine is not installed: its row is skipped)")
    print(table(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({str(k): v for k, v in results.items()}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
