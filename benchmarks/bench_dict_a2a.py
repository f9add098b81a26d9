"""all_reduce_dict and all_to_all with uneven splits vs raw torch.distributed.

Two gloo ranks (and three for all_to_all). Every case is timed interleaved with
its raw torch equivalent in one process group (``measure``: sample A, B, B, A,
...), with the raw code timed against itself under another name as the noise
floor ("control"). Rank 0's times; ratios are paired medians and the ratio of
the minimums.

- ``all_reduce_dict``: ``bench_tensor.bench_dict``'s rows (``python -m benchmarks.bench_tensor
  --dict`` runs them alone).
- ``all_to_all`` with uneven splits (piece ``j -> r`` of ``base * (1 + (j + r) % 2)``
  float32 elements) that repeat every call, vs the same list all_to_all written by
  hand over torch's flat form (``cat`` + ``all_to_all_single`` + copies: gloo's
  list form takes equal pieces only); and splits that change every call (``base``
  grows by one element per call).
- the same all_to_all rows on a backend without all_to_all (the emulated
  accelerator, ``emu``: hwdist exchanges the split tables, then all_gathers every
  rank's pieces), against the same raw code on a gloo group of the same ranks.

Usage::

    python -m benchmarks.bench_dict_a2a [--quick] [--json PATH] [--a2a] [--no-emu]

``--a2a``: the all_to_all rows only; ``--no-emu``: not the emulated accelerator's rows (their JSON goes
to ``PATH`` with ``.emu.json`` for ``.json``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as tdist

import hwdist
from hwdist.testing import RankPool  # importing it registers 'emu'

from ._common import ENV, KiB, bench_main, measure, report
from .bench_tensor import _row, bench_dict, format_table


def _dict_rows(quick: bool) -> list[dict[str, Any]]:
    """The all_reduce_dict rows: ``bench_tensor``'s own (one definition of the case and its controls)."""
    rows = bench_dict(quick)
    tdist.barrier()
    return rows


def _a2a_cases(nbytes: int, raw_group: Any = None) -> dict[str, Any]:
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
        tdist.all_to_all_single(recv, torch.cat(i), [t.numel() for t in o], [t.numel() for t in i], raw_group)
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


def _a2a_rows(quick: bool, emulated: bool = False) -> list[dict[str, Any]]:
    ws = tdist.get_world_size()
    # on the emulated accelerator (no all_to_all) the raw code runs on a gloo group of the same ranks
    raw_group = tdist.new_group(list(range(ws)), backend="gloo") if emulated else None
    where = ", no all_to_all (emu)" if emulated else ""
    rows: list[dict[str, Any]] = []
    for nbytes in (4 * KiB, 32 * KiB):
        iters, samples = (20, 15) if quick else (20, 41)
        times = measure(_a2a_cases(nbytes, raw_group), iters, samples)
        size = f"{nbytes // KiB} KiB"
        rows.append(_row(f"all_to_all uneven {size}, {ws} ranks{where}, repeated splits", times, "hw", "raw"))
        rows.append(_row(f"all_to_all uneven {size}, {ws} ranks{where}, splits changing every call", times,
                         "hw_changing", "raw_changing"))
        rows.append(_row(f"control: raw all_to_all uneven {size}, {ws} ranks{where}, vs itself", times,
                         "raw_again", "raw"))
    return rows


def bench_two(quick: bool) -> list[dict[str, Any]]:
    """2 ranks: the dict rows, then the all_to_all rows."""
    return _dict_rows(quick) + _a2a_rows(quick)


def bench_three(quick: bool) -> list[dict[str, Any]]:
    """3 ranks: the all_to_all rows."""
    return _a2a_rows(quick)


def bench_emulated(quick: bool) -> list[dict[str, Any]]:
    """The all_to_all rows on the emulated accelerator (no all_to_all)."""
    return _a2a_rows(quick, emulated=True)


def main(argv: list[str]) -> int:
    """Entry point."""
    a2a_only, emu = "--a2a" in argv, "--no-emu" not in argv
    argv = [a for a in argv if a not in ("--a2a", "--no-emu")]
    stages = [(2, bench_two if not a2a_only else _a2a_rows), (3, bench_three)]
    code = bench_main(argv, __doc__ or "", stages, format_table)
    if code or not emu:
        return code
    quick = "--quick" in argv
    json_path = argv[argv.index("--json") + 1] if "--json" in argv else None
    rows: list[dict[str, Any]] = []
    for world_size in (2, 3):
        with RankPool(world_size, "emu", timeout=600, env=ENV) as pool:
            rows += pool.run(bench_emulated, quick, timeout=600)[0]
    report(rows, "emu (the emulated accelerator over gloo), ranks on one host", format_table,
           json_path and json_path.replace(".json", "") + ".emu.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
