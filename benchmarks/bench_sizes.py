"""Why a large tensor all_gather is slower than hwdist's object path on gloo.

Every case moves the same bytes per rank and is timed interleaved with the
others in one process group (``_common.measure``: a barrier, then ``iters``
calls; the order alternates each sample); the table gives rank 0's median and
min per call and the median of the per-sample ratios against the baseline,
a raw ``torch.distributed.all_gather`` into a list of float32 tensors (what
``mmengine.dist.all_gather`` and most user code do). Nothing here asserts a speed.

Cases:

- ``list f32`` / ``list u8``: raw ``all_gather`` into a list, float32 or the uint8 view of the same bytes;
- ``flat f32`` / ``flat u8``: raw ``all_gather_into_tensor`` into one flat buffer, then ``chunk`` views;
- ``chunks of flat``: raw ``all_gather`` into a list of ``chunk`` views of one flat buffer (objects.py's route
  for medium payloads);
- ``broadcasts``: one ``broadcast`` per rank into the slots of one flat buffer (objects.py's route for
  large payloads: what ``all_gather_object`` of a 32 MiB array does);
- ``staged header+payload, flat u8``: a 128-byte header and the payload copied into one buffer, one flat
  uint8 ``all_gather_into_tensor``, views (the one collective of ``hwdist.collectives._sizes``'s route);
- ``hwdist all_gather`` (default: shapes exchanged first) and ``same_shape=True``, as they stand;
- ``hwdist all_gather_object`` of the same bytes as a numpy array (large sizes only);
- ``control``: the baseline against itself under another name (the noise floor of a ratio here).

``--gathers`` times only the tensor gathers against the same baseline:

- ``hwdist all_gather equal`` (default, every rank the same shape) and ``same_shape=True``;
- ``hwdist all_gather uneven``: rank ``r`` holds ``size * (1 + r / (world - 1)) / 2`` bytes, so the
  largest rank holds ``size`` and the smallest half of it; the baseline (a raw all_gather of ``size``
  per rank) is then the raw all_gather of the padded size;
- ``hwdist gather uneven`` (to rank 0) and ``pad_to_largest_tensor``;
- ``broadcasts`` (raw, one per rank) and the control row.

Usage::

    python -m benchmarks.bench_sizes [--quick] [--json PATH] [--world-sizes 2,3] [--sizes 4K,1M,32M,64M]
    python -m benchmarks.bench_sizes --gathers [--sizes 4K,1M,64M] [--samples N]

The quick mode (what ``python -m benchmarks.run --quick`` runs) takes 2 ranks and 4 KiB, 1 MiB, 32 MiB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as tdist

import hwdist
from hwdist.testing import RankPool

from ._common import ENV, KiB, MiB, fmt_us, measure, raw_all_gather_list, report

BASE = "list f32"


def _iters_for(nbytes: int, quick: bool) -> tuple[int, int]:
    if nbytes >= 16 * MiB:
        return 1, (3 if quick else 9)
    if nbytes >= MiB:
        return (3 if quick else 8), (5 if quick else 15)
    return (50 if quick else 100), (5 if quick else 21)


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def _cases(nbytes: int, ws: int, rank: int) -> dict[str, Callable[[], Any]]:
    t = torch.full((nbytes // 4,), float(rank))
    u8 = t.view(torch.uint8)
    flat = torch.empty(ws * t.numel())
    flat_u8 = torch.empty(ws * u8.numel(), dtype=torch.uint8)
    arr = t.numpy()

    def raw_list() -> Any:
        return raw_all_gather_list(t, ws)

    def raw_list_again() -> Any:  # the same code under another name: the noise floor
        return raw_all_gather_list(t, ws)

    def list_u8() -> Any:
        out = [torch.empty_like(u8) for _ in range(ws)]
        tdist.all_gather(out, u8)
        return [o.view(torch.float32) for o in out]

    def flat_f32() -> Any:
        tdist.all_gather_into_tensor(flat, t)
        return list(flat.chunk(ws))

    def flat_bytes() -> Any:
        tdist.all_gather_into_tensor(flat_u8, u8)
        return [c.view(torch.float32) for c in flat_u8.chunk(ws)]

    def chunks_of_flat() -> Any:
        tdist.all_gather(list(flat_u8.chunk(ws)), u8)
        return [c.view(torch.float32) for c in flat_u8.chunk(ws)]

    head = 128  # what hwdist.collectives._sizes puts in front of each rank's payload
    staged = torch.empty(head + u8.numel(), dtype=torch.uint8)
    staged_out = torch.empty(ws * staged.numel(), dtype=torch.uint8)

    def staged_flat() -> Any:  # the size-prediction route: header + payload copied into one buffer
        staged[head:].copy_(u8)
        tdist.all_gather_into_tensor(staged_out, staged)
        return [row[head:].view(torch.float32) for row in staged_out.view(ws, -1)]

    def broadcasts() -> Any:
        slots = list(flat_u8.chunk(ws))
        slots[rank].copy_(u8)
        for r in range(ws):
            tdist.broadcast(slots[r], r)
        return [c.view(torch.float32) for c in slots]

    cases: dict[str, Callable[[], Any]] = {
        BASE: raw_list,
        "list u8": list_u8,
        "flat f32": flat_f32,
        "flat u8": flat_bytes,
        "chunks of flat": chunks_of_flat,
        "broadcasts": broadcasts,
        "staged header+payload, flat u8": staged_flat,
        "hwdist all_gather": lambda: hwdist.all_gather(t),
        "hwdist all_gather same_shape": lambda: hwdist.all_gather(t, same_shape=True),
        "control: list f32 again": raw_list_again,
    }
    if nbytes >= 32 * MiB:
        cases["hwdist all_gather_object"] = lambda: hwdist.all_gather_object(arr)
    return cases


def _gather_cases(nbytes: int, ws: int, rank: int) -> dict[str, Callable[[], Any]]:
    t = torch.full((nbytes // 4,), float(rank))
    n_small = (nbytes // 4) // 2
    uneven = torch.full((n_small + (nbytes // 4 - n_small) * rank // max(ws - 1, 1),), float(rank))
    flat_u8 = torch.empty(ws * nbytes, dtype=torch.uint8)
    u8 = t.view(torch.uint8)

    def raw_list() -> Any:
        return raw_all_gather_list(t, ws)

    def raw_list_again() -> Any:  # the same code under another name: the noise floor
        return raw_all_gather_list(t, ws)

    def broadcasts() -> Any:
        slots = list(flat_u8.chunk(ws))
        slots[rank].copy_(u8)
        for r in range(ws):
            tdist.broadcast(slots[r], r)
        return [c.view(torch.float32) for c in slots]

    return {
        BASE: raw_list,
        "hwdist all_gather equal (default)": lambda: hwdist.all_gather(t),
        "hwdist all_gather same_shape": lambda: hwdist.all_gather(t, same_shape=True),
        "hwdist all_gather uneven (vs raw padded)": lambda: hwdist.all_gather(uneven),
        "hwdist gather uneven (to rank 0)": lambda: hwdist.gather(uneven, 0),
        "hwdist pad_to_largest_tensor": lambda: hwdist.pad_to_largest_tensor(uneven),
        "broadcasts (raw)": broadcasts,
        "control: list f32 again": raw_list_again,
    }


def bench_gathers(sizes: list[int], samples: int) -> list[dict[str, Any]]:
    """Runs on every rank: hwdist's tensor gathers against raw torch; returns rank 0's rows."""
    ws, rank = tdist.get_world_size(), tdist.get_rank()
    rows: list[dict[str, Any]] = []
    for nbytes in sizes:
        cases = _gather_cases(nbytes, ws, rank)
        got = cases["hwdist all_gather equal (default)"]()
        assert all(bool((g == r).all()) and g.numel() == nbytes // 4 for r, g in enumerate(got))
        iters, _ = _iters_for(nbytes * ws, False)
        times = measure(cases, iters, samples)
        base = times[BASE]
        for name, ts in times.items():
            rows.append({
                "world": ws, "size": _size(nbytes), "case": name,
                "median_us": statistics.median(ts) * 1e6, "min_us": min(ts) * 1e6,
                "ratio": statistics.median(x / y for x, y in zip(ts, base)),
                "ratio_min": min(ts) / min(base),
            })
    return rows


def _check(cases: dict[str, Callable[[], Any]], nbytes: int, ws: int) -> None:
    """Every case must deliver what each rank gave (rank r's tensor is full of r)."""
    for name, fn in cases.items():
        got = fn()
        for r, piece in enumerate(got):
            a = np.asarray(piece if isinstance(piece, np.ndarray) else piece.numpy())
            if a.size != nbytes // 4 or not (a == r).all():
                raise AssertionError(f"{name}: slot {r} is wrong")


def bench_rank(quick: bool, sizes: list[int]) -> list[dict[str, Any]]:
    """Runs on every rank; returns the table rows (rank 0's timings)."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames all_gather_into_tensor
    ws, rank = tdist.get_world_size(), tdist.get_rank()
    rows: list[dict[str, Any]] = []
    for nbytes in sizes:
        cases = _cases(nbytes, ws, rank)
        _check(cases, nbytes, ws)
        iters, samples = _iters_for(nbytes * ws, quick)
        times = measure(cases, iters, samples)
        base = times[BASE]
        for name, ts in times.items():
            rows.append({
                "world": ws,
                "size": _size(nbytes),
                "case": name,
                "median_us": statistics.median(ts) * 1e6,
                "min_us": min(ts) * 1e6,
                "ratio": statistics.median(x / y for x, y in zip(ts, base)),
                "ratio_min": min(ts) / min(base),
            })
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (ratios against a raw all_gather into a list of float32)."""
    lines = [
        "| ranks | size per rank | case | median | min | vs list f32 (paired median) | vs list f32 (mins) |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['world']} | {r['size']} | {r['case']} | {fmt_us(r['median_us'])} | {fmt_us(r['min_us'])} |"
            f" {r['ratio']:.2f}x | {r['ratio_min']:.2f}x |"
        )
    return "\n".join(lines)


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    unit = {"K": KiB, "M": MiB}.get(text[-1], 1)
    return int(text[:-1] if unit != 1 else text) * unit


def main(argv: list[str]) -> int:
    """Run the benchmark and print the table (and write JSON if asked)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--world-sizes", default=None, help="default 2,3 (--quick: 2)")
    ap.add_argument("--sizes", default=None, help="per rank (default 4K,1M,32M,64M; --quick: 4K,1M,32M)")
    ap.add_argument("--gathers", action="store_true", help="hwdist's tensor gathers only, against raw torch")
    ap.add_argument("--samples", type=int, default=11, help="samples per case with --gathers")
    args = ap.parse_args(argv)
    args.world_sizes = args.world_sizes or ("2" if args.quick else "2,3")
    default_sizes = "4K,1M,64M" if args.gathers else "4K,1M,32M,64M"
    args.sizes = args.sizes or ("4K,1M,32M" if args.quick else default_sizes)
    sizes = [_parse_size(s) for s in args.sizes.split(",")]
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for ws in (int(x) for x in args.world_sizes.split(",")):
        with RankPool(ws, "gloo", timeout=1800, env=ENV) as pool:
            if args.gathers:
                rows += pool.run(bench_gathers, sizes, args.samples, timeout=1800)[0]
            else:
                rows += pool.run(bench_rank, args.quick, sizes, timeout=1800)[0]
    report(rows, f"gloo, ranks on one host; {time.perf_counter() - start:.0f}s", format_table, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
