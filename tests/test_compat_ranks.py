"""Version-specific behaviour on real ranks (the whole matrix runs through ci/versions.sh)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import hwdist
from hwdist.testing import run_distributed

pytestmark = pytest.mark.dist

ROUNDS = 15


def _reinit_rounds(store_dir: str, rounds: int) -> list:
    """Initialise, run collectives on temporaries (numpy- and bytearray-backed too), destroy; many times."""
    from hwdist.launch.core import init_backend

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    sums = []
    for i in range(rounds):
        init_backend("gloo", rank=rank, world_size=ws, init_method=f"file://{store_dir}/store{i}", timeout=60)
        for _ in range(10):
            hwdist.broadcast(torch.from_numpy(np.full(64, rank, dtype=np.uint8)), 0)
            hwdist.all_gather(torch.frombuffer(bytearray(16), dtype=torch.uint8), same_shape=True)
            t = torch.from_numpy(np.ones(8) * (rank + 1))
            hwdist.all_reduce(t)
        hwdist.all_gather_object({"r": rank, "i": i})
        sums.append(t[0].item())
        hwdist.destroy()
    return sums


def test_destroy_then_reinit_many_times_does_not_hang(tmp_path):
    # torch < 2.8 hung here now and then (gloo's destructor and the GIL); hwdist.destroy pauses first there.
    ws = 2
    res = run_distributed(_reinit_rounds, ws, None, str(tmp_path), ROUNDS, timeout=240)
    assert res == [[float(ws * (ws + 1) // 2)] * ROUNDS] * ws
