"""The cost of the flight recorder (on by default; HWDIST_FLIGHT_RECORDER=0: off), measured in one run.

Gloo ranks (hwdist.testing.RankPool). Each case times the same call with the
recorder off and on, *interleaved* (A, B, B, A, ...) after a barrier, plus the
control row "off vs off" (the same code under two names: the noise floor of a
paired ratio in this run). Rows:

* ``@collective`` entry with an empty body: the recorder's own CPU cost per
  call (begin + end + the observer path), free of network noise;
* all_reduce of 1 element on a 1-rank group and on 2 ranks: what a user sees.

Nothing here asserts a speed. Usage::

    python -m benchmarks.bench_flight [--quick] [--json PATH]
    python -m benchmarks.bench_flight --ddp [--rounds 7] [--steps 30]   # torch's hooks on a DDP step

``--ddp`` runs ``bench_flight_ddp``: the recorder attached through torch's hooks (torch >= 2.14) against
raw torch, on a DDP step.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as tdist

import hwdist
from hwdist import flight
from hwdist.collectives.call_entry import collective

from ._common import bench_main, fmt_us, measure


@collective(0)
def _empty(group: Any = None) -> None:
    """A public-collective entry with nothing inside: what the recorder adds, alone."""


def _modes(cases: dict[str, Callable[[], Any]], iters: int, samples: int) -> dict[str, list[float]]:
    return measure(cases, iters, samples, context=lambda name: _Recording(name == "on"))


class _Recording:
    def __init__(self, on: bool) -> None:
        self.on, self.old = on, True

    def __enter__(self) -> None:
        self.old = flight.enable(self.on)

    def __exit__(self, *exc: Any) -> None:
        flight.enable(self.old)


def _row(label: str, times: dict[str, list[float]]) -> dict[str, Any]:
    on, off, ctl = times["on"], times["off"], times["off_again"]
    return {
        "case": label,
        "off_median_us": statistics.median(off) * 1e6,
        "on_median_us": statistics.median(on) * 1e6,
        "added_us": statistics.median(a - b for a, b in zip(on, off)) * 1e6,
        "on_over_off": statistics.median(a / b for a, b in zip(on, off)),
        "control_over_off": statistics.median(a / b for a, b in zip(ctl, off)),
        "control_added_us": statistics.median(a - b for a, b in zip(ctl, off)) * 1e6,
    }


def _cpu_rows(quick: bool) -> list[dict[str, Any]]:
    samples, iters = (7, 2000) if quick else (21, 20000)
    times = _modes({"off": _empty, "on": _empty, "off_again": _empty}, iters, samples)
    return [_row("@collective entry, empty body (the recorder's own cost)", times)]


def bench_rank(quick: bool) -> list[dict[str, Any]]:
    """Runs on every rank; returns rank 0's rows."""
    rows = _cpu_rows(quick) if tdist.get_world_size() == 1 else []
    samples = 7 if quick else 21
    t = torch.ones(1)
    times = _modes(
        {"off": lambda: hwdist.all_reduce(t), "on": lambda: hwdist.all_reduce(t),
         "off_again": lambda: hwdist.all_reduce(t)},
        200 if quick else 2000,
        samples,
    )
    rows.append(_row(f"all_reduce 1 element, {tdist.get_world_size()} rank(s)", times))
    time.sleep(0)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| case | off (median) | on (median) | added per call (paired median) | on / off |"
        " control: off vs off, added | control ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {fmt_us(r['off_median_us'])} | {fmt_us(r['on_median_us'])} |"
            f" {fmt_us(r['added_us'])} |"
            f" {r['on_over_off']:.3f}x | {fmt_us(r['control_added_us'])} | {r['control_over_off']:.3f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--ddp" in argv:
        from . import bench_flight_ddp

        return bench_flight_ddp.main([a for a in argv if a != "--ddp"])
    """Run the benchmark and print the table (and write JSON if asked)."""
    return bench_main(argv, (__doc__ or "").splitlines()[0], [(1, bench_rank), (2, bench_rank)], format_table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
