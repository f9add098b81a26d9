"""A real client: tests/dist/modern_client.py, a training program written the modern way, under torchrun.

torch creates every group (``init_process_group()`` without a backend, ``init_device_mesh("cpu", ...)``),
FSDP2's ``fully_shard`` shards the model (HSDP on the 2-D mesh), and hwdist shares the seed, reduces the
metrics and gathers the predictions. The same program with ``--raw`` makes those three calls with
``torch.distributed``; both runs are launched, and every rank's losses, metrics, seed and gathered results
must be equal, value by value. FSDP2 runs on CPU gloo on the torch versions this test runs on (2.13, 2.15);
it needs torch >= 2.6 (``torch.distributed.fsdp.fully_shard`` and a backend-less init that picks a
backend per device) and is skipped, saying so, on older torch.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("modern_client.py")
LAUNCH_TIMEOUT_S = 300  # a loaded 2-core machine; a failing rank ends the launch within seconds (torchrun)
N_EVAL = 13  # modern_client.N_EVAL
EVAL_START = 32  # modern_client.N_TRAIN: the eval items' indices start there


def _missing() -> Optional[str]:
    """Why this torch cannot run the program, or None."""
    import torch.distributed as dist

    if not dist.is_available():
        return f"torch {torch.__version__} has no torch.distributed"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (public from 2.6)"
    if not hasattr(dist, "get_default_backend_for_device"):
        return f"torch {torch.__version__}: init_process_group() picks a backend per device from torch 2.6"
    return None


# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _env() -> dict[str, str]:
    """No launcher variables and no hwdist overrides from the calling shell; the checkout importable."""
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR"}
    drop.add("MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("HWDIST_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _start(nproc: int, out: Path, *args: str) -> subprocess.Popen:
    out.mkdir()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "--monitor-interval", "0.5", str(PROGRAM), str(out), *args,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, env=_env(), cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, out: Path, nproc: int) -> list[dict[str, Any]]:
    try:
        log, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launch's own session: torchrun and its ranks
        log, _ = proc.communicate()
        pytest.fail(f"{out.name}: torchrun did not finish in {LAUNCH_TIMEOUT_S} s:\n{log[-6000:]}")
    assert proc.returncode == 0, f"{out.name}: torchrun exited {proc.returncode}:\n{log[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def _run_both(tmp_path: Path, nproc: int, *args: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The program through hwdist and through raw torch.distributed, launched side by side."""
    procs = {"hw": _start(nproc, tmp_path / "hw", *args)}
    procs["raw"] = _start(nproc, tmp_path / "raw", *args, "--raw")
    try:
        return _finish(procs["hw"], tmp_path / "hw", nproc), _finish(procs["raw"], tmp_path / "raw", nproc)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


COMPARED = ("seed", "losses", "shard_losses", "metrics", "metric_dtypes", "results")


def _check(hw: list[dict[str, Any]], raw: list[dict[str, Any]], nproc: int, mesh: list[int]) -> None:
    for rank, (h, r) in enumerate(zip(hw, raw)):
        assert (h["api"], r["api"]) == ("hwdist", "torch.distributed")
        assert (h["rank"], h["world_size"], h["mesh"]) == (rank, nproc, mesh)
        assert h["backend_config"] == r["backend_config"] == "cpu:gloo"  # torch chose it, not hwdist
        assert h["drivers"] == ["gloo", "gloo"], h["drivers"]  # hwdist resolved torch's groups
        for key in COMPARED:
            assert h[key] == r[key], f"rank {rank}: {key}: hwdist {h[key]!r}, torch.distributed {r[key]!r}"

    # the run itself is right, whoever made the calls
    first = hw[0]
    assert {h["seed"] for h in hw} == {int(np.random.RandomState(1000).randint(2**31))}  # rank 0's draw
    assert all(h["losses"] == first["losses"] for h in hw)  # a global mean: one value on every rank
    assert first["losses"][-1] < first["losses"][0], first["losses"]  # it trained
    assert all(h["metrics"] == first["metrics"] for h in hw)
    dtypes = {"correct": "torch.int64", "count": "torch.int64", "loss_sum": "torch.float32"}
    assert first["metric_dtypes"] == dtypes
    results = first["results"]
    assert [x["index"] for x in results] == list(range(EVAL_START, EVAL_START + N_EVAL))  # dataset order
    assert all(h["results"] is None for h in hw[1:])
    padded = results + results[: first["metrics"]["count"] - N_EVAL]  # the sampler's padding, counted
    assert first["metrics"]["count"] == math.ceil(N_EVAL / nproc) * nproc
    assert first["metrics"]["correct"] == sum(x["pred"] == x["label"] for x in padded)

    # the mesh dimension's group: each 'shard' group's own mean, whose mean is the global one
    width = mesh[-1]
    groups = [hw[g * width]["shard_losses"] for g in range(nproc // width)]
    for rank, h in enumerate(hw):
        assert h["shard_losses"] == groups[rank // width]
    for step, loss in enumerate(first["losses"]):
        assert math.isclose(sum(g[step] for g in groups) / len(groups), loss, rel_tol=1e-6)
    if len(groups) > 1:
        assert groups[0] != groups[1]


def test_fsdp2_client_on_a_1d_mesh_of_2_ranks(tmp_path):
    hw, raw = _run_both(tmp_path, 2)
    _check(hw, raw, 2, [2])


@pytest.mark.slow
def test_hsdp_client_on_a_2x2_mesh_of_4_ranks(tmp_path):
    hw, raw = _run_both(tmp_path, 4, "--mesh", "2x2")
    _check(hw, raw, 4, [2, 2])
