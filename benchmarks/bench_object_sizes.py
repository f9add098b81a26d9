"""Object collectives across sizes: hwdist vs torch's own, paired.

Every case is timed interleaved with its baseline and a control in one process
group (``_common.measure``: a barrier, then ``iters`` calls; the order
alternates each sample); the table gives rank 0's median and min per call, the
median of the per-sample ratios against the baseline and the ratio of the
minimums. "control" is the baseline again under another name: the noise floor.
Nothing here asserts a speed.

Groups (each its own interleaving):

- ``small``: a small dict through ``torch.distributed.all_gather_object`` /
  ``gather_object`` / ``broadcast_object_list`` (baselines) and hwdist's.
- ``32 MiB``: a raw ``torch.distributed.all_gather`` of a 32 MiB tensor into a
  list (baseline), torch's ``all_gather_object`` and hwdist's of a 32 MiB ndarray.
- ``results``: 20k result dicts (a 64-float32 array each) collected on rank 0:
  mmengine's cpu mode (baseline; ``mmengine.dist.collect_results`` when
  importable, else :func:`mmengine_cpu`, the same steps) and hwdist's
  ``collect_results`` over communication.
- ``1 KiB``, ``2 KiB``, ``32 KiB``, ``256 KiB``, ``512 KiB``, ``1 MiB``: a ``bytes`` object of
  that size (larger than a record's inline payload, so hwdist's record exchange is followed by
  the exact-size route) through torch's ``all_gather_object`` /
  ``gather_object`` / ``broadcast_object_list`` (baselines) and hwdist's.

The last column counts the collectives hwdist issued per call (its internal
``protocol.issue``, wrapped in the rank process; rank 0's count).

Usage::

    python -m benchmarks.bench_object_sizes [--quick] [--json PATH] [--world-sizes 2,3] [--groups small,...]
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as tdist

import hwdist
from hwdist.testing import RankPool

from ._common import ENV, MiB, fmt_us, measure, raw_all_gather_list, report

N_RESULTS = 20_000


def mmengine_cpu(part: list, size: int) -> Any:
    """mmengine 0.10's ``collect_results(device='cpu')`` without ``tmpdir``, step by step.

    Rank 0 makes a directory and broadcasts its name (a 512-byte uint8 tensor), every
    rank pickles its whole part into ``part_<rank>.pkl`` (protocol 2), a barrier, rank 0
    loads every part, interleaves them, truncates to ``size`` and removes the directory.
    """
    rank, world = tdist.get_rank(), tdist.get_world_size()
    name = torch.full((512,), 32, dtype=torch.uint8)
    if rank == 0:
        os.makedirs(".dist_test", exist_ok=True)
        path = tempfile.mkdtemp(dir=".dist_test")
        raw = torch.tensor(bytearray(path.encode()), dtype=torch.uint8)
        name[: len(raw)] = raw
    tdist.broadcast(name, 0)
    tmpdir = name.numpy().tobytes().decode().rstrip()
    with open(os.path.join(tmpdir, f"part_{rank}.pkl"), "wb") as fh:
        pickle.dump(part, fh, protocol=2)
    tdist.barrier()
    if rank != 0:
        return None
    parts = []
    for r in range(world):
        with open(os.path.join(tmpdir, f"part_{r}.pkl"), "rb") as fh:
            parts.append(pickle.load(fh))
    out: list = []
    for items in zip(*parts):
        out.extend(items)
    shutil.rmtree(tmpdir)
    return out[:size]


def _mm() -> Callable[[list, int], Any]:
    try:
        from mmengine.dist import collect_results  # type: ignore[import-not-found]
    except Exception:
        return mmengine_cpu
    return lambda part, size: collect_results(part, size, device="cpu")


class _Counter:
    """Counts the collectives hwdist's own traffic issues (wraps ``protocol.issue`` in this process)."""

    def __init__(self) -> None:
        from hwdist.collectives import protocol

        self.mod, self.orig, self.n = protocol, protocol.issue, 0

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            return self.orig(*args, **kwargs)

        protocol.issue = counted  # type: ignore[assignment]

    def per_call(self, fn: Callable[[], Any], calls: int = 5) -> float:
        fn()
        fn()  # warm
        self.n = 0
        for _ in range(calls):
            fn()
        return self.n / calls


def _torch_ops(obj: Any, world: int, rank: int) -> tuple[Callable[[], Any], ...]:
    """torch's all_gather_object, gather_object (to rank 0) and broadcast_object_list (from rank 0) of obj."""

    def t_ag() -> Any:
        out: list = [None] * world
        tdist.all_gather_object(out, obj)
        return out

    def t_g() -> Any:
        out = [None] * world if rank == 0 else None
        tdist.gather_object(obj, out, dst=0)
        return out

    def t_b() -> Any:
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box

    return t_ag, t_g, t_b


def _by_size(label: str, obj: Any, world: int, rank: int, iters: int, samples: int) -> tuple[Any, int, int]:
    t_ag, t_g, t_b = _torch_ops(obj, world, rank)
    cases = {
        f"torch all_gather_object {label}": t_ag,
        f"hwdist all_gather_object {label}": lambda: hwdist.all_gather_object(obj),
        f"torch gather_object {label}": t_g,
        f"hwdist gather_object {label}": lambda: hwdist.gather_object(obj),
        f"torch broadcast_object_list {label}": t_b,
        f"hwdist broadcast_object_list {label}": lambda: hwdist.broadcast_object_list([obj]),
        f"control: torch all_gather_object {label} again": lambda: t_ag(),
    }
    return cases, iters, samples


def _groups(world: int, rank: int, quick: bool) -> dict[str, tuple[dict[str, Callable[[], Any]], int, int]]:
    small = {"loss": 0.25 * rank, "step": 100, "tag": "train"}
    t_ag, t_g, t_b = _torch_ops(small, world, rank)

    arr = np.full((32 * MiB) // 8, float(rank))
    ten = torch.full(((32 * MiB) // 4,), float(rank))

    def raw_list() -> Any:
        return raw_all_gather_list(ten, world)

    def raw_list_again() -> Any:  # the same code under another name: the noise floor
        return raw_all_gather_list(ten, world)

    def t_ag_big() -> Any:
        out: list = [None] * world
        tdist.all_gather_object(out, arr)
        return out

    part = [
        {"idx": i, "pred": np.full(64, i, dtype=np.float32), "label": i % 10}
        for i in range(rank, N_RESULTS, world)
    ]
    mm = _mm()
    it_small = 20 if quick else 100
    samples = 7 if quick else 21
    big_samples = 3 if quick else 9
    return {
        "small": (
            {
                "torch all_gather_object": t_ag,
                "hwdist all_gather_object": lambda: hwdist.all_gather_object(small),
                "torch gather_object": t_g,
                "hwdist gather_object": lambda: hwdist.gather_object(small),
                "torch broadcast_object_list": t_b,
                "hwdist broadcast_object_list": lambda: hwdist.broadcast_object_list([small]),
                "control: torch all_gather_object again": lambda: t_ag(),
            },
            it_small,
            samples,
        ),
        "32 MiB": (
            {
                "raw all_gather list 32 MiB": raw_list,
                "torch all_gather_object 32 MiB": t_ag_big,
                "hwdist all_gather_object 32 MiB": lambda: hwdist.all_gather_object(arr),
                "control: raw all_gather list again": raw_list_again,
            },
            1,
            big_samples,
        ),
        "results": (
            {
                "mmengine cpu collect_results 20k": lambda: mm(part, N_RESULTS),
                "hwdist collect_results 20k": lambda: hwdist.collect_results(part, N_RESULTS),
                "control: mmengine cpu again": lambda: mm(part, N_RESULTS),
            },
            1,
            big_samples,
        ),
        **{
            label: _by_size(label, bytes([rank + 1]) * n, world, rank, 4 if quick else 20, samples)
            for label, n in SIZES
        },
    }


#: case -> its baseline
BASE = {
    "hwdist all_gather_object": "torch all_gather_object",
    "control: torch all_gather_object again": "torch all_gather_object",
    "hwdist gather_object": "torch gather_object",
    "hwdist broadcast_object_list": "torch broadcast_object_list",
    "torch all_gather_object 32 MiB": "raw all_gather list 32 MiB",
    "hwdist all_gather_object 32 MiB": "raw all_gather list 32 MiB",
    "control: raw all_gather list again": "raw all_gather list 32 MiB",
    "hwdist collect_results 20k": "mmengine cpu collect_results 20k",
    "control: mmengine cpu again": "mmengine cpu collect_results 20k",
}
#: the size classes above a record's inline payload
SIZES = (
    ("1 KiB", 1 << 10),
    ("2 KiB", 2 << 10),
    ("32 KiB", 32 << 10),
    ("256 KiB", 256 << 10),
    ("512 KiB", 512 << 10),
    ("1 MiB", 1 << 20),
)
for _label, _ in SIZES:
    BASE[f"control: torch all_gather_object {_label} again"] = f"torch all_gather_object {_label}"
    for _op in ("all_gather_object", "gather_object", "broadcast_object_list"):
        BASE[f"hwdist {_op} {_label}"] = f"torch {_op} {_label}"
EXTRA = {"hwdist all_gather_object 32 MiB": "torch all_gather_object 32 MiB"}


def bench_rank(quick: bool, only: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """Runs on every rank; returns the table rows (rank 0's timings); ``only``: these groups."""
    world, rank = tdist.get_world_size(), tdist.get_rank()
    os.chdir(os.environ["HWDIST_BENCH_DIR"])  # mmengine's cpu mode writes under the working directory
    counter = _Counter()
    rows: list[dict[str, Any]] = []
    for group, (cases, iters, samples) in _groups(world, rank, quick).items():
        if only and group not in only:
            continue
        counts = {name: counter.per_call(fn) for name, fn in cases.items() if name.startswith("hwdist")}
        times = measure(cases, iters, samples)
        for name, ts in times.items():
            row: dict[str, Any] = {
                "world": world,
                "group": group,
                "case": name,
                "median_us": statistics.median(ts) * 1e6,
                "min_us": min(ts) * 1e6,
                "collectives": counts.get(name),
            }
            for key, base in (("vs", BASE.get(name)), ("vs2", EXTRA.get(name))):
                if base is not None:
                    bt = times[base]
                    row[key] = (base, statistics.median(x / y for x, y in zip(ts, bt)), min(ts) / min(bt))
            rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| ranks | case | median | min | vs | paired median | mins | collectives/call |",
        "|---:|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        for key in ("vs", "vs2"):
            if key == "vs2" and key not in r:
                continue
            base, med, mins = r.get(key) or ("", None, None)
            ratio = f" {med:.2f}x | {mins:.2f}x |" if med is not None else " | |"
            n = r.get("collectives")
            lines.append(
                f"| {r['world']} | {r['case']} | {fmt_us(r['median_us'])} | {fmt_us(r['min_us'])} |"
                f" {base} |{ratio} {'' if n is None else f'{n:g}'} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark and print the table (and write JSON if asked)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples, 2 ranks")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--world-sizes", default=None, help="default 2,3 (--quick: 2)")
    ap.add_argument("--groups", default=None, help="comma-separated groups (default: all)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in (args.world_sizes or ("2" if args.quick else "2,3")).split(",")]
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hwdist-bench-") as tmp:
        env = dict(ENV, HWDIST_BENCH_DIR=tmp)
        for ws in sizes:
            with RankPool(ws, "gloo", timeout=1800, env=env) as pool:
                only = args.groups.split(",") if args.groups else None
                rows += pool.run(bench_rank, args.quick, only, timeout=1800)[0]
    report(rows, f"gloo, ranks on one host; {time.perf_counter() - start:.0f}s", format_table, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
