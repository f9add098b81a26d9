"""hwdist vs raw torch.distributed on one CUDA GPU over NCCL (one rank), measured in the same run.

NCCL runs one rank per GPU, so on a machine with one GPU this bench
measures what one rank can show: hwdist's own cost around each NCCL call on
real hardware (a fast host CPU, a real CUDA stream). Every call is followed by
``torch.cuda.synchronize()`` in both columns, so a row is the latency of one
completed collective; the last row enqueues 2000 calls per sample with one
synchronize (the host's own cost around each launch). Cases are timed
interleaved with raw torch, with a raw-vs-raw control row per size (the noise
floor). Nothing here asserts a speed. The tensor gathers and
``all_reduce_dict`` are not here: at one rank hwdist communicates nothing for
them (the result is the input), so a ratio against torch's real call would
compare nothing.

The object rows are there for what a user pays on an NCCL group: torch's
object collectives move every payload through a CUDA tensor (to the GPU and
back, two all_gathers), hwdist's at one rank hand back the caller's object and
send nothing (as mmengine's do).
``collect_results(device="gpu")`` is timed against the same thing written with
torch (``all_gather_object``, then the parts interleaved, as mmengine's GPU mode
does). These rows say what one rank costs, not how the paths compare across
GPUs.

Usage (on a machine with a CUDA GPU)::

    python -m benchmarks.bench_gpu [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any, Callable, Iterator

import torch
import torch.distributed as tdist

import hwdist
from hwdist.testing import RankPool

from ._common import KiB, MiB, measure, report
from .bench_tensor import _row, _size, format_table


def _synced(fn: Callable[[], Any]) -> Callable[[], None]:
    def call() -> None:
        fn()
        torch.cuda.synchronize()

    return call


@contextlib.contextmanager
def _synced_after() -> Iterator[None]:
    torch.cuda.synchronize()
    yield
    torch.cuda.synchronize()


def bench_rank(quick: bool) -> list[dict[str, Any]]:
    """Runs on the one rank; returns the table rows."""
    dev = hwdist.get_comm_device()
    rows: list[dict[str, Any]] = []
    samples = 7 if quick else 21
    for nbytes in (4 * KiB, MiB) + (() if quick else (64 * MiB,)):
        t = torch.ones(nbytes // 4, device=dev)
        iters = 200 if nbytes <= MiB else 20
        pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "all_reduce": (lambda: hwdist.all_reduce(t), lambda: tdist.all_reduce(t)),
            "broadcast": (lambda: hwdist.broadcast(t, 0), lambda: tdist.broadcast(t, 0)),
        }
        for name, (hw, raw) in pairs.items():
            cases = {"hw": _synced(hw), "raw": _synced(raw), "raw_again": _synced(raw)}
            times = measure(cases, iters, samples)
            rows.append(_row(f"{name} {_size(nbytes)}", times, "hw", "raw"))
            rows.append(_row(f"control: raw {name} {_size(nbytes)} vs itself", times, "raw_again", "raw"))
    # the host cost alone: each call enqueued, one synchronize per sample (the CPU time around the launch)
    one = torch.ones(1, device=dev)
    times = measure(
        {"hw": lambda: hwdist.all_reduce(one), "raw": lambda: tdist.all_reduce(one)},
        2000,
        samples,
        context=lambda name: _synced_after(),
    )
    row = _row("all_reduce 1 element, enqueue only", times, "hw", "raw")
    row["overhead_us"] = row["hwdist_median_us"] - row["raw_median_us"]
    rows.append(row)
    return rows + _object_rows(samples)


def _torch_collect(results: list[Any], size: int) -> list[Any]:
    """collect_results' GPU mode written with torch: every rank's part gathered, interleaved on rank 0."""
    parts: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(parts, results)
    ordered = [x for group in zip(*parts) for x in group]
    return ordered[:size]


def _object_rows(samples: int) -> list[dict[str, Any]]:
    """Object collectives and collect_results against torch's, on the NCCL group (one rank)."""
    rows: list[dict[str, Any]] = []
    payloads = {"small dict": {"loss": 0.5, "step": 10, "tag": "eval"}, "1 MiB bytes": b"x" * MiB}
    for label, obj in payloads.items():
        box: list[Any] = [None]

        def torch_all_gather() -> None:
            tdist.all_gather_object(box, obj)

        def torch_bcast() -> None:
            lst = [obj]
            tdist.broadcast_object_list(lst, 0)

        pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "all_gather_object": (lambda: hwdist.all_gather_object(obj), torch_all_gather),
            "broadcast_object_list": (lambda: hwdist.broadcast_object_list([obj], 0), torch_bcast),
        }
        for name, (hw, raw) in pairs.items():
            times = measure({"hw": hw, "raw": raw, "raw_again": raw}, 50, samples)
            rows.append(_row(f"{name} {label}", times, "hw", "raw"))
            rows.append(_row(f"control: raw {name} {label} vs itself", times, "raw_again", "raw"))
    results = [{"id": i, "score": float(i)} for i in range(2000)]

    def hw_collect() -> None:
        hwdist.collect_results(results, len(results), device="gpu")

    def raw_collect() -> None:
        _torch_collect(results, len(results))

    times = measure({"hw": hw_collect, "raw": raw_collect, "raw_again": raw_collect}, 10, samples)
    rows.append(_row("collect_results gpu, 2000 results", times, "hw", "raw"))
    rows.append(_row("control: raw collect 2000 results vs itself", times, "raw_again", "raw"))
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer samples")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured", file=sys.stderr)
        return 2
    start = time.perf_counter()
    with RankPool(1, "nccl", timeout=600) as pool:
        rows = pool.run(bench_rank, args.quick, timeout=600)[0]
    name = torch.cuda.get_device_name(0)
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    setting = f"nccl {nccl}, 1 rank on {name}; {time.perf_counter() - start:.0f}s"
    report(rows, setting, format_table, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
