"""The cost of verification mode (hwdist.verification / HWDIST_DEBUG=1), measured in one run.

Two gloo ranks (hwdist.testing.RankPool). Each case times the same hwdist call
with verification mode off and on, *interleaved* (sample A, sample B, B, A,
...) after a barrier, plus raw torch.distributed for reference, and reports
rank 0's median per call and the paired-median ratios on/off and off/raw.
Nothing here asserts a speed.

Usage::

    python -m benchmarks.bench_verify [--quick] [--json PATH]

Cases: all_reduce 1 element / 4 KiB / 1 MiB, all_gather 4 KiB (uneven-shape
path), all_reduce_dict of 20 metrics, all_gather_object of a small dict.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as tdist

import hwdist
from hwdist import verify
from hwdist.testing import RankPool

KiB = 1024
MiB = 1024 * 1024
_ENV = {"OMP_NUM_THREADS": "1"}


def _measure(cases: dict[str, Callable[[], Any]], iters: int, samples: int) -> dict[str, list[float]]:
    """Per-call seconds of each case; ``on_*`` cases run with verification mode on. Interleaved."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)

    def once(name: str, n: int) -> None:
        fn = cases[name]
        with verify.verification(name.startswith("on")):
            tdist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = time.perf_counter() - t0
        times[name].append(dt / n)

    for name in names:  # warm up
        once(name, 2)
        times[name].clear()
    for s in range(samples):
        for name in names if s % 2 == 0 else reversed(names):
            once(name, iters)
    return times


def _row(label: str, times: dict[str, list[float]]) -> dict[str, Any]:
    on, off, raw = times["on"], times["off"], times.get("raw")
    row: dict[str, Any] = {
        "case": label,
        "off_median_us": statistics.median(off) * 1e6,
        "on_median_us": statistics.median(on) * 1e6,
        "on_over_off": statistics.median(a / b for a, b in zip(on, off)),
        "added_us": (statistics.median(on) - statistics.median(off)) * 1e6,
    }
    if raw is not None:
        row["raw_median_us"] = statistics.median(raw) * 1e6
        row["off_over_raw"] = statistics.median(a / b for a, b in zip(off, raw))
    return row


def bench_rank(quick: bool) -> list[dict[str, Any]]:
    """Runs on every rank; returns the rows (rank 0's timings)."""
    rows = []
    samples = 5 if quick else 15
    for label, numel in (("1 element", 1), ("4 KiB", KiB), ("1 MiB", MiB // 4)):
        t = torch.ones(numel)
        iters = 10 if numel >= MiB // 4 else (100 if quick else 300)
        times = _measure(
            {"off": lambda: hwdist.all_reduce(t), "on": lambda: hwdist.all_reduce(t), "raw": lambda: tdist.all_reduce(t)},
            iters,
            samples,
        )
        rows.append(_row(f"all_reduce {label}", times))
    t = torch.ones(KiB)
    times = _measure({"off": lambda: hwdist.all_gather(t), "on": lambda: hwdist.all_gather(t)}, 100, samples)
    rows.append(_row("all_gather 4 KiB (shape exchange)", times))
    metrics = {f"metric_{i:02d}": torch.tensor(float(i)) for i in range(20)}
    times = _measure(
        {"off": lambda: hwdist.all_reduce_dict(metrics), "on": lambda: hwdist.all_reduce_dict(metrics)}, 100, samples
    )
    rows.append(_row("all_reduce_dict 20 metrics (off: verify=True's own check)", times))
    obj = {"rank": tdist.get_rank(), "loss": 0.5}
    times = _measure(
        {"off": lambda: hwdist.all_gather_object(obj), "on": lambda: hwdist.all_gather_object(obj)}, 100, samples
    )
    rows.append(_row("all_gather_object small dict", times))
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| case | off (median) | on (median) | on / off | added per call | off / raw torch |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        raw = f"{r['off_over_raw']:.2f}x" if "off_over_raw" in r else "-"
        lines.append(
            f"| {r['case']} | {_fmt(r['off_median_us'])} | {_fmt(r['on_median_us'])} | {r['on_over_off']:.2f}x |"
            f" {_fmt(r['added_us'])} | {raw} |"
        )
    return "\n".join(lines)


def _fmt(us: float) -> str:
    return f"{us / 1000:.2f} ms" if abs(us) >= 1000 else f"{us:.1f} us"


def main(argv: list[str]) -> int:
    """Run the benchmark and print the table (and write JSON if asked)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    with RankPool(2, "gloo", timeout=600, env=_ENV) as pool:
        rows = pool.run(bench_rank, args.quick, timeout=600)[0]
    print(f"torch {torch.__version__}, gloo, 2 ranks on one host; {time.perf_counter() - start:.0f}s\n")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
