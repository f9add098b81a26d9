"""The same check bodies as tests/dist and ``hwdist check``, on the machine's real accelerator backend.

Gated: runs only with ``HWDIST_RUN_HARDWARE=1`` and an available driver whose
device is not the CPU (detection's choice, e.g. NCCL on CUDA GPUs, HCCL on
Ascend). World sizes are bounded by the device count (one rank per device).
Every body of ``hwdist.checks`` runs twice: with its inputs on the backend's
device (``placement="comm"``, what ``hwdist check`` does) and on the CPU
(``placement="cpu"``: hwdist moves them to the driver's comm device and back,
which is part of what is checked here). The tests/dist functions the bodies do
not cover (bad input, dict history, object specifics) run on their CPU inputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwdist
from hwdist import checks
from tests.dist import test_objects, test_params, test_tensor_collectives

ROOT = Path(__file__).resolve().parents[2]


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _accelerator() -> tuple[str, int]:
    if not _flag("HWDIST_RUN_HARDWARE"):
        pytest.skip("set HWDIST_RUN_HARDWARE=1 to run the accelerator tests")
    det = hwdist.detect()
    drv = hwdist.get_driver(det.backend)
    if drv.device_type == "cpu" or drv.device_count() < 1:
        pytest.skip(f"no accelerator here (detected backend {det.backend!r} on {det.device_type!r})")
    return drv.name, drv.device_count()


def _world_sizes(count: int) -> list[int]:
    return [w for w in (1, 2, 3) if w <= count]


pytestmark = pytest.mark.hardware


@pytest.mark.parametrize("nproc", [1, 2])
def test_hwdist_check_passes_on_the_accelerator(nproc):
    backend, count = _accelerator()
    if nproc > count:
        pytest.skip(f"{nproc} ranks need {nproc} devices; {count} visible")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "hwdist", "check", "-n", str(nproc), "--backend", backend],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("placement", ["comm", "cpu"])
@pytest.mark.parametrize("name", checks.check_names())
def test_check_bodies_on_the_accelerator(dist, name, placement):
    backend, count = _accelerator()
    for ws in _world_sizes(count):
        test_tensor_collectives.run_bodies(dist, ws, backend, name, placement)


@pytest.mark.parametrize(
    "body",
    [
        test_tensor_collectives.test_bad_input_raises_on_every_rank,
        test_params.test_all_reduce_dict,
        test_params.test_all_reduce_dict_history,
        test_params.test_all_reduce_params,
    ],
    ids=lambda f: f.__name__,
)
def test_tensor_checks_on_the_accelerator(dist, body):
    backend, count = _accelerator()
    for ws in _world_sizes(count):
        body(dist, (ws, backend))


def test_object_collectives_on_the_accelerator(dist):
    backend, count = _accelerator()
    for ws in _world_sizes(count):
        test_objects.test_object_collectives(dist, ws, backend)
        test_objects.test_tensors_land_on_cpu_or_map_location(dist, backend)


def _kept_passthrough_body() -> dict:
    """On a rank: the kept pass-through of a device tensor, checked against the bound device."""
    import torch

    from hwdist.collectives import _engine

    dev = hwdist.get_comm_device()
    ws, rank = hwdist.get_world_size(), hwdist.get_rank()
    t = torch.full((4,), float(rank + 1), device=dev)
    hwdist.all_reduce(t)
    first = t.cpu().tolist()
    hwdist.all_reduce(t)  # the second call takes the kept plan
    kept = [v for k, v in (_engine.view(None).passthrough or {}).items() if k[-1] == t.device]
    b = torch.full((3,), float(rank), device=dev)
    hwdist.broadcast(b, 0)
    hwdist.broadcast(b, 0)
    total = ws * (ws + 1) / 2
    return {
        "first": first == [total] * 4,
        "second": t.cpu().tolist() == [total * ws] * 4,
        "broadcast": b.cpu().tolist() == [0.0] * 3,
        "kept": len(kept) >= 1 and all(v[3] is not None and v[3]() == t.device.index for v in kept),
    }


def test_device_passthrough_is_kept_per_bound_device(dist):
    """The engine keeps a GPU pass-through per tensor device and checks the bound device on each call."""
    backend, count = _accelerator()
    for ws in _world_sizes(count):
        for res in dist(_kept_passthrough_body, ws, backend):
            assert res == {"first": True, "second": True, "broadcast": True, "kept": True}, res
