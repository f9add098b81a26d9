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
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
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
        test_params.test_all_reduce_dict_collectives_per_call,
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

    from hwdist.collectives import engine

    dev = hwdist.get_comm_device()
    ws, rank = hwdist.get_world_size(), hwdist.get_rank()
    t = torch.full((4,), float(rank + 1), device=dev)
    hwdist.all_reduce(t)
    first = t.cpu().tolist()
    hwdist.all_reduce(t)  # the second call takes the kept plan
    kept = [v for k, v in (engine.view(None).passthrough or {}).items() if k[-1] == t.device]
    b = torch.full((3,), float(rank), device=dev)
    hwdist.broadcast(b, 0)
    hwdist.broadcast(b, 0)
    total = ws * (ws + 1) / 2
    return {
        "first": first == [total] * 4,
        "second": t.cpu().tolist() == [total * ws] * 4,
        "broadcast": b.cpu().tolist() == [0.0] * 3,
        "kept": len(kept) >= 1 and all(v.bound is not None and v.bound() == t.device.index for v in kept),
    }


def test_device_passthrough_is_kept_per_bound_device(dist):
    """The engine keeps a GPU pass-through per tensor device and checks the bound device on each call."""
    backend, count = _accelerator()
    for ws in _world_sizes(count):
        for res in dist(_kept_passthrough_body, ws, backend):
            assert res == {"first": True, "second": True, "broadcast": True, "kept": True}, res


# ---------------------------------------------------------------------------------------------------
# Several ranks on one GPU: hwdist's paths for a non-CPU comm device, at 2 and 3 ranks.
# NCCL refuses two ranks on one GPU, and a one-GPU machine is the common case, so this test-only driver moves
# CUDA tensors over gloo (which stages them through the host) with every rank bound to GPU 0. It is
# not a way to run anything for real; it lets the gathers' size agreement, the object collectives and
# the dict reduction run with a GPU comm device and several ranks, and checks where results land.
# ---------------------------------------------------------------------------------------------------
def _gloo_on_gpu0_driver(kind: str) -> type:
    import torch

    class GlooOnGpu0(hwdist.Driver):
        device_type = kind
        torch_backend = "gloo"
        description = "test only: CUDA tensors over gloo, every rank on GPU 0"
        native_ops = frozenset({"all_reduce", "broadcast", "all_gather", "barrier"})
        flat_ops = frozenset()
        reduce_ops = frozenset({"sum", "product", "min", "max"})
        dtypes = frozenset({torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.int8})

        def current_device(self) -> torch.device:
            return torch.device(kind) if kind == "cpu" else torch.device(kind, 0)

    return GlooOnGpu0


def _several_ranks_on_gpu0(store: str, device_type: str = "cuda") -> dict:
    """Run on each rank (``device_type`` 'cpu' runs the same code on a CPU-only machine)."""
    import torch

    hwdist.register_backend("gloo_on_gpu0", _gloo_on_gpu0_driver(device_type))
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    hwdist.init_backend("gloo_on_gpu0", rank=rank, world_size=ws, init_method=f"file://{store}", timeout=60)
    dev = hwdist.get_comm_device()
    bad: list = []

    def check(what: str, got: list, want: list) -> None:
        devices = {str(g.device) for g in got}
        if devices != {str(dev)} or [g.cpu().tolist() for g in got] != [w.tolist() for w in want]:
            bad.append((what, sorted(devices), [g.cpu().tolist()[:4] for g in got][:3]))

    def value(n: int, r: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) + 1000 * r

    # all_gather without same_shape: the explicit first call, then in band (small), beside (above
    # 64 KiB), sizes that alternate and grow, and same_shape=True
    for n in (3, 1000, 40000):
        for call in range(5):
            sizes = [n + (r * call) % 3 for r in range(ws)]
            check(f"all_gather {n} call {call}", hwdist.all_gather(value(sizes[rank], rank).to(dev)),
                  [value(s, r) for r, s in enumerate(sizes)])
        check(f"all_gather {n} same_shape", hwdist.all_gather(value(n, rank).to(dev), same_shape=True),
              [value(n, r) for r in range(ws)])
        got = hwdist.gather(value(n, rank).to(dev), dst=0)
        if rank == 0:
            check(f"gather {n}", got, [value(n, r) for r in range(ws)])
        elif got != []:
            bad.append((f"gather {n} on a non-root rank", len(got)))
    sizes, padded = hwdist.pad_to_largest_tensor(value(2 + rank, rank).to(dev))
    if padded.device != dev or sizes != [2 + r for r in range(ws)]:
        bad.append(("pad_to_largest_tensor", str(padded.device), sizes))
    # all_to_all (emulated through all_gather here) with uneven pieces
    ins = [torch.full((1 + rank + j,), float(10 * rank + j), device=dev) for j in range(ws)]
    outs = [torch.empty(1 + j + rank, device=dev) for j in range(ws)]
    hwdist.all_to_all(outs, ins)
    check("all_to_all", outs, [torch.full((1 + j + rank,), float(10 * j + rank)) for j in range(ws)])
    # all_reduce_dict, several calls (the packing is reused from the second on)
    for call in range(3):
        d = dict(a=torch.tensor(float(rank), device=dev), b=torch.ones(2, device=dev))
        hwdist.all_reduce_dict(d)  # in place, as mmengine's
        check(f"all_reduce_dict {call}", [d["a"], d["b"]],
              [torch.tensor(float(sum(range(ws)))), torch.full((2,), float(ws))])
    objs = hwdist.all_gather_object({"rank": rank, "t": torch.ones(2, device=dev)})
    if [o["rank"] for o in objs] != list(range(ws)):
        bad.append(("all_gather_object", [o["rank"] for o in objs]))
    parts = hwdist.collect_results([rank] * 3, 3 * ws, device="gpu")
    if rank == 0 and sorted(parts) != sorted(r for r in range(ws) for _ in range(3)):
        bad.append(("collect_results gpu", parts))
    hwdist.destroy()
    return {"bad": bad}


@pytest.mark.parametrize("nproc", [2, 3])
def test_several_ranks_on_one_gpu_keep_results_on_the_gpu(nproc, tmp_path):
    """Each rank's results are on the GPU and correct, through every size-agreement route."""
    import torch

    from hwdist.testing import run_distributed

    _accelerator()
    if hwdist.detect().device_type != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the test driver moves CUDA tensors over gloo)")
    results = run_distributed(_several_ranks_on_gpu0, nproc, None, str(tmp_path / "store"), timeout=300)
    assert results == [{"bad": []}] * nproc, results
