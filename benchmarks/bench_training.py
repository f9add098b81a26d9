"""One data-parallel training step: hwdist gradient sync vs torch DDP, measured in the same run.

Two gloo ranks (hwdist.testing.RankPool, ``OMP_NUM_THREADS=1`` per rank as
torchrun sets it). For each model, every variant runs a full step
(``zero_grad``, forward, backward, gradient sync, ``SGD.step``) on its own
copy of the model; samples are interleaved (A, B, C, C, B, A, ...) after a
barrier, and the table shows rank 0's median and min step time and the
median of the per-sample ratios against DDP and against the per-tensor sync
(pairs ran back to back, so load drift on a shared machine cancels).
Nothing here asserts a speed.

Variants:

* ``no sync``: the same step without communication (the floor).
* ``per-tensor``: ``hwdist.sync_grad`` after backward (one async all_reduce per gradient).
* ``synchronizer``: ``hwdist.GradientSynchronizer`` (10 MiB buckets, launched during backward).
* ``synchronizer, no overlap``: the same buckets, all launched after backward.
* ``torch DDP``: ``DistributedDataParallel`` with its defaults (25 MiB buckets).

Usage::

    python -m benchmarks.bench_training [--quick] [--json PATH]
"""

from __future__ import annotations

import statistics
import sys
from typing import Any, Callable

import torch
import torch.distributed as tdist
import torch.nn.functional as F

import hwdist

from ._common import bench_main, measure

MiB = 1024 * 1024


def mlp(width: int, depth: int) -> torch.nn.Module:
    """A plain MLP: few, large gradients."""
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def cnn(channels: int, blocks: int) -> torch.nn.Module:
    """A small CNN with normalisation: many small gradients (where per-tensor sync pays latency)."""
    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, channels, 3, padding=1)]
    for _ in range(blocks):
        layers += [
            torch.nn.Conv2d(channels, channels, 3, padding=1),
            torch.nn.GroupNorm(4, channels),
            torch.nn.ReLU(),
        ]
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(channels, 10)]
    return torch.nn.Sequential(*layers)


def _steps(
    make: Callable[[], torch.nn.Module], x: torch.Tensor, y: torch.Tensor
) -> tuple[dict[str, Callable[[], None]], dict[str, Any]]:
    """One step function per variant, each on its own copy of the model."""
    variants: dict[str, Callable[[], None]] = {}
    info: dict[str, Any] = {}

    def build(kind: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = make()
        if kind == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        return model, torch.optim.SGD(model.parameters(), lr=1e-3)

    def step_fn(
        model: torch.nn.Module, opt: torch.optim.Optimizer, after_backward: Callable[[], None]
    ) -> Callable[[], None]:
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            after_backward()
            opt.step()

        return step

    m, o = build("plain")
    variants["no sync"] = step_fn(m, o, lambda: None)
    m, o = build("plain")
    params = list(m.parameters())
    variants["per-tensor"] = step_fn(m, o, lambda: hwdist.sync_grad(params))
    m, o = build("plain")
    sync = hwdist.GradientSynchronizer(m.parameters())
    variants["synchronizer"] = step_fn(m, o, sync.wait)
    m, o = build("plain")
    lazy = hwdist.GradientSynchronizer(m.parameters(), overlap=False)
    variants["synchronizer, no overlap"] = step_fn(m, o, lazy.wait)
    m, o = build("ddp")
    variants["torch DDP"] = step_fn(m, o, lambda: None)
    info["tensors"] = len(params)
    info["mib"] = sum(p.numel() * p.element_size() for p in params) / MiB
    info["buckets"] = len(sync.buckets)
    info["sync"] = sync
    return variants, info


def bench_rank(quick: bool) -> list[dict[str, Any]]:
    """Runs on every rank; returns the table rows (rank 0's timings)."""
    rank = tdist.get_rank()
    g = torch.Generator().manual_seed(rank)
    cases = [
        (
            "MLP",
            lambda: mlp(512, 6),
            torch.randn(64, 512, generator=g),
            torch.randint(0, 10, (64,), generator=g),
        ),
        (
            "CNN",
            lambda: cnn(16, 16),
            torch.randn(8, 3, 16, 16, generator=g),
            torch.randint(0, 10, (8,), generator=g),
        ),
    ]
    rows: list[dict[str, Any]] = []
    for name, make, x, y in cases:
        variants, info = _steps(make, x, y)
        iters, samples = (2, 5) if quick else (3, 11)
        times = measure(variants, iters, samples)
        ddp, per = times["torch DDP"], times["per-tensor"]
        label = f"{name}: {info['tensors']} tensors, {info['mib']:.1f} MiB of gradients"
        for variant, ts in times.items():
            rows.append(
                {
                    "model": label,
                    "variant": variant,
                    "median_ms": statistics.median(ts) * 1e3,
                    "min_ms": min(ts) * 1e3,
                    "vs_ddp": statistics.median(a / b for a, b in zip(ts, ddp)),
                    "vs_per_tensor": statistics.median(a / b for a, b in zip(ts, per)),
                    "buckets": info["buckets"] if variant.startswith("synchronizer") else None,
                    "overlapped": info["sync"].overlapped if variant == "synchronizer" else None,
                }
            )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| model | variant | step median | step min | vs DDP (paired median) | vs per-tensor |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        extra = ""
        if r["buckets"] is not None:
            extra = f" ({r['buckets']} bucket{'s' if r['buckets'] != 1 else ''}"
            extra += f", {r['overlapped']} launched in backward)" if r["overlapped"] is not None else ")"
        lines.append(
            f"| {r['model']} | {r['variant']}{extra} | {r['median_ms']:.2f} ms | {r['min_ms']:.2f} ms |"
            f" {r['vs_ddp']:.2f}x | {r['vs_per_tensor']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark and print the table (and write JSON if asked)."""
    return bench_main(argv, __doc__.splitlines()[0], [(2, bench_rank)], format_table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
