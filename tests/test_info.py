"""Dist-info API on real ranks, and a custom backend registered in every rank."""

from __future__ import annotations

import collections
import os
import tempfile

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist.drivers.base import Driver
from hwdist.testing import run_distributed
from hwdist.testing.pytest_plugin import one_backend, world_sizes

pytestmark = pytest.mark.dist

Pair = collections.namedtuple("Pair", "a b")


def _info_checks():
    rank, ws = hwdist.get_dist_info()
    called = []

    @hwdist.master_only
    def only_main():
        called.append(rank)
        return "main"

    out = only_main()
    hwdist.barrier()
    data = {"x": torch.ones(2), "y": [torch.zeros(1), Pair(torch.ones(1), torch.ones(1))]}
    cast = hwdist.cast_data_device(data, "cpu")
    return {
        "is_distributed": hwdist.is_distributed(),
        "rank": (rank, hwdist.get_rank(), torch_dist.get_rank()),
        "ws": (ws, hwdist.get_world_size(), torch_dist.get_world_size()),
        "main": hwdist.is_main_process(),
        "only_main": (out, called),
        "backend": hwdist.get_backend(),
        "driver": hwdist.resolve().name,
        "comm_device": str(hwdist.get_comm_device()),
        "data_device": str(hwdist.get_data_device(data)),
        "cast_types": (type(cast).__name__, type(cast["y"][1]).__name__),
        "default_group_is_world": hwdist.get_default_group() is torch_dist.GroupMember.WORLD,
        "local": (hwdist.get_local_rank(), hwdist.get_local_size()),
    }


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", world_sizes())
def test_dist_info_on_real_ranks(dist, world_size, backend):
    results = dist(_info_checks, world_size, backend)
    for rank, res in enumerate(results):
        assert res["is_distributed"] is True
        assert res["rank"] == (rank, rank, rank)
        assert res["ws"] == (world_size,) * 3
        assert res["main"] is (rank == 0)
        assert res["only_main"] == (("main", [0]) if rank == 0 else (None, []))
        assert res["backend"] == backend
        assert res["driver"] == backend
        assert res["comm_device"].split(":")[0] == hwdist.get_driver(backend).device_type
        assert res["data_device"] == "cpu"
        assert res["cast_types"] == ("dict", "Pair")
        assert res["default_group_is_world"]
        # the harness sets LOCAL_RANK / LOCAL_WORLD_SIZE like torchrun
        assert res["local"] == (rank, world_size)


class ToyCclDriver(Driver):
    """A backend torch does not know, made of gloo, registered by the user."""

    device_type = "cpu"
    description = "toy custom backend"

    @staticmethod
    def process_group_factory(store, rank, size, timeout):
        """Create the toy process group (a plain gloo group underneath)."""
        return torch_dist.ProcessGroupGloo(store, rank, size, timeout)


def _custom_backend_rank(store_path):
    hwdist.register_backend("toyccl", ToyCclDriver)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    drv = hwdist.launch.init_backend(
        "toyccl", rank=rank, world_size=ws, init_method=f"file://{store_path}", timeout=30
    )
    t = torch.tensor([float(rank + 1)])
    torch_dist.all_reduce(t)
    out = (hwdist.get_backend(), hwdist.resolve().name, type(drv).__name__, t.item())
    hwdist.launch.destroy()
    hwdist.launch.destroy()  # safe twice
    return out + (hwdist.is_distributed(),)


def test_custom_backend_works_in_every_rank():
    with tempfile.TemporaryDirectory() as d:
        results = run_distributed(_custom_backend_rank, 3, None, os.path.join(d, "store"))
    assert results == [("toyccl", "toyccl", "ToyCclDriver", 6.0, False)] * 3


def _unavailable_backend_rank():
    try:
        hwdist.launch.init_backend("hccl", rank=0, world_size=1, init_method="file:///nonexistent")
    except hwdist.BackendError as exc:
        return str(exc)
    return "no error"


def test_unavailable_backend_is_refused_before_any_rendezvous():
    (msg,) = run_distributed(_unavailable_backend_rank, 1, None, timeout=60)
    assert msg.startswith(
        "backend 'hccl' is not available here: the Python package 'torch_npu' is not installed"
    )
    assert ". Available: " in msg and "gloo" in msg.split(". Available: ")[1]


def test_not_distributed_defaults():
    assert hwdist.is_distributed() is False
    assert hwdist.get_dist_info() == (0, 1)
    assert hwdist.get_backend() is None
    assert hwdist.get_default_group() is None
    assert hwdist.get_local_group() is None
    assert hwdist.is_main_process() is True
    hwdist.barrier()  # no-op
    assert hwdist.get_comm_device() == torch.device("cpu")
    assert hwdist.master_only(lambda: 5)() == 5


def test_local_rank_from_launcher_env(monkeypatch):
    for var in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert (hwdist.get_local_rank(), hwdist.get_local_size()) == (0, 1)
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert hwdist.get_local_rank() == 3
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK must be an integer, got 'x'"):
        hwdist.get_local_rank()


def test_data_device_and_cast_errors():
    with pytest.raises(ValueError, match="data should not be empty"):
        hwdist.get_data_device([])
    with pytest.raises(TypeError, match="data should be a Tensor, sequence of tensor or dict, but got int"):
        hwdist.get_data_device([torch.ones(1), 3])
    with pytest.raises(TypeError, match="out should be the same type as data"):
        hwdist.cast_data_device(torch.ones(1), "cpu", out=[torch.ones(1)])
    out = [torch.zeros(2), torch.zeros(1)]
    res = hwdist.cast_data_device([torch.ones(2), torch.full((1,), 7.0)], "cpu", out=out)
    assert res is out and out[0].tolist() == [1.0, 1.0] and out[1].tolist() == [7.0]
    with pytest.raises(ValueError, match="same length"):
        hwdist.cast_data_device([torch.ones(1)], "cpu", out=[torch.ones(1), torch.ones(1)])
