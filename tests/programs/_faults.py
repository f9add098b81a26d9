"""What the fault tests of the object collectives and ``collect_results`` share.

A rank that already knows a collective failed must make every rank raise within seconds: each
rank times its call (``timed``) and writes the outcome to a file (``write_outcome``), which the
test reads back (``read_outcomes``) even when a killed peer made the harness raise.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import pytest
import torch

import hwdist

#: A rank must raise within this many seconds (the pooled harness's group timeout is 30 s).
FAST = 10.0
#: The process-group timeout of the dead-peer tests: the survivors must raise long before this.
PG_TIMEOUT = 60
_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
# On torch 2.1 a survivor waiting on the rank that failed is not woken by its failure notice in time
# (measured on 2.1.2; passes on 2.4.1, 2.8.0, 2.13.0 and 2.15.0). Lift when torch >= 2.4 is the floor.
notices_need_torch_2_4 = pytest.mark.skipif(
    _TORCH < (2, 4),
    reason="failure notices do not wake a waiting survivor on torch < 2.4 (measured on 2.1.2)",
)


def timed(fn: Callable[[], Any]) -> list:
    """``[exception type name, message, seconds]`` of ``fn()`` (``"no error"`` when it returned)."""
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)[:400], time.monotonic() - start]
    return ["no error", "", time.monotonic() - start]


def write_outcome(outdir: str, outcome: Any) -> None:
    """Write this rank's outcome to ``outdir/outcome<rank>.json``."""
    with open(os.path.join(outdir, f"outcome{hwdist.get_rank()}.json"), "w") as fh:
        json.dump(outcome, fh)


def read_outcomes(outdir: Any, ranks: tuple[int, ...]) -> dict[int, list]:
    """The outcomes that ``ranks`` wrote, by rank (a rank that wrote none is left out)."""
    found = {}
    for r in ranks:
        path = os.path.join(outdir, f"outcome{r}.json")
        if os.path.exists(path):
            with open(path) as fh:
                found[r] = json.load(fh)
    return found
