"""A differential fuzz of the collectives: random programs on 2 and 3 ranks, gloo and emu.

Each program (tests/dist/fuzz_programs.py) is built from a seed on every rank alike; every rank
recomputes every expected value from the rank numbers and, on gloo where torch supports the call,
compares with raw ``torch.distributed``. The fast lane runs a few short programs; the ``slow`` lane
many long ones. A failure prints a one-line command that replays its seed:
``HWDIST_FUZZ_SEED=<seed> HWDIST_FUZZ_STEPS=<steps> python3 -m pytest -q '<test id>'``.
"""

from __future__ import annotations

import os

import pytest

from .fuzz_programs import run_program

COMBOS = [(2, "gloo"), (3, "gloo"), (2, "emu"), (3, "emu")]
IDS = [f"{ws}-{be}" for ws, be in COMBOS]


def _seeds(default: list[int]) -> list[int]:
    raw = os.environ.get("HWDIST_FUZZ_SEED", "")
    return [int(s) for s in raw.split(",") if s.strip()] or default


def _run(dist, request, combo, seeds: list[int], steps: int) -> None:
    ws, backend = combo
    steps = int(os.environ.get("HWDIST_FUZZ_STEPS", steps))
    for seed in seeds:
        results = dist(run_program, ws, backend, seed, steps)
        bad = [f"rank {r}: {line}" for r, res in enumerate(results) for line in res]
        replay = (f"HWDIST_FUZZ_SEED={seed} HWDIST_FUZZ_STEPS={steps} "
                  f"python3 -m pytest -q '{request.node.nodeid}' -m 'slow or not slow'")
        assert not bad, "\n".join(bad[:20] + [f"replay: {replay}"])


@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_fuzz(dist, request, combo):
    _run(dist, request, combo, _seeds([1, 2, 3]), 80)


@pytest.mark.slow
@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
def test_fuzz_long(dist, request, combo):
    _run(dist, request, combo, _seeds(list(range(100, 112))), 250)
