"""all_reduce_dict and all_to_all with uneven splits vs raw torch.distributed (issue 17, phase 2).

Two gloo ranks (and three for all_to_all). Every case is timed interleaved with
its raw torch equivalent in one process group (``measure``: sample A, B, B, A,
...), with the raw code timed against itself under another name as the noise
floor ("control"). Rank 0's times; ratios are paired medians and the ratio of
the minimums.

- ``all_reduce_dict`` of 20 scalar metrics vs the hand-flattened ``stack`` +
  ``all_reduce`` + ``unbind`` of ``bench_tensor.py``; then the CPU time per call
  of both with the collective replaced by a local stand-in (one process, no
  communication: the deterministic part).
- ``all_to_all`` with uneven splits (piece ``j -> r`` of ``base * (1 + (j + r) % 2)``
  float32 elements) that repeat every call, vs the same list all_to_all written by
  hand over torch's flat form (``cat`` + ``all_to_all_single`` + copies: gloo's
  list form takes equal pieces only); and splits that change every call (``base``
  grows by one element per call).

Usage::

    python -m benchmarks.bench_dict_a2a [--quick] [--json PATH]
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as tdist

import hwdist

from ._common import KiB, bench_main, measure
from .bench_tensor import _row, format_table, measure_local


def _dict_rows(quick: bool) -> list[dict[str, Any]]:
    rank = tdist.get_rank()
    ws = tdist.get_world_size()
    metrics = {f"metric_{i:02d}": torch.tensor(float(i + rank)) for i in range(20)}

    def raw_dict() -> None:
        keys = sorted(metrics)
        flat = torch.stack([metrics[k] for k in keys])
        tdist.all_reduce(flat)
        for k, v in zip(keys, flat.unbind(0)):
            metrics[k] = v

    def raw_again() -> None:
        raw_dict()

    iters, samples = (10, 51) if quick else (10, 201)
    times = measure(
        {
            "hw": lambda: hwdist.all_reduce_dict(metrics),
            "hw_noverify": lambda: hwdist.all_reduce_dict(metrics, verify=False),
            "raw": raw_dict,
            "raw_again": raw_again,
        },
        iters,
        samples,
    )
    rows = [
        _row("all_reduce_dict 20 metrics (verify=True)", times, "hw", "raw"),
        _row("all_reduce_dict 20 metrics (verify=False)", times, "hw_noverify", "raw"),
        _row("control: hand-flattened vs itself", times, "raw_again", "raw"),
    ]
    # CPU time without the collective: all_reduce -> mul_(ws), the flat all_gather -> copies
    from hwdist import _compat

    real = tdist.all_reduce, _compat.all_gather_into_tensor

    def gather_same(out: torch.Tensor, inp: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        out.view(ws, -1).copy_(inp.reshape(1, -1))

    tdist.all_reduce = lambda t, *args, **kwargs: t.mul_(ws)  # type: ignore[assignment]
    _compat.all_gather_into_tensor = gather_same
    try:
        local = measure_local(
            {
                "hw": lambda: hwdist.all_reduce_dict(metrics),
                "hw_noverify": lambda: hwdist.all_reduce_dict(metrics, verify=False),
                "raw": raw_dict,
            },
            2000 if quick else 5000,
            7,
        )
    finally:
        tdist.all_reduce, _compat.all_gather_into_tensor = real
    for name, label in (("hw", "verify=True"), ("hw_noverify", "verify=False")):
        row = _row(f"all_reduce_dict 20 metrics ({label}), CPU time without the collective", local, name,
                   "raw")
        row["overhead_us"] = row["hwdist_median_us"] - row["raw_median_us"]
        rows.append(row)
    tdist.barrier()
    return rows


def _a2a_cases(nbytes: int) -> dict[str, Any]:
    rank = tdist.get_rank()
    ws = tdist.get_world_size()
    base = nbytes // 4

    def pieces(b: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ins = [torch.full((b * (1 + (rank + r) % 2),), float(rank)) for r in range(ws)]
        outs = [torch.empty(b * (1 + (j + rank) % 2)) for j in range(ws)]
        return ins, outs

    def raw_a2a(o: list[torch.Tensor], i: list[torch.Tensor]) -> None:
        # gloo's list form needs equal pieces: the hand-written list all_to_all over the flat form
        recv = torch.empty(sum(t.numel() for t in o))
        tdist.all_to_all_single(recv, torch.cat(i), [t.numel() for t in o], [t.numel() for t in i])
        for t, piece in zip(o, recv.split([t.numel() for t in o])):
            t.copy_(piece)

    ins, outs = pieces(base)
    state = {"b": base}

    def changing() -> None:  # a new split table every call (every piece one element longer)
        state["b"] += 1
        i2, o2 = pieces(state["b"])
        hwdist.all_to_all(o2, i2)

    def raw_changing() -> None:
        state["b"] += 1
        i2, o2 = pieces(state["b"])
        raw_a2a(o2, i2)

    return {
        "hw": lambda: hwdist.all_to_all(outs, ins),
        "raw": lambda: raw_a2a(outs, ins),
        "raw_again": lambda: raw_a2a(outs, ins),
        "hw_changing": changing,
        "raw_changing": raw_changing,
    }


def _a2a_rows(quick: bool) -> list[dict[str, Any]]:
    ws = tdist.get_world_size()
    rows: list[dict[str, Any]] = []
    for nbytes in (4 * KiB, 32 * KiB):
        iters, samples = (20, 15) if quick else (20, 41)
        times = measure(_a2a_cases(nbytes), iters, samples)
        size = f"{nbytes // KiB} KiB"
        rows.append(_row(f"all_to_all uneven {size}, {ws} ranks, repeated splits", times, "hw", "raw"))
        rows.append(_row(f"all_to_all uneven {size}, {ws} ranks, splits changing every call", times,
                         "hw_changing", "raw_changing"))
        rows.append(_row(f"control: raw all_to_all uneven {size}, {ws} ranks, vs itself", times, "raw_again",
                         "raw"))
    return rows


def bench_two(quick: bool) -> list[dict[str, Any]]:
    """2 ranks: the dict rows, then the all_to_all rows."""
    return _dict_rows(quick) + _a2a_rows(quick)


def bench_three(quick: bool) -> list[dict[str, Any]]:
    """3 ranks: the all_to_all rows."""
    return _a2a_rows(quick)


def main(argv: list[str]) -> int:
    """Entry point."""
    return bench_main(argv, __doc__ or "", [(2, bench_two), (3, bench_three)], format_table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
