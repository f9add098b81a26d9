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

import statistics
import sys
from typing import Any, Callable

import torch
import torch.distributed as tdist

import hwdist
from hwdist.collectives import verify

from ._common import KiB, MiB, bench_main, fmt_us, measure


def _measure_modes(cases: dict[str, Callable[[], Any]], iters: int, samples: int) -> dict[str, list[float]]:
    """Per-call seconds of each case; ``on_*`` cases run with verification mode on. Interleaved."""
    return measure(cases, iters, samples, context=lambda name: verify.verification(name.startswith("on")))


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
        times = _measure_modes(
            {
                "off": lambda: hwdist.all_reduce(t),
                "on": lambda: hwdist.all_reduce(t),
                "raw": lambda: tdist.all_reduce(t),
            },
            iters,
            samples,
        )
        rows.append(_row(f"all_reduce {label}", times))
    t = torch.ones(KiB)
    times = _measure_modes(
        {"off": lambda: hwdist.all_gather(t), "on": lambda: hwdist.all_gather(t)}, 100, samples
    )
    rows.append(_row("all_gather 4 KiB (shape exchange)", times))
    metrics = {f"metric_{i:02d}": torch.tensor(float(i)) for i in range(20)}
    times = _measure_modes(
        {"off": lambda: hwdist.all_reduce_dict(metrics), "on": lambda: hwdist.all_reduce_dict(metrics)},
        100,
        samples,
    )
    rows.append(_row("all_reduce_dict 20 metrics (off: its layout check rides in the data)", times))
    obj = {"rank": tdist.get_rank(), "loss": 0.5}
    times = _measure_modes(
        {"off": lambda: hwdist.all_gather_object(obj), "on": lambda: hwdist.all_gather_object(obj)},
        100,
        samples,
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
            f"| {r['case']} | {fmt_us(r['off_median_us'])} | {fmt_us(r['on_median_us'])} |"
            f" {r['on_over_off']:.2f}x |"
            f" {fmt_us(r['added_us'])} | {raw} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark and print the table (and write JSON if asked)."""
    return bench_main(argv, (__doc__ or "").splitlines()[0], [(2, bench_rank)], format_table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
