"""Torch versions (``hwdist._compat``): on a torch hwdist does not support, importing works and the first call
needing torch.distributed says why; on real ranks, version-specific behaviour.

The real below-floor torch is not installed here, so these tests start a fresh interpreter that
pretends to be one (``torch.__version__`` or ``torch.distributed.is_available`` replaced before hwdist
is imported): that is the one fake, for a torch build we do not have. Every supported version is
run for real by ci/versions.sh.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import hwdist
from hwdist.testing import run_distributed

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = """
import torch, torch.distributed
{pretend}
import hwdist  # must work
print("imported")
try:
    hwdist.init_dist("pytorch", backend="gloo")
except Exception as exc:
    print(type(exc).__name__ + ": " + str(exc))
else:
    print("no error")
"""


def _run(pretend: str) -> list[str]:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    code = _SCRIPT.format(pretend=textwrap.dedent(pretend))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**_base_env(), **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


def _base_env() -> dict[str, str]:
    import os

    return {
        k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))
    }


def test_torch_older_than_the_floor_imports_and_init_names_version_and_floor():
    out = _run('torch.__version__ = "2.0.1+cpu"')
    assert out[0] == "imported"
    assert out[-1].startswith("BackendError: backend 'gloo' is not available here"), out
    assert "torch 2.0.1+cpu is older than hwdist's floor (torch >= 2.1)" in out[-1], out


def test_torch_without_distributed_imports_and_init_says_so():
    out = _run("torch.distributed.is_available = lambda: False")
    assert out[0] == "imported"
    assert "was built without torch.distributed" in out[-1] and "torch >= 2.1" in out[-1], out


# ---------------------------------------------------------------- on real ranks
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


@pytest.mark.dist
def test_destroy_then_reinit_many_times_does_not_hang(tmp_path):
    # torch < 2.8 hung here now and then (gloo's destructor and the GIL); hwdist.destroy pauses first there.
    ws = 2
    res = run_distributed(_reinit_rounds, ws, None, str(tmp_path), ROUNDS, timeout=240)
    assert res == [[float(ws * (ws + 1) // 2)] * ROUNDS] * ws
