"""Custom backends on real ranks: every group resolves to the driver that created it.

Each rank function registers its driver itself (the ranks are fresh spawned
processes) and creates its process group through hwdist or plain torch.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist.drivers.base import Driver, Plan
from hwdist.testing import run_distributed
from hwdist.testing.pytest_plugin import capture_error
import json
import subprocess
import sys
from pathlib import Path
from hwdist import _compat, checks

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [pytest.mark.dist, pytest.mark.slow]

WORLD_SIZES = [1, 2, 3]


class MyGlooDriver(Driver):
    """The issue's driver: shares torch's gloo, declares a small table (no int64)."""

    device_type = "cpu"
    torch_backend = "gloo"
    dtypes = frozenset({torch.float32, torch.int32})
    reduce_ops = frozenset({"sum", "max"})


class TourDriver(Driver):
    """The README tour's driver: CPU, no factory, fp32 and int32 only."""

    device_type = "cpu"
    dtypes = frozenset({torch.float32, torch.int32})
    reduce_ops = frozenset({"sum", "max"})


class FloatOnlyDriver(Driver):
    """Moves no integer dtype at all: object collectives cannot be carried."""

    device_type = "cpu"
    dtypes = frozenset({torch.float32})
    reduce_ops = frozenset({"sum"})


class AcceleratorWithoutFactory(Driver):
    """An accelerator torch does not know, with no process_group_factory: cannot start."""

    device_type = "fakeaccel"


class BrokenPlanDriver(Driver):
    """plan raises on int16 and returns a malformed plan on int8."""

    device_type = "cpu"

    def plan(self, op, dtype, reduce_op=None):  # noqa: D102
        if dtype == torch.int16:
            raise RuntimeError("driver bug")
        if dtype == torch.int8:
            return Plan(op, "teleport", dtype, dtype)
        return super().plan(op, dtype, reduce_op)


def _init(name: str, store: str) -> None:
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    hwdist.init_backend(name, rank=rank, world_size=ws, init_method=f"file://{store}", timeout=30)


def _int64_sum(group=None):
    """The int64 all_reduce of the issue: [2**40 + rank] summed, or the error raised."""
    t = torch.tensor([2**40 + torch_dist.get_rank()], dtype=torch.int64)
    err = capture_error(hwdist.all_reduce, t, "sum", group)
    return err if err is not None else t.item()


# ------------------------------------------------------------------ 1. a group knows its driver


def _rank_custom_default_beside_plain_gloo(store):
    hwdist.register_backend("mygloo", MyGlooDriver)
    _init("mygloo", store)
    plain = torch_dist.new_group()  # plain torch: resolves by torch's name
    builtin = hwdist.new_group(backend="gloo")  # hwdist, the built-in gloo driver
    same = hwdist.new_group()  # hwdist, the default group's driver
    ws = torch_dist.get_world_size()
    hwdist.init_local_group(node_rank=torch_dist.get_rank(), num_gpus_per_node=1)  # one group per rank
    out = {
        "default": (hwdist.get_backend(), hwdist.resolve().name, torch_dist.get_backend()),
        "default_int64": _int64_sum(),
        "plain": (hwdist.get_backend(plain), hwdist.resolve(plain).name, _int64_sum(plain)),
        "builtin": (hwdist.get_backend(builtin), hwdist.resolve(builtin).name, _int64_sum(builtin)),
        "same": (hwdist.get_backend(same), hwdist.resolve(same).name, _int64_sum(same)),
        "local": (hwdist.resolve(hwdist.get_local_group()).name, _int64_sum(hwdist.get_local_group())),
        "ws": ws,
    }
    hwdist.destroy()
    return out


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_custom_driver_on_gloo_is_not_shadowed_by_gloo(world_size, tmp_path):
    results = run_distributed(
        _rank_custom_default_beside_plain_gloo, world_size, None, str(tmp_path / "s"), timeout=90
    )
    total = sum(2**40 + r for r in range(world_size))
    for res in results:
        assert res["default"] == ("mygloo", "mygloo", "gloo")
        # the custom table is consulted: int64 is refused on every rank, not passed through
        kind, msg = res["default_int64"]
        assert kind == "PlanError" and "backend 'mygloo'" in msg and "int64" in msg
        assert res["plain"] == ("gloo", "gloo", total)
        assert res["builtin"] == ("gloo", "gloo", total)
        assert res["same"][:2] == ("mygloo", "mygloo") and res["same"][2][0] == "PlanError"
        assert res["local"][0] == "mygloo" and res["local"][1][0] == "PlanError"


def _rank_plain_gloo_default_beside_custom(store):
    hwdist.register_backend("mygloo", MyGlooDriver)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ws)
    mine = hwdist.new_group(backend="mygloo")
    out = {
        "default": (hwdist.get_backend(), hwdist.resolve().name, type(hwdist.resolve()).__name__),
        "default_int64": _int64_sum(),
        "mine": (hwdist.get_backend(mine), hwdist.resolve(mine).name, _int64_sum(mine)),
    }
    t = torch.tensor([float(rank + 1)])
    hwdist.all_reduce(t, "max", mine)
    out["mine_max"] = t.item()
    hwdist.destroy()
    return out


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_plain_gloo_is_not_shadowed_by_custom_driver_on_gloo(world_size, tmp_path):
    results = run_distributed(
        _rank_plain_gloo_default_beside_custom, world_size, None, str(tmp_path / "s"), timeout=90
    )
    total = sum(2**40 + r for r in range(world_size))
    for res in results:
        assert res["default"] == ("gloo", "gloo", "GlooDriver")
        assert res["default_int64"] == total
        assert res["mine"][:2] == ("mygloo", "mygloo")
        assert res["mine"][2][0] == "PlanError" and "backend 'mygloo'" in res["mine"][2][1]
        assert res["mine_max"] == float(world_size)


# ------------------------------------------------------------------ 2. start-up rule


def _rank_cpu_driver_without_factory(store):
    hwdist.register_backend("tourcl", TourDriver)
    _init("tourcl", store)
    t = torch.tensor([torch_dist.get_rank() + 1.0])
    hwdist.all_reduce(t, op="mean")
    out = (hwdist.get_backend(), torch_dist.get_backend(), hwdist.resolve().name, t.item())
    hwdist.destroy()
    return out


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_cpu_driver_without_factory_runs_over_gloo_under_its_own_name(world_size, tmp_path):
    results = run_distributed(
        _rank_cpu_driver_without_factory, world_size, None, str(tmp_path / "s"), timeout=90
    )
    mean = sum(range(1, world_size + 1)) / world_size
    assert results == [("tourcl", "tourcl", "tourcl", mean)] * world_size


def _rank_all_to_all_over_gloo(store):
    hwdist.register_backend("tourcl", TourDriver)
    _init("tourcl", store)
    rank, ws = torch_dist.get_rank(), torch_dist.get_world_size()
    even = [torch.empty(1) for _ in range(ws)]
    hwdist.all_to_all(even, [torch.tensor([float(10 * rank + j)]) for j in range(ws)])
    uneven = [torch.empty(rank + 1) for _ in range(ws)]  # rank j's piece for this rank has rank + 1 items
    hwdist.all_to_all(uneven, [torch.full((j + 1,), float(rank)) for j in range(ws)])
    caps = hwdist.resolve().caps
    hwdist.destroy()
    return [t.tolist() for t in even], [t.tolist() for t in uneven], "all_to_all" in caps.flat_ops


@pytest.mark.parametrize("world_size", [2, 3])
def test_cpu_driver_without_factory_runs_all_to_all_on_every_torch(world_size, tmp_path):
    """The default table declares the list all_to_all, which gloo lacks before torch 2.12: the driver's
    group then takes all_to_all_single (one collective) instead of failing in torch."""
    results = run_distributed(_rank_all_to_all_over_gloo, world_size, None, str(tmp_path / "s"), timeout=90)
    for r, (even, uneven, flat) in enumerate(results):
        assert even == [[float(10 * q + r)] for q in range(world_size)]
        assert uneven == [[float(q)] * (r + 1) for q in range(world_size)]
        assert flat == (not _compat.GLOO_HAS_ALL_TO_ALL_LIST)


def _rank_unstartable(tmpdir, name, driver, launcher_env):
    hwdist.register_backend(name, driver)
    rank = int(os.environ["RANK"])
    os.environ.update(launcher_env)
    start = time.monotonic()
    # A store no other rank shares: a rendezvous would wait the whole timeout.
    err = capture_error(
        hwdist.init_dist, "pytorch", name, timeout=60, init_method=f"file://{tmpdir}/alone-{rank}"
    )
    return err, time.monotonic() - start, hwdist.is_distributed()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_unstartable_driver_raises_on_every_rank_before_rendezvous(world_size, tmp_path):
    results = run_distributed(
        _rank_unstartable, world_size, None, str(tmp_path), "accl", AcceleratorWithoutFactory, {}, timeout=60
    )
    for (kind, msg), seconds, distributed in results:
        assert kind == "BackendError" and not distributed
        assert msg.startswith("backend 'accl' cannot start: torch.distributed has no backend 'accl'")
        assert "device_type 'fakeaccel'" in msg
        assert 'HINT: set torch_backend = "<an existing backend>" (torch has: ' in msg
        assert msg.endswith("or give process_group_factory")
        assert seconds < 10


class ReservedMpiDriver(Driver):
    """Names torch's own MPI backend as its torch name."""

    device_type = "cpu"
    torch_backend = "mpi"


@pytest.mark.skipif(torch_dist.is_mpi_available(), reason="this torch has MPI built in: 'mpi' can start")
@pytest.mark.parametrize("world_size", [1, 3])
def test_reserved_torch_name_torch_cannot_create_raises_before_rendezvous(world_size, tmp_path):
    results = run_distributed(
        _rank_unstartable, world_size, None, str(tmp_path), "mympi", ReservedMpiDriver, {}, timeout=60
    )
    for (kind, msg), seconds, _ in results:
        assert kind == "BackendError"
        assert "torch reserves 'mpi' for its own backend" in msg and "is_mpi_available() is False" in msg
        assert "HINT: set torch_backend" in msg
        assert seconds < 10


# ------------------------------------------------------------------ 3. objects through any integer dtype


def _rank_objects(store, name, driver):
    hwdist.register_backend(name, driver)
    _init(name, store)
    rank, ws = torch_dist.get_rank(), torch_dist.get_world_size()
    big = bytes([rank]) * (2000 + 3 * rank + 1)  # beyond the inline record, odd lengths
    out = {}
    out["all_gather_object"] = capture_error(
        hwdist.all_gather_object, {"rank": rank}
    ) or hwdist.all_gather_object({"rank": rank, "blob": big})
    if out["all_gather_object"][0] != "PlanError":
        out["gather_object"] = hwdist.gather_object(big, dst=ws - 1)
        out["broadcast_object"] = hwdist.broadcast_object(big + b"x", src=ws - 1)
        box = [None]
        hwdist.scatter_object_list(
            box, [bytes([q]) * (1001 + q) for q in range(ws)] if rank == 0 else None, src=0
        )
        out["scatter"] = box[0]
        out["collect"] = hwdist.collect_results([{"i": rank}], ws)
    t = torch.tensor([1.0])
    hwdist.all_reduce(t)  # the group still works after a refusal
    out["after"] = t.item()
    hwdist.destroy()
    return out


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_object_collectives_travel_in_the_smallest_integer_dtype(world_size, tmp_path):
    results = run_distributed(
        _rank_objects, world_size, None, str(tmp_path / "s"), "tourcl", TourDriver, timeout=90
    )
    blobs = [bytes([q]) * (2000 + 3 * q + 1) for q in range(world_size)]
    for rank, res in enumerate(results):
        assert res["all_gather_object"] == [{"rank": q, "blob": blobs[q]} for q in range(world_size)]
        assert res["gather_object"] == (blobs if rank == world_size - 1 else None)
        assert res["broadcast_object"] == blobs[-1] + b"x"
        assert res["scatter"] == bytes([rank]) * (1001 + rank)
        assert res["collect"] == ([{"i": q} for q in range(world_size)] if rank == 0 else None)
        assert res["after"] == float(world_size)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_driver_moving_no_integer_dtype_refuses_objects_clearly(world_size, tmp_path):
    results = run_distributed(
        _rank_objects, world_size, None, str(tmp_path / "s"), "floatcl", FloatOnlyDriver, timeout=90
    )
    if world_size == 1:  # a group of one moves no bytes: [data], as documented (and as mmengine does)
        assert results[0]["all_gather_object"] == [{"rank": 0, "blob": bytes([0]) * 2001}]
        return
    for res in results:
        kind, msg = res["all_gather_object"]
        assert kind == "PlanError"
        assert msg.startswith(
            "backend 'floatcl' cannot carry bytes for 'all_gather' (object collectives need it)"
        )
        assert "uint8, int8, int16, int32, int64" in msg and "HINT: add one integer dtype" in msg
        assert res["after"] == float(world_size)


# ------------------------------------------------------------------ bad input: a broken plan


def _rank_broken_plan(store):
    hwdist.register_backend("brokenplan", BrokenPlanDriver)
    _init("brokenplan", store)
    out = {
        "raises": capture_error(hwdist.all_reduce, torch.ones(2, dtype=torch.int16)),
        "malformed": capture_error(hwdist.broadcast, torch.ones(2, dtype=torch.int8), 0),
    }
    t = torch.tensor([2.0])
    hwdist.all_reduce(t)  # nothing was half-sent: the group still works
    out["after"] = t.item()
    hwdist.destroy()
    return out


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_broken_plan_names_the_driver_on_every_rank(world_size, tmp_path):
    results = run_distributed(_rank_broken_plan, world_size, None, str(tmp_path / "s"), timeout=90)
    for res in results:
        kind, msg = res["raises"]
        assert kind == "BackendError"
        assert msg.startswith(
            "driver 'brokenplan' (BrokenPlanDriver): plan('all_reduce', torch.int16, 'sum') raised"
            " RuntimeError: driver bug"
        )
        kind, msg = res["malformed"]
        assert kind == "BackendError"
        assert (
            "driver 'brokenplan' (BrokenPlanDriver): plan('broadcast', torch.int8, None) returned a"
            " malformed plan"
            in msg
        )
        assert "native_op 'teleport' is not an op" in msg
        assert res["after"] == 2.0 * world_size


# ------------------------------------------------------------------ verification mode through a custom driver


def _rank_verification_through_tour_driver(store):
    hwdist.register_backend("tourcl", TourDriver)
    _init("tourcl", store)
    rank = torch_dist.get_rank()
    with hwdist.verification():
        ok = torch.ones(2)
        hwdist.all_reduce(ok)  # same call everywhere: passes
        bad = torch.ones(2 + rank)  # a shape that differs on every rank but 0
        err = capture_error(hwdist.all_reduce, bad)
    hwdist.destroy()
    return ok.tolist(), err


@pytest.mark.parametrize("world_size", [2, 3])
def test_verification_mode_works_through_a_driver_without_uint8(world_size, tmp_path):
    """The tour's table (fp32, int32) moves no uint8: the mode's own byte exchange rides in int32."""
    results = run_distributed(
        _rank_verification_through_tour_driver, world_size, None, str(tmp_path / "s"), timeout=90
    )
    for ok, err in results:
        assert ok == [float(world_size)] * 2
        assert err is not None and err[0] == "CollectiveMismatch", err
        assert "float32[2]" in err[1] and "float32[3]" in err[1]


# ---------- a driver package found through its entry point ----------
# A third-party driver package found through its ``hwdist.drivers`` entry point, end to end.

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = '''\
"""A tiny third-party hwdist driver package (written by tests/drivers/test_custom_backends.py)."""
import torch

from hwdist import Driver


class EpclDriver(Driver):
    """CPU, no factory: the README tour's table."""

    device_type = "cpu"
    dtypes = frozenset({torch.float32, torch.int32})
    reduce_ops = frozenset({"sum", "max"})


class EpfloatDriver(Driver):
    """CPU, float32 only: no integer dtype to carry objects in."""

    device_type = "cpu"
    dtypes = frozenset({torch.float32})
    reduce_ops = frozenset({"sum", "max"})
'''


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """The installed package's files on sys.path (of this process and of every rank it spawns)."""
    (tmp_path / "hwdist_ep_pkg").mkdir()
    (tmp_path / "hwdist_ep_pkg" / "__init__.py").write_text(PACKAGE)
    info = tmp_path / "hwdist_ep_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hwdist-ep-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[hwdist.drivers]\nepcl = hwdist_ep_pkg:EpclDriver\nepfloat = hwdist_ep_pkg:EpfloatDriver\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _rank_collectives():
    rank = torch_dist.get_rank()
    t = torch.tensor([rank + 1.0])
    hwdist.all_reduce(t, op="mean")
    objs = hwdist.all_gather_object({"rank": rank, "pad": "x" * (1500 + rank)})
    drv = hwdist.resolve()
    return (
        hwdist.get_backend(),
        type(drv).__module__,
        t.item(),
        [o["rank"] for o in objs],
        [len(o["pad"]) for o in objs],
    )


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_entry_point_driver_runs_collectives_on_spawned_ranks(plugin_dir, world_size):
    results = run_distributed(_rank_collectives, world_size, "epcl", timeout=90)
    mean = sum(range(1, world_size + 1)) / world_size
    want = ("epcl", "hwdist_ep_pkg", mean, list(range(world_size)), [1500 + q for q in range(world_size)])
    assert results == [want] * world_size


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_check_marks_table_refusals_and_passes_the_rest(plugin_dir, world_size):
    only = ["all_reduce", "all_gather", "all_gather_object", "broadcast_object"]
    rows = {(r.name, r.dtype): r for r in checks.run_checks(world_size, "epcl", only=only, timeout=90)}
    # int64 and bfloat16 reductions: no lossless plan with fp32/int32 only
    assert rows[("all_reduce", "int64")].status == checks.REFUSED
    assert "refused as declared: sum product min max band bor bxor" in rows[("all_reduce", "int64")].detail
    assert rows[("all_reduce", "float32")].status == "pass"  # sum max pass, the rest refused
    assert "refused as declared: product min" in rows[("all_reduce", "float32")].detail
    # objects travel in int32, padded
    assert rows[("all_gather_object", "-")].status == "pass"
    assert rows[("broadcast_object", "-")].status == "pass"
    assert not [r for r in rows.values() if r.status == "FAIL"], [
        r for r in rows.values() if r.status == "FAIL"
    ]


def test_check_command_exits_0_when_only_refusals_remain(plugin_dir):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), str(ROOT)])
    cmd = [sys.executable, "-m", "hwdist", "check", "--backend", "epfloat", "-n", "2", "--json",
           "--only", "all_reduce,all_gather_object,broadcast_object_list,collect_results"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    rows = {(r["name"], r["dtype"]): r for r in report["results"]}
    for name in ("all_gather_object", "broadcast_object_list", "collect_results"):
        assert rows[(name, "-")]["status"] == checks.REFUSED
        assert "cannot carry bytes for" in rows[(name, "-")]["detail"]
    assert rows[("all_reduce", "float32")]["status"] == "pass"
    assert rows[("all_reduce", "int32")]["status"] == checks.REFUSED
    assert report["failed"] == 0 and report["refused"] >= 4
