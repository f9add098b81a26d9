"""Groups torch made and backends torch knows, on real ranks: resolution, shared names, generic drivers.

Every process group here is created by torch itself (``init_process_group()`` without a backend,
``new_group``, ``new_subgroups``, ``split_group``, ``init_device_mesh``), or on a backend registered
with torch only; hwdist must resolve each by what torch knows of it and run every public operation on
it. A feature a torch lacks skips with the reason (CI runs torch 2.1.2, 2.13 and 2.15).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import hwdist
from hwdist import _compat, registry
from hwdist.checks import judge
from hwdist.testing import RankPool
import math
import signal
from typing import Any, Optional
import numpy as np

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("HWDIST_TEST_TIMEOUT", "240"))
HELPER = "tests.programs._torch_only_backend"


@pytest.fixture(scope="module")
def ranks():
    """``run(fn, *args, world=2)``: ``fn`` on live ranks without a process group (each ``fn`` makes
    its own and destroys it), kept between tests; a broken pool is replaced."""
    pools: dict[int, RankPool] = {}

    def run(fn, *args, world: int = 2):
        pool = pools.get(world)
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
            pool = pools[world] = RankPool(world, None, timeout=TIMEOUT, pg_timeout=60)
        return pool.run(fn, *args)

    yield run
    for pool in pools.values():
        pool.close()


def _init(store: str, backend=None) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    kwargs = {} if backend is None else {"backend": backend}
    dist.init_process_group(init_method=f"file://{store}", rank=rank, world_size=world, **kwargs)


def _done() -> None:
    hwdist.destroy()


def _error(fn, *args, **kwargs):
    """``(exception class name, message)`` of ``fn(...)``, or None if it returned."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def _battery(group=None, int64: bool = True) -> dict:
    """Every public hwdist operation on ``group`` (None: the default group): values computed here from
    the rank numbers, each result compared; returns what the parent checks across ranks."""
    members = list(dist.get_process_group_ranks(group)) if group is not None else list(
        range(dist.get_world_size())
    )
    me, n, first = dist.get_rank(), len(members), members[0]
    problems = []

    def expect(label, got, want):
        if isinstance(want, torch.Tensor):
            same = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
        else:
            same = got == want
        if not same:
            problems.append(f"rank {me}: {label}: got {got!r}, expected {want!r}")

    t = torch.full((3,), float(me + 1))
    hwdist.all_reduce(t, "sum", group=group)
    expect("all_reduce sum", t, torch.full((3,), float(sum(r + 1 for r in members))))
    t = torch.full((3,), float(me + 1))
    hwdist.all_reduce(t, "mean", group=group)
    expect("all_reduce mean", t, torch.full((3,), sum(r + 1 for r in members) / n))
    if int64:  # (a generic driver's table has no int64 reduction)
        i = torch.tensor([2**40 + me])
        hwdist.all_reduce(i, "max", group=group)
        expect("all_reduce int64 max", i, torch.tensor([2**40 + max(members)]))
    b = torch.tensor([me, -me])
    hwdist.broadcast(b, src=first, group=group)
    expect("broadcast", b, torch.tensor([first, -first]))
    gathered = hwdist.all_gather(torch.tensor([me]), group=group)
    expect("all_gather", gathered, [torch.tensor([r]) for r in members])
    r = torch.tensor([float(me)])
    hwdist.reduce(r, dst=first, op="sum", group=group)
    if me == first:
        expect("reduce", r, torch.tensor([float(sum(members))]))
    hwdist.barrier(group=group)
    expect("all_gather_object", hwdist.all_gather_object({"r": me}, group=group), [{"r": q} for q in members])
    got = hwdist.gather_object([me] * (me + 1), dst=first, group=group)
    expect("gather_object", got, [[q] * (q + 1) for q in members] if me == first else None)
    expect("broadcast_object", hwdist.broadcast_object({"from": me}, src=first, group=group), {"from": first})
    out = [None]
    pieces = [f"to {q}" for q in members] if me == first else None
    hwdist.scatter_object_list(out, pieces, src=first, group=group)
    expect("scatter_object_list", out, [f"to {me}"])
    ints = torch.int64 if int64 else torch.int32
    d = {"loss": torch.tensor(float(me)), "n": torch.tensor([me, 1], dtype=ints)}
    hwdist.all_reduce_dict(d, "sum", group=group)
    expect("all_reduce_dict loss", d["loss"], torch.tensor(float(sum(members))))
    expect("all_reduce_dict n", d["n"], torch.tensor([sum(members), n], dtype=ints))
    results = hwdist.collect_results([f"p{me}"], size=n, group=group)
    if me == first:
        expect("collect_results", sorted(results), sorted(f"p{q}" for q in members))
    return {
        "problems": problems,
        "seed": hwdist.sync_random_seed(group=group),
        "driver": hwdist.resolve(group).name,
        "backend": hwdist.get_backend(group),
        "comm_device": str(hwdist.get_comm_device(group)),
    }


def _check_battery(results: list[dict], backend: str = "gloo", reported: str = "") -> None:
    """No problem on any rank, the driver ``backend`` (``hwdist.get_backend`` says ``reported``, by
    default the same), the same seed everywhere."""
    for res in results:
        assert not res["problems"], res["problems"]
        got = (res["driver"], res["backend"], res["comm_device"])
        assert got == (backend, reported or backend, "cpu"), res
    assert len({res["seed"] for res in results}) == 1, [res["seed"] for res in results]


# ------------------------------------------------------------------ 1. groups torch made


def _rank_backendless(store: str) -> dict:
    from hwdist.checks import CHECKS, run_check

    # no backend: torch picks per device (cpu:gloo here); gloo where torch cannot (before 2.6)
    _init(store, None if _compat.INIT_WITHOUT_BACKEND_PER_DEVICE else "gloo")
    try:
        torch_view = {
            "backend": str(dist.get_backend()),
            "config": dist.get_backend_config(),
            "object_device": _compat.object_coll_device(None) if _compat.object_coll_device else None,
        }
        out = {"torch": torch_view, "default": _battery()}
        # every public operation once more, through hwdist check's own bodies (one dtype each)
        rows = {}
        for name, dtypes, _body in CHECKS:
            if name == "dist_info":  # asks for hwdist's local groups, which torch-made groups lack
                continue
            rows[name] = run_check(name, dtypes[0])
        out["checks"] = rows
        out["new_group"] = _battery(dist.new_group())
        sub, _ = dist.new_subgroups(1)  # one group per rank
        out["subgroups"] = _battery(sub)
        return out
    finally:
        _done()


def test_backendless_init_new_group_and_subgroups_run_every_public_operation(ranks, tmp_path):
    """Without a backend where torch picks per device (torch >= 2.6); on older torch the default group
    is gloo's (``init_process_group()`` there creates every backend of the build, and a CUDA wheel
    fails on a machine without a GPU), and ``new_group``/``new_subgroups`` are still torch's."""
    results = ranks(_rank_backendless, str(tmp_path / "store"))

    for res in results:
        # torch records no backend name; its map says cpu:gloo, and hwdist resolves through the map
        named = "undefined" if _compat.INIT_WITHOUT_BACKEND_PER_DEVICE else "gloo"
        assert res["torch"]["backend"] == named, res["torch"]
        assert res["torch"]["config"] in ("cpu:gloo", "cpu:gloo,cuda:gloo"), res["torch"]
        if res["torch"]["object_device"] is not None:
            assert res["torch"]["object_device"] == "cpu"
    for key in ("default", "new_group"):
        _check_battery([res[key] for res in results])
    for res in results:  # one-rank groups: a battery each
        assert not res["subgroups"]["problems"] and res["subgroups"]["driver"] == "gloo"
    for name in results[0]["checks"]:
        row = judge(name, None, [res["checks"][name] for res in results], "gloo")
        assert row.status == "pass", (name, row.detail)


def _rank_mesh(store: str, shape: tuple) -> dict:
    try:
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError:
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.device_mesh (torch >= 2.2)")
    # The default group as DeviceMesh makes it on this torch: without a backend where torch picks per
    # device (>= 2.6), else gloo (init_device_mesh would ask for every backend of the build).
    _init(store, None if _compat.INIT_WITHOUT_BACKEND_PER_DEVICE else "gloo")
    try:
        mesh = init_device_mesh("cpu", shape)
        out = {}
        for dim in range(len(shape)):
            group = mesh.get_group(dim)
            out[dim] = _battery(group)
            out[dim]["ranks"] = list(dist.get_process_group_ranks(group))
        return out
    finally:
        _done()


def test_device_mesh_1d_dim_group(ranks, tmp_path):
    results = ranks(_rank_mesh, str(tmp_path / "store"), (2,))
    _check_battery([res[0] for res in results])


@pytest.mark.slow
def test_device_mesh_2d_on_4_ranks(ranks, tmp_path):
    results = ranks(_rank_mesh, str(tmp_path / "store"), (2, 2), world=4)
    for dim in (0, 1):
        by_group: dict = {}
        for res in results:
            by_group.setdefault(tuple(res[dim]["ranks"]), []).append(res[dim])
        assert len(by_group) == 2 and all(len(members) == 2 for members in by_group.values())
        for members in by_group.values():
            _check_battery(members)


def _rank_split(store: str) -> dict:
    if not hasattr(dist, "split_group"):
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.split_group")
    _init(store)
    # every rank's init has finished before any rank may skip and tear its group down (a rank still
    # connecting would see "Connection closed by peer" instead of the skip)
    dist.barrier()
    try:
        try:
            group = dist.split_group(split_ranks=[[0], [1]])
        except RuntimeError as exc:  # a torch whose split_group needs an accelerator backend
            pytest.skip(f"torch {torch.__version__}: split_group refuses a CPU group here: {exc}")
        return _battery(group)
    finally:
        _done()


def test_split_group(ranks, tmp_path):
    if not hasattr(dist, "split_group"):
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.split_group")
    if not _compat.INIT_WITHOUT_BACKEND_PER_DEVICE:
        pytest.skip(f"torch {torch.__version__}: no backend-less init to split from (torch >= 2.6)")
    for res in ranks(_rank_split, str(tmp_path / "store")):  # one-rank groups
        assert not res["problems"] and res["driver"] == "gloo", res


# ------------------------------------------------------------------ 2. calls without a tensor device


def _rank_two_backends(store: str) -> dict:
    """The default group has two device backends: 'cpu:gloo,hpu:fakecl'.

    Stands in, on a CPU-only machine, for 'cpu:gloo,cuda:nccl' (torch's backend-less default on a
    GPU machine before torch 2.6, and what users ask for to keep gloo beside NCCL) and
    'cpu:gloo,hpu:hccl' (Intel Gaudi's): 'hpu' is a device type torch knows without its hardware
    (no tensor can live on it here), 'fakecl' a backend registered with torch only for it (gloo
    underneath, so torch can create it). A call without a tensor must use the CPU's
    backend, as torch's own object collectives do.
    """

    def create(store, rank, size, timeout):
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    if not _compat.REGISTER_BACKEND_HAS_DEVICES:
        pytest.skip(f"torch {torch.__version__}: register_backend has no devices= (torch >= 2.2)")
    if "fakecl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("fakecl", create, devices=["hpu"])
    _init(store, "cpu:gloo,hpu:fakecl")
    try:
        on_hpu = hwdist.resolve(None, "hpu")
        return {
            "config": dist.get_backend_config(),
            "torch_object_device": _compat.object_coll_device(None) if _compat.object_coll_device else None,
            "no_tensor": hwdist.resolve().name,
            "on_hpu": (on_hpu.name, on_hpu.device_type, registry.is_generic(on_hpu)),
            "battery": _battery(),
            "meta": _error(hwdist.all_reduce, torch.zeros(2, device="meta")),
        }
    finally:
        _done()


def test_two_device_backends_calls_without_a_tensor_use_the_cpu_backend(ranks, tmp_path):
    results = ranks(_rank_two_backends, str(tmp_path / "store"))
    # hwdist.get_backend reports torch's string for a group made with one, as torch does
    _check_battery([res["battery"] for res in results], backend="gloo", reported="cpu:gloo,hpu:fakecl")
    for res in results:
        assert res["config"] == "cpu:gloo,hpu:fakecl"
        assert res["no_tensor"] == "gloo"  # torch's rule: the CPU backend when the group has one
        if res["torch_object_device"] is not None:
            assert res["torch_object_device"] == "cpu"
        # the other device's backend: a generic driver from torch's registry (hwdist has none for it)
        assert res["on_hpu"] == ("fakecl", "hpu", True)
        # bad input: a tensor on a device the group has no backend for, refused on every rank
        kind, msg = res["meta"]
        assert kind == "BackendError", res["meta"]
        assert "a tensor on device 'meta'" in msg and "'cpu:gloo,hpu:fakecl'" in msg
        assert "Fix: move the tensor to a device the group serves (cpu, hpu" in msg


# ------------------------------------------------------------------ 4. backends torch knows, hwdist does not


def _rank_generic(store: str) -> dict:
    importlib.import_module(HELPER)
    _init(store, "tonly")  # torch alone: hwdist has no driver named 'tonly'
    try:
        drv = hwdist.resolve()
        f64 = torch.tensor([1.5, -2.0], dtype=torch.float64) * (dist.get_rank() + 1)
        gathered = hwdist.all_gather(f64)  # float64 refused by the backend: moved as bytes
        send = _error(hwdist.send, torch.zeros(1), dst=1 - dist.get_rank())
        return {
            "driver": (drv.name, drv.device_type, registry.is_generic(drv)),
            "battery": _battery(int64=False),
            "gathered": [t.tolist() for t in gathered],
            "gather": [t.tolist() for t in (hwdist.gather(torch.tensor([dist.get_rank()]), dst=0) or [])],
            "int64_sum": _error(hwdist.all_reduce, torch.tensor([2**40])),
            "send": send,
        }
    finally:
        _done()


def test_a_backend_torch_knows_gets_a_generic_driver(ranks, tmp_path):
    results = ranks(_rank_generic, str(tmp_path / "store"))
    _check_battery([res["battery"] for res in results], backend="tonly")
    for rank, res in enumerate(results):
        assert res["driver"] == ("tonly", "cpu", True)
        assert res["gathered"] == [[1.5, -2.0], [3.0, -4.0]]
        assert res["gather"] == ([[0], [1]] if rank == 0 else [])  # emulated: the backend refuses gather
        for what in ("int64_sum", "send"):  # outside the generic table: refused, naming how to measure
            kind, msg = res[what]
            assert kind == "PlanError", res[what]
            assert "backend 'tonly'" in msg and "hwdist check --backend tonly --write-driver" in msg


@pytest.mark.slow  # a full measure run and a written driver's run
def test_measured_table_is_gloo_less_what_the_wrapper_refuses_and_the_written_driver_works(ranks, tmp_path):
    """``hwdist check --backend tonly`` measures the wrapped backend and writes its driver; the table
    equals gloo's own measured results with exactly the wrapper's refusals applied."""
    from hwdist.checks import measure as _measure

    path = tmp_path / "tonly_driver.py"
    cmd = [
        sys.executable, "-m", "hwdist", "check", "--backend", "tonly", "--import", HELPER,
        "--write-driver", str(path), "-n", "2", "--timeout", str(int(TIMEOUT)), "--json",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=6 * TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["generic"] and report["driver_class"] == "TonlyDriver"

    gloo = _measure.measure(2, "gloo", timeout=TIMEOUT)
    wrapped = _measure.Measurement("tonly", 2, gloo.info, dict(gloo.results))
    for op, dtype, rop in gloo.results:  # the wrapper's refusals (torch's gather_object gathers)
        if op in ("gather", "object_collectives") or dtype == "float16":
            wrapped.results[(op, dtype, rop)] = ("refused", "the wrapper")
    measured = {(r["op"], r["dtype"], r["reduce_op"]): r["status"] for r in report["results"]}
    assert measured == {key: status for key, (status, _) in wrapped.results.items()}
    assert report["table"] == _measure.derive(wrapped)
    table = report["table"]
    assert "gather" not in table["native_ops"] and "float16" not in table["dtypes"] + table["reduce_dtypes"]

    source = path.read_text()
    assert "class TonlyDriver(hwdist.Driver):" in source and f"vendor_module = {HELPER!r}" in source
    results = ranks(_rank_written_driver, str(path), str(tmp_path / "store"))
    _check_battery([res["battery"] for res in results], backend="tonly")
    for res in results:
        assert res["caps"] == {**table, "native_ops": table["native_ops"]}
        assert res["f16_mean"] == [1.0, 0.25]  # widened to float32 (the backend refuses float16)
        assert res["f16_moved"] == [[0.5], [1.5]]  # moved as bytes


def _rank_written_driver(path: str, store: str) -> dict:
    spec = importlib.util.spec_from_file_location("tonly_driver", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hwdist.register_backend("tonly", module.TonlyDriver)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        drv = hwdist.init_backend("tonly", rank=rank, world_size=world, init_method=f"file://{store}")
        caps = drv.capabilities()
        names = lambda key: [str(d).replace("torch.", "") for d in getattr(drv, key)]  # noqa: E731
        from hwdist.checks.measure import DTYPE_NAMES

        table = {
            "native_ops": sorted(drv.native_ops),
            "flat_ops": sorted(drv.flat_ops),
            "reduce_ops": sorted(drv.reduce_ops),
            "dtypes": [d for d in DTYPE_NAMES if d in names("dtypes")],
            "reduce_dtypes": [d for d in DTYPE_NAMES if d in names("reduce_dtypes")],
            "avg_dtypes": [d for d in DTYPE_NAMES if d in names("avg_dtypes")],
            "supports_async": caps["supports_async"],
            "native_object_collectives": caps["native_object_collectives"],
        }
        moved = hwdist.all_gather(torch.tensor([rank + 0.5], dtype=torch.float16))
        half = torch.tensor([1.0, 0.5 * rank], dtype=torch.float16)
        hwdist.all_reduce(half, "mean")
        return {
            "caps": table,
            "battery": _battery(),
            "f16_mean": half.tolist(),
            "f16_moved": [t.tolist() for t in moved],
        }
    finally:
        _done()
        hwdist.unregister_backend("tonly")


# ------------------------------------------------------------------ bad input


def _rank_creator_raises(store: str) -> dict:
    importlib.import_module(HELPER)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        got = _error(hwdist.init_backend, "tonly_raises", rank=rank, world_size=world, init_method=f"file://{store}")
        return {"error": got, "initialized": dist.is_initialized()}
    finally:
        _done()


def test_a_torch_only_backend_whose_creator_raises(ranks, tmp_path):
    for rank, res in enumerate(ranks(_rank_creator_raises, str(tmp_path / "store"))):
        kind, msg = res["error"]
        assert kind == "BackendError", res["error"]
        assert msg.startswith(f"backend 'tonly_raises' could not create its process group on rank {rank}:")
        assert "RuntimeError: tonly_raises: no device of this kind is visible" in msg
        assert "The group's backends: 'cpu:tonly_raises' (device(s) cpu)" in msg
        assert "Fix: check that the backend's package works" in msg
        assert "hwdist check --backend tonly_raises" in msg
        assert not res["initialized"]


def _rank_unparseable(store: str) -> dict:
    _init(store, "gloo")
    group = dist.new_group()
    world = dist.distributed_c10d._world
    kept = world.pg_backend_config[group]
    world.pg_backend_config[group] = "cpu=gloo"  # what a library patching torch's tables could leave
    try:
        return {
            "tensor": _error(hwdist.all_reduce, torch.ones(2), group=group),
            "objects": _error(hwdist.all_gather_object, {"x": 1}, group=group),
        }
    finally:
        world.pg_backend_config[group] = kept
        _done()


def test_a_group_whose_backend_config_cannot_be_read(ranks, tmp_path):
    for res in ranks(_rank_unparseable, str(tmp_path / "store")):
        for what, device in (("tensor", "data on device 'cpu'"), ("objects", "a call without a tensor")):
            kind, msg = res[what]
            assert kind == "BackendError", res[what]
            head = f"cannot tell which backend the process group of ranks [0, 1] uses for {device}"
            assert msg.startswith(head), msg
            assert "'cpu=gloo'" in msg and "Fix: create the group with a backend string torch accepts" in msg


# ------------------------------------------------------------------ 6. factories get torch's extended API


SEEN: list = []


def _recording_factory(store, rank, size, timeout, *, options=None):
    SEEN.append(None if options is None else (list(options.global_ranks_in_group), str(options.group_id)))
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class RankRecorder(hwdist.Driver):
    """A CPU driver whose factory records the options torch hands it."""

    device_type = "cpu"
    process_group_factory = staticmethod(_recording_factory)
    # its group is gloo's, which has no flat all_gather before torch 2.2
    flat_ops = frozenset({"all_gather"} if _compat.GLOO_HAS_ALL_GATHER_INTO_TENSOR else ())


def _rank_extended(store: str) -> dict:
    hwdist.register_backend("rankrec", RankRecorder, override=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    SEEN.clear()
    try:
        hwdist.init_backend("rankrec", rank=rank, world_size=world, init_method=f"file://{store}")
        sub = hwdist.new_group(ranks=[1])
        member = sub is not dist.GroupMember.NON_GROUP_MEMBER
        return {"seen": list(SEEN), "sub_member": member, "battery": _battery()}
    finally:
        _done()
        hwdist.unregister_backend("rankrec")


def test_a_factory_registered_through_hwdist_receives_the_groups_global_ranks(ranks, tmp_path):
    if not _compat.EXTENDED_BACKEND_API:
        pytest.skip(f"torch {torch.__version__} has no extended backend API")
    results = ranks(_rank_extended, str(tmp_path / "store"))
    _check_battery([res["battery"] for res in results], backend="rankrec")
    for rank, res in enumerate(results):
        default = res["seen"][0]
        assert default[0] == [0, 1], res["seen"]  # torch passes [] for the default group: hwdist fills it in
        if rank == 1:
            assert res["sub_member"] and len(res["seen"]) == 2 and res["seen"][1][0] == [1], res["seen"]
            assert res["seen"][1][1] != default[1]  # its own group id
        else:
            assert not res["sub_member"] and len(res["seen"]) == 1, res["seen"]


# ---------- a training program written the modern way ----------
# A real client: tests/programs/modern_client.py, a training program written the modern way, under torchrun.


PROGRAM = ROOT / "tests" / "programs" / "modern_client.py"
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


# The section's tests are slow (the fast lane, -m 'not slow', skips them) and need FSDP2.
_MODERN_CLIENT_SKIP = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


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


@pytest.mark.slow
@_MODERN_CLIENT_SKIP
def test_fsdp2_client_on_a_1d_mesh_of_2_ranks(tmp_path):
    hw, raw = _run_both(tmp_path, 2)
    _check(hw, raw, 2, [2])


@pytest.mark.slow
@_MODERN_CLIENT_SKIP
@pytest.mark.slow
def test_hsdp_client_on_a_2x2_mesh_of_4_ranks(tmp_path):
    hw, raw = _run_both(tmp_path, 4, "--mesh", "2x2")
    _check(hw, raw, 4, [2, 2])
