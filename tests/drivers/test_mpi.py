"""The MPI backend on stock torch (mpi4py process group), end to end under mpiexec.

``test_mpiexec_suite`` starts ``mpiexec -n 2`` and ``-n 3`` running
``hwdist.testing.mpi_suite`` over the ``dist`` tests: every test parametrized with
``backends()`` runs on backend ``mpi``, the checks below included. The
checks themselves run only inside that suite (they need MPI processes, not
spawned ones); outside it they are skipped with that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as tdist

import hwdist
from hwdist.testing.mpi_suite import ENV_SUITE, MPI_AS_ROOT
from hwdist.testing.pytest_plugin import backends, world_sizes

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
IN_SUITE = os.environ.get(ENV_SUITE) == "1"


def _mpi_missing() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install mpi4py mpich)"
    if shutil.which("mpiexec") is None:
        return "mpiexec is not on PATH"
    return ""


needs_suite = pytest.mark.skipif(
    not IN_SUITE, reason="runs inside `mpiexec -n N python -m hwdist.testing.mpi_suite` (test_mpiexec_suite)"
)
MPI_PARAMS = [b for b in backends() if b == "mpi"] or ["mpi"]


# ------------------------------------------------------------------ checks (run on every MPI rank)


def check_all_reduce_ops_and_dtypes() -> dict:
    r = tdist.get_rank()
    out = {}
    for dtype in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int8,
        torch.complex64,
    ):
        t = torch.tensor([r + 1, 2 * (r + 1)], dtype=dtype)
        tdist.all_reduce(t)
        out[("sum", str(dtype))] = t.tolist()
    for name, op in (
        ("max", tdist.ReduceOp.MAX),
        ("min", tdist.ReduceOp.MIN),
        ("prod", tdist.ReduceOp.PRODUCT),
    ):
        t = torch.tensor([float(r + 1)])
        tdist.all_reduce(t, op=op)
        out[name] = t.item()
    for name, op in (
        ("band", tdist.ReduceOp.BAND),
        ("bor", tdist.ReduceOp.BOR),
        ("bxor", tdist.ReduceOp.BXOR),
    ):
        t = torch.tensor([1 << r], dtype=torch.int32)
        tdist.all_reduce(t, op=op)
        out[name] = t.item()
    t = torch.tensor([float(r)])
    tdist.all_reduce(t, op=tdist.ReduceOp.AVG)
    out["avg"] = t.item()
    b = torch.tensor([r == 0, True, False])
    tdist.all_reduce(b)  # SUM on bool = any
    out["bool_any"] = b.tolist()
    b = torch.tensor([r == 0, True])
    tdist.all_reduce(b, op=tdist.ReduceOp.MIN)  # all
    out["bool_all"] = b.tolist()
    nc = torch.arange(6, dtype=torch.float32).reshape(2, 3).t() * (r + 1)  # non-contiguous
    tdist.all_reduce(nc)
    out["noncontig"] = nc.tolist()
    return out


@needs_suite
@pytest.mark.parametrize("backend", MPI_PARAMS)
@pytest.mark.parametrize("world_size", world_sizes())
def test_all_reduce_ops_and_dtypes(dist, world_size, backend):
    n = world_size
    tot = n * (n + 1) // 2
    for res in dist(check_all_reduce_ops_and_dtypes, world_size, backend):
        for dtype in ("float32", "float64", "float16", "bfloat16", "int64", "int8", "complex64"):
            got = res[("sum", f"torch.{dtype}")]
            assert [complex(x) for x in got] == [tot, 2 * tot]
        assert res["max"] == n and res["min"] == 1
        assert res["prod"] == float(torch.arange(1, n + 1).prod())
        bits = [1 << r for r in range(n)]
        assert res["band"] == (bits[0] if n == 1 else 0)
        assert res["bor"] == sum(bits) and res["bxor"] == sum(bits)
        assert res["avg"] == pytest.approx((n - 1) / 2)
        assert res["bool_any"] == [True, True, False]
        assert res["bool_all"] == [n == 1, True]
        base = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
        assert res["noncontig"] == (base * tot).tolist()


def check_data_movement() -> dict:
    r, n = tdist.get_rank(), tdist.get_world_size()
    out = {}
    outs = [torch.zeros(2, dtype=torch.bfloat16) for _ in range(n)]
    tdist.all_gather(outs, torch.full((2,), float(r), dtype=torch.bfloat16))
    out["all_gather_bf16"] = [o.float().tolist() for o in outs]
    uneven = [torch.zeros(i + 1) for i in range(n)]
    tdist.all_gather(uneven, torch.full((r + 1,), float(r)))
    out["all_gather_uneven"] = [u.tolist() for u in uneven]
    flat = torch.zeros(2 * n, dtype=torch.int64)
    tdist.all_gather_into_tensor(flat, torch.tensor([r, 10 * r]))
    out["all_gather_into_tensor"] = flat.tolist()
    t = torch.full((3,), float(r))
    tdist.broadcast(t, src=n - 1)
    out["broadcast"] = t.tolist()
    t = torch.tensor([float(r + 1)])
    tdist.reduce(t, dst=0)
    out["reduce_root"] = t.item() if r == 0 else None
    g = [torch.zeros(1) for _ in range(n)] if r == 0 else None
    tdist.gather(torch.tensor([float(r)]), g, dst=0)
    out["gather"] = [x.item() for x in g] if g else None
    o = torch.zeros(1)
    tdist.scatter(o, [torch.tensor([10.0 * i]) for i in range(n)] if r == n - 1 else None, src=n - 1)
    out["scatter"] = o.item()
    o = torch.zeros(1)
    tdist.reduce_scatter(o, [torch.tensor([float(r + i)]) for i in range(n)])
    out["reduce_scatter"] = o.item()
    o = torch.zeros(2, dtype=torch.bfloat16)
    tdist.reduce_scatter_tensor(o, torch.arange(2 * n, dtype=torch.bfloat16) + r)
    out["reduce_scatter_tensor_bf16"] = o.float().tolist()
    o = torch.zeros(n)
    tdist.all_to_all_single(o, torch.arange(n, dtype=torch.float32) + 10 * r)
    out["all_to_all_single"] = o.tolist()
    # uneven splits: rank r sends (i + 1) rows to rank i
    send = torch.cat([torch.full((i + 1, 2), float(100 * r + i)) for i in range(n)])
    recv = torch.zeros(n * (r + 1), 2)
    tdist.all_to_all_single(recv, send, [r + 1] * n, [i + 1 for i in range(n)])
    out["all_to_all_uneven"] = recv[:, 0].tolist()
    outs = [torch.zeros(1) for _ in range(n)]
    tdist.all_to_all(outs, [torch.tensor([float(10 * r + i)]) for i in range(n)])
    out["all_to_all"] = [x.item() for x in outs]
    tdist.barrier()
    return out


@needs_suite
@pytest.mark.parametrize("backend", MPI_PARAMS)
@pytest.mark.parametrize("world_size", world_sizes())
def test_data_movement(dist, world_size, backend):
    n = world_size
    for r, res in enumerate(dist(check_data_movement, world_size, backend)):
        assert res["all_gather_bf16"] == [[float(i)] * 2 for i in range(n)]
        assert res["all_gather_uneven"] == [[float(i)] * (i + 1) for i in range(n)]
        assert res["all_gather_into_tensor"] == [v for i in range(n) for v in (i, 10 * i)]
        assert res["broadcast"] == [float(n - 1)] * 3
        assert res["reduce_root"] == (n * (n + 1) / 2 if r == 0 else None)
        assert res["gather"] == ([float(i) for i in range(n)] if r == 0 else None)
        assert res["scatter"] == 10.0 * r
        assert res["reduce_scatter"] == sum(float(q + r) for q in range(n))
        assert res["reduce_scatter_tensor_bf16"] == [
            float(sum(2 * r + k + q for q in range(n))) for k in range(2)
        ]
        assert res["all_to_all_single"] == [float(r + 10 * q) for q in range(n)]
        assert res["all_to_all_uneven"] == [float(100 * q + r) for q in range(n) for _ in range(r + 1)]
        assert res["all_to_all"] == [float(10 * q + r) for q in range(n)]


def check_p2p_async_groups_objects_ddp() -> dict:
    r, n = tdist.get_rank(), tdist.get_world_size()
    out = {}
    # ring exchange with isend/irecv posted before waiting (needs non-blocking p2p)
    big = torch.full((1 << 18,), float(r))  # 1 MiB: beyond eager limits
    got = torch.zeros_like(big)
    reqs = [tdist.isend(big, (r + 1) % n), tdist.irecv(got, (r - 1) % n)]
    for q in reqs:
        q.wait()
    out["ring"] = got[0].item()
    if n > 1:
        if r == 1:
            tdist.send(torch.tensor([7.0]), 0)
        if r == 0:
            x = torch.zeros(1)
            out["anysource"] = (tdist.recv(x), x.item())
    work = tdist.all_reduce(torch.ones(2), async_op=True)
    fut = work.get_future()
    out["future"] = fut.wait()[0].tolist()
    out["work_done"] = work.is_completed() and work.wait()
    chained = tdist.all_reduce(torch.ones(1), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    out["then"] = chained.wait().tolist()
    evens = tdist.new_group([i for i in range(n) if i % 2 == 0])
    tail = tdist.new_group(list(range(1, n))) if n > 1 else None  # group rank 0 is global rank 1
    if r % 2 == 0:
        t = torch.tensor([float(r)])
        tdist.all_reduce(t, group=evens)
        out["evens"] = t.item()
        out["evens_rank"] = tdist.get_rank(evens)
    if r >= 1:
        t = torch.tensor([float(r)])
        tdist.broadcast(t, group_src=0, group=tail)
        out["tail_bcast"] = (t.item(), tdist.get_rank(tail))
    objs = [None] * n
    tdist.all_gather_object(objs, {"rank": r, "s": "x" * r})
    out["all_gather_object"] = objs
    lst = [{"from": r}]
    tdist.broadcast_object_list(lst, src=n - 1)
    out["broadcast_object_list"] = lst[0]
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.full((2, 3), float(r + 1))).sum().backward()
    out["ddp_grad"] = model.weight.grad.tolist()
    out["driver"] = hwdist.resolve().name
    out["local"] = (hwdist.get_local_rank(), hwdist.get_local_size())
    return out


@needs_suite
@pytest.mark.parametrize("backend", MPI_PARAMS)
@pytest.mark.parametrize("world_size", world_sizes())
def test_p2p_async_groups_objects_ddp(dist, world_size, backend):
    n = world_size
    # DDP averages: d(sum(w.x + b))/dw = 2 * (r + 1) per element on rank r
    mean_grad = sum(2.0 * (q + 1) for q in range(n)) / n
    for r, res in enumerate(dist(check_p2p_async_groups_objects_ddp, world_size, backend)):
        assert res["ring"] == float((r - 1) % n)
        if n > 1 and r == 0:
            assert res["anysource"] == (1, 7.0)
        assert res["future"] == [float(n)] * 2 and res["work_done"] is True
        assert res["then"] == [2.0 * n]
        if r % 2 == 0:
            assert res["evens"] == float(sum(range(0, n, 2)))
            assert res["evens_rank"] == r // 2
        if r >= 1:
            assert res["tail_bcast"] == (1.0, r - 1)
        assert res["all_gather_object"] == [{"rank": q, "s": "x" * q} for q in range(n)]
        assert res["broadcast_object_list"] == {"from": n - 1}
        assert res["ddp_grad"] == [[pytest.approx(mean_grad)] * 3]
        assert res["driver"] == "mpi"
        assert res["local"] == (r, n)  # one machine: the local group is the world


# ------------------------------------------------------------------ the mpiexec runs (normal pytest)


@pytest.mark.mpi
@pytest.mark.skipif(IN_SUITE, reason="already inside the MPI suite")
@pytest.mark.skipif(os.environ.get("HWDIST_MATRIX") == "1", reason="ci/matrix.sh runs the MPI entries itself")
@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpiexec_suite(nprocs):
    why = _mpi_missing()
    if why:
        pytest.skip(why)
    env = {**os.environ, "MPIEXEC_TIMEOUT": "240", "PYTHONPATH": str(ROOT), **MPI_AS_ROOT}
    env.pop("HWDIST_TEST_BACKENDS", None)
    proc = subprocess.run(
        [
            "mpiexec",
            "-n",
            str(nprocs),
            sys.executable,
            "-m",
            "hwdist.testing.mpi_suite",
            "tests",
            "-m",
            "dist",
            "-q",
            "-x",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout, tail


@pytest.mark.mpi
@pytest.mark.skipif(IN_SUITE, reason="already inside the MPI suite")
def test_mpi_backend_outside_mpiexec_is_a_clear_error():
    """Spawned ranks (not one MPI job) asking for backend 'mpi' get an explanation, on every rank."""
    if _mpi_missing():
        pytest.skip(_mpi_missing())
    from hwdist.testing import RankFailure, run_distributed

    with pytest.raises(RankFailure, match="needs every rank started by one mpiexec"):
        run_distributed(os.getpid, 2, "mpi", timeout=60)


# ---------------------------------------------------------- the watchdog (hwdist/drivers/_mpi_watchdog.py)

_FAULT_SCRIPT = """
import sys, time
import torch
import hwdist

mode, timeout = sys.argv[1], float(sys.argv[2])
hwdist.init_dist("mpi", backend="mpi", timeout=timeout)
rank = hwdist.get_rank()
t = torch.ones(2)
hwdist.all_reduce(t)
if rank == 1:
    if mode == "raise":
        raise ValueError("boom on rank 1")
    if mode == "exit":
        sys.exit(0)
    if mode == "stall":
        time.sleep(120)
print(f"rank {rank} entering all_reduce at {time.time():.3f}", flush=True)
hwdist.all_reduce(t)
print(f"rank {rank} left all_reduce with {t.tolist()}", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.skipif(IN_SUITE, reason="already inside the MPI suite")
@pytest.mark.parametrize(
    "mode, timeout, message",
    [
        ("raise", 60, "hwdist: aborting the MPI job from rank 1: rank 1 raised ValueError: boom on rank 1"),
        # (the header round of verification, an Allgather, is what the others wait in first)
        ("exit", 60, "rank 1 exited while rank {r} waits for it in MPI Allgather"),
        (
            "stall",
            3,
            "s, more than the process-group timeout of 3 s (init_dist(timeout=...)): a rank of this group"
            " never joined it",
        ),
        ("normal", 60, ""),
    ],
)
def test_watchdog_aborts_the_job_when_a_rank_leaves(tmp_path, mode, timeout, message):
    """Rank 1 raises, exits or never joins while ranks 0 and 2 wait in all_reduce: the job ends in seconds."""
    why = _mpi_missing()
    if why:
        pytest.skip(why)
    import re
    import time

    script = tmp_path / "fault.py"
    script.write_text(_FAULT_SCRIPT)
    env = {**os.environ, "MPIEXEC_TIMEOUT": "100", "PYTHONPATH": str(ROOT), **MPI_AS_ROOT}
    proc = subprocess.run(
        ["mpiexec", "-n", "3", sys.executable, str(script), mode, str(timeout)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    ended = time.time()
    out = proc.stdout + proc.stderr
    if mode == "normal":  # the control: nobody aborts a job whose ranks all finish
        assert proc.returncode == 0, out[-3000:]
        assert "aborting" not in out and out.count("left all_reduce with [9.0, 9.0]") == 3, out[-3000:]
        return
    assert proc.returncode != 0, out[-3000:]
    entered = [float(x) for x in re.findall(r"entering all_reduce at ([0-9.]+)", out)]
    assert len(entered) == 2 and "left all_reduce" not in out, out[-3000:]  # ranks 0 and 2 waited
    assert any(message.format(r=r) in out for r in (0, 2)), out[-3000:]
    waited = ended - max(entered)
    print(f"{mode}: the job ended {waited:.1f} s after the last rank entered the all_reduce")
    assert waited < timeout / 2 if mode != "stall" else waited < timeout + 7, waited
