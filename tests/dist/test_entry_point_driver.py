"""A third-party driver package found through its ``hwdist.drivers`` entry point, end to end.

The package is real files in a temp dir (a module and a ``*.dist-info`` with
``entry_points.txt``, as ``pip install`` leaves them) put on ``sys.path``; the
spawned ranks inherit that path. No user code calls ``register_backend``.
Also covers ``hwdist check --backend`` on such a driver: rows its table
refuses are ``refused (as declared)``, and the command exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist import checks
from hwdist.testing import run_distributed

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = '''\
"""A tiny third-party hwdist driver package (written by tests/dist/test_entry_point_driver.py)."""
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
    return hwdist.get_backend(), type(drv).__module__, t.item(), [o["rank"] for o in objs], [len(o["pad"]) for o in objs]


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
    assert not [r for r in rows.values() if r.status == "FAIL"], [r for r in rows.values() if r.status == "FAIL"]


def test_check_command_exits_0_when_only_refusals_remain(plugin_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
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
