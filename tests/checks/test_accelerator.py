"""The same check bodies as the dist tests and ``hwdist check``, on the machine's real accelerator backend.

Gated: runs only with ``HWDIST_RUN_HARDWARE=1`` and an available driver whose
device is not the CPU (detection's choice, e.g. NCCL on CUDA GPUs, HCCL on
Ascend). World sizes are bounded by the device count (one rank per device).
Every body of ``hwdist.checks`` runs twice: with its inputs on the backend's
device (``placement="comm"``, what ``hwdist check`` does) and on the CPU
(``placement="cpu"``: hwdist moves them to the driver's comm device and back,
which is part of what is checked here). The distributed tests' functions the bodies do
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
from tests.collectives import test_objects, test_params, test_tensor

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
        test_tensor.run_bodies(dist, ws, backend, name, placement)


@pytest.mark.parametrize(
    "body",
    [
        test_tensor.test_bad_input_raises_on_every_rank,
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


def _passthrough_body() -> dict:
    """On a rank: repeated pass-throughs of a device tensor on the bound device."""
    import torch

    dev = hwdist.get_comm_device()
    ws, rank = hwdist.get_world_size(), hwdist.get_rank()
    t = torch.full((4,), float(rank + 1), device=dev)
    hwdist.all_reduce(t)
    first = t.cpu().tolist()
    hwdist.all_reduce(t)
    b = torch.full((3,), float(rank), device=dev)
    hwdist.broadcast(b, 0)
    hwdist.broadcast(b, 0)
    total = ws * (ws + 1) / 2
    return {
        "first": first == [total] * 4,
        "second": t.cpu().tolist() == [total * ws] * 4,
        "broadcast": b.cpu().tolist() == [0.0] * 3,
    }


def test_device_passthrough_repeats_on_the_bound_device(dist):
    """Pass-throughs of a device tensor, called again, stay right on the bound device."""
    backend, count = _accelerator()
    for ws in _world_sizes(count):
        for res in dist(_passthrough_body, ws, backend):
            assert res == {"first": True, "second": True, "broadcast": True}, res


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


# ---------------------------------------------------------------------------------------------------
# What users do on a GPU machine that the bodies above do not: a group torch made without a backend,
# and worker processes forked after detection.

_TORCH_MADE_GROUP = r"""
import os
import sys

import torch
import torch.distributed as dist

import hwdist

# no backend: torch >= 2.6 makes the detected accelerator's backend only ("cuda:nccl"); or one per device
dist.init_process_group(sys.argv[1] or None)
rank, ws = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
config = str(dist.get_backend_config())
assert sorted(config.split(",")) == sorted((sys.argv[1] or "cuda:nccl").split(",")), config
total = ws * (ws + 1) / 2
t = torch.full((4,), float(rank + 1), device="cuda")
hwdist.all_reduce(t)  # NCCL
assert t.device.type == "cuda" and t.tolist() == [total] * 4, t
c = torch.full((3,), float(rank + 1))
hwdist.all_reduce(c, "mean")  # gloo, or through the GPU and back where the group has no CPU backend
assert c.device.type == "cpu" and c.tolist() == [(ws + 1) / 2] * 3, c
parts = hwdist.all_gather(torch.full((2,), float(rank), device="cuda"))
assert [p.device.type for p in parts] == ["cuda"] * ws, parts
assert [p.tolist() for p in parts] == [[float(r)] * 2 for r in range(ws)], parts
d = {"loss": torch.tensor(float(rank), device="cuda"), "n": torch.tensor(rank + 1)}
for _ in range(3):  # the first call agrees on the layout; later ones reuse it
    out = dict(d)
    hwdist.all_reduce_dict(out)
    assert out["loss"].device.type == "cuda" and out["loss"].item() == sum(range(ws)), out
    assert out["n"].dtype == torch.int64 and out["n"].item() == total, out
objs = hwdist.all_gather_object({"rank": rank, "t": torch.ones(2, device="cuda")})
assert [o["rank"] for o in objs] == list(range(ws)), objs
box = [{"from": rank}]
hwdist.broadcast_object_list(box, 0)
assert box == [{"from": 0}], box
got_gpu = hwdist.collect_results([rank] * 2, 2 * ws, device="gpu")
got_cpu = hwdist.collect_results([rank] * 2, 2 * ws, device="cpu")
if rank == 0:
    want = [r for _ in range(2) for r in range(ws)]
    assert got_gpu == want and got_cpu == want, (got_gpu, got_cpu)
seed = hwdist.sync_random_seed()
assert isinstance(seed, int), seed
hwdist.barrier()
dist.destroy_process_group()
print(f"rank {rank}: ok", flush=True)
"""


@pytest.mark.parametrize("backend_arg", ["", "cpu:gloo,cuda:nccl"], ids=["no backend", "one per device"])
def test_group_torch_made_on_the_gpu(tmp_path, backend_arg):
    """``init_process_group()`` under torchrun, as users call it: hwdist on CUDA and CPU tensors, objects."""
    import torch

    _, count = _accelerator()
    if hwdist.detect().device_type != "cuda" or not hasattr(torch, "accelerator"):
        pytest.skip("needs a CUDA GPU and torch >= 2.6 (a backend per device)")
    script = tmp_path / "torch_made.py"
    script.write_text(_TORCH_MADE_GROUP)
    nproc = min(count, 2)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd = [*run, str(script), backend_arg]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    missing = [r for r in range(nproc) if f"rank {r}: ok" not in proc.stdout]  # ranks' lines may interleave
    assert not missing, out[-3000:]


_FORK_AFTER = r"""
import os
import sys

import torch

import hwdist

if sys.argv[1] == "detect":
    det = hwdist.detect()
    assert det.device_type == "cuda", det
else:  # the control: torch's own availability check leaves the parent unable to fork a CUDA child
    assert torch.cuda.is_available()
assert not torch.cuda.is_initialized()
pid = os.fork()
if pid == 0:  # the child: its first CUDA work
    try:
        x = torch.ones(1024, device="cuda") * 2
        torch.cuda.synchronize()
        ok = x.sum().item() == 2048
        print("child:", "ok" if ok else "wrong sum", flush=True)
        os._exit(0 if ok else 2)
    except Exception as exc:
        print("child:", exc, flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.WEXITSTATUS(status))
"""


def test_a_child_forked_after_detection_can_use_cuda(tmp_path):
    """``detect()`` initialises no CUDA, so a forked worker can; torch's ``is_available()`` is the control."""
    _accelerator()
    if hwdist.detect().device_type != "cuda":
        pytest.skip("needs a CUDA GPU")
    script = tmp_path / "fork_after.py"
    script.write_text(_FORK_AFTER)
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    env["PYTHONPATH"] = str(ROOT)
    runs = {
        how: subprocess.run([sys.executable, str(script), how], env=env, capture_output=True, text=True,
                            timeout=120)
        for how in ("detect", "control")
    }
    detect, control = runs["detect"], runs["control"]
    assert detect.returncode == 0 and "child: ok" in detect.stdout, detect.stdout + detect.stderr
    assert control.returncode == 1 and "re-initialize CUDA" in control.stdout, control.stdout + control.stderr
