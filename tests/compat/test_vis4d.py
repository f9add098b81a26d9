"""``hwdist.compat.vis4d``: ``vis4d.common.distributed``'s documented behaviour, on real ranks.

Written from vis4d's API documentation and docstrings: ``broadcast(obj, src)``
returns the source's object; ``all_reduce_dict`` returns a new dict (the input
itself with one process), keys in rank 0's order, ``OrderedDict`` kept;
``get_rank``/``get_world_size`` read the launcher environment before the group
exists; ``rank_zero_only`` returns None off rank 0; ``is_module_wrapper``
searches child modules; ``obj2tensor`` gives the pickle bytes as ``uint8``;
``all_gather_object_*`` return the list on rank 0 only by default. vis4d is not
installed here: expected values come from rank numbers and from ``pickle``.
"""

from __future__ import annotations

import os
import pickle
import time
from collections import OrderedDict

import pytest
import torch

import hwdist
import hwdist.compat.vis4d as dist
from hwdist.testing.pytest_plugin import one_backend, world_sizes

pytestmark = pytest.mark.dist


@pytest.fixture
def dist_pool(rank_pools):
    """The plugin's ``dist`` fixture under another name (``dist`` is the module under test here)."""
    return rank_pools.run


def _err(fn, *args, **kwargs):
    start = time.monotonic()
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test compares type and text
        return type(exc).__name__, str(exc), time.monotonic() - start, exc.__class__.__mro__
    return None


def rank_vis4d_ops(tmp: str) -> dict:
    r, ws = dist.get_rank(), dist.get_world_size()
    out: dict = {"ids": (r, ws, dist.get_local_rank(), dist.distributed_available())}
    out["sync"] = dist.synchronize()
    out["broadcast"] = (dist.broadcast({"from": r}, src=ws - 1), dist.broadcast([r]))
    t = dist.serialize_to_tensor({"r": r})
    out["serialize"] = (t.dtype, t.dim(), t.device == hwdist.get_comm_device(), dist.tensor2obj(t))
    t = dist.obj2tensor(("x", r), device=torch.device("cpu"))
    out["obj2tensor"] = (t.dtype, t.device.type, bytes(t.numpy().tobytes()), dist.tensor2obj(t))
    out["obj2tensor_default"] = dist.obj2tensor(1).device == hwdist.get_comm_device()
    sizes, padded = dist.pad_to_largest_tensor(torch.full((r + 1,), 5, dtype=torch.uint8))
    out["pad"] = (sizes, padded.tolist())
    out["gpu_gather"] = (
        dist.all_gather_object_gpu({"r": r}),
        dist.all_gather_object_gpu(r * 10, rank_zero_return_only=False),
    )
    folder = dist.create_tmpdir(r)
    out["tmpdir"] = (folder, os.path.isdir(folder))
    given = os.path.join(tmp, "given")
    out["tmpdir_given"] = dist.create_tmpdir(r, given) == given and os.path.isdir(given)
    dist.synchronize()
    gathered = dist.all_gather_object_cpu(["cpu", r], tmpdir=os.path.join(tmp, f"cpu{ws}"))
    both = dist.all_gather_object_cpu({"r": r}, rank_zero_return_only=False, use_system_tmp=True)
    dist.synchronize()
    out["cpu_gather"] = (gathered, both, os.path.exists(os.path.join(tmp, f"cpu{ws}")))
    x = torch.tensor([float(r), 1.0], requires_grad=True)
    mean = dist.reduce_mean(x)
    mean.sum().backward()
    out["reduce_mean"] = (mean.detach().tolist(), mean.grad_fn is not None, x.grad.tolist(), x.tolist())
    keys = ["b", "a"] if r % 2 else ["a", "b"]  # plain dicts: rank 0's key order wins
    data = {k: (torch.tensor(r + 1.0) if k == "a" else torch.tensor([r, 2 * r])) for k in keys}
    summed = dist.all_reduce_dict(data)
    out["dict_sum"] = (list(summed), {k: v.tolist() for k, v in summed.items()}, summed["b"].dtype)
    out["dict_input_kept"] = (summed is not data, data["a"].item(), data["b"].tolist())
    od = OrderedDict([("z", torch.tensor([r], dtype=torch.int32)), ("y", torch.tensor(2.0 * r))])
    meaned = dist.all_reduce_dict(od, reduce_op="mean")
    out["dict_mean"] = (type(meaned).__name__, list(meaned), {k: v.tolist() for k, v in meaned.items()})
    ints = dist.all_reduce_dict({"n": torch.tensor([r + 1], dtype=torch.int32)}, to_float=False)
    out["dict_int"] = (ints["n"].dtype, ints["n"].tolist())

    @dist.rank_zero_only
    def tag(x):
        return f"tag-{x}"

    out["rank_zero_only"] = tag(r)
    return out


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", world_sizes())
def test_vis4d_documented_behaviour(dist_pool, world_size, backend, tmp_path):
    ws = world_size
    results = dist_pool(rank_vis4d_ops, world_size, backend, str(tmp_path))
    folders = {res["tmpdir"][0] for res in results}
    assert len(folders) == 1  # the same directory everywhere
    for r, res in enumerate(results):
        assert res["ids"] == (r, ws, r, True)
        assert res["sync"] is None
        assert res["broadcast"] == ({"from": ws - 1}, [0])
        assert res["serialize"] == (torch.uint8, 1, True, {"r": r})
        assert res["obj2tensor"] == (torch.uint8, "cpu", pickle.dumps(("x", r)), ("x", r))
        assert res["obj2tensor_default"] is True
        assert res["pad"] == (list(range(1, ws + 1)), [5] * (r + 1) + [0] * (ws - r - 1))
        everyone = [{"r": q} for q in range(ws)]
        assert res["gpu_gather"] == (
            everyone if r == 0 or ws == 1 else None,
            [q * 10 for q in range(ws)],
        )
        assert res["tmpdir"][1] and res["tmpdir_given"]
        gathered, both, left = res["cpu_gather"]
        assert gathered == ([["cpu", q] for q in range(ws)] if r == 0 or ws == 1 else None)
        assert both == everyone
        assert (
            left is False
        )  # rank 0 removes the directory it gathered through (one process: never made)
        mean, has_graph, grad, kept = res["reduce_mean"]
        assert mean == pytest.approx([sum(range(ws)) / ws, 1.0])
        assert has_graph and grad == pytest.approx([1.0 / ws, 1.0 / ws]) and kept == [float(r), 1.0]
        keys, values, bdtype = res["dict_sum"]
        assert keys == ["a", "b"]  # rank 0's order
        assert values == {
            "a": ws * (ws + 1) / 2,
            "b": [float(sum(range(ws))), float(2 * sum(range(ws)))],
        }
        assert bdtype == (torch.int64 if ws == 1 else torch.float32)  # to_float: float32 when reduced
        assert res["dict_input_kept"][0] is (ws > 1)  # one process: the input itself
        assert res["dict_input_kept"][1:] == (r + 1.0, [r, 2 * r])
        assert res["dict_mean"] == (
            "OrderedDict",
            ["z", "y"],
            {"z": [pytest.approx(sum(range(ws)) / ws)], "y": pytest.approx(2.0 * sum(range(ws)) / ws)},
        )
        assert res["dict_int"] == (torch.int32, [ws * (ws + 1) // 2])
        assert res["rank_zero_only"] == ("tag-0" if r == 0 else None)


def rank_vis4d_errors(case: str, tmp: str) -> dict:
    r, ws = dist.get_rank(), dist.get_world_size()
    last = r == ws - 1
    calls = {
        "missing_key": lambda: dist.all_reduce_dict(
            {"a": torch.tensor(1.0)} if last else {"a": torch.tensor(1.0), "b": torch.tensor(2.0)}
        ),
        "shape": lambda: dist.all_reduce_dict({"a": torch.zeros(2 if last else 3)}),
        "op": lambda: dist.all_reduce_dict({"a": torch.zeros(1)}, reduce_op="max" if last else "sum"),
        "tmpdir_some": lambda: dist.create_tmpdir(r, tmp if last else None),
    }
    return {"err": _err(calls[case])}


VIS4D_ERRORS = {
    "missing_key": (KeyError, "lacks key(s) ['b']"),
    "shape": (ValueError, "differ in shape or dtype"),
    "op": (ValueError, "reduce_op must be 'sum' or 'mean', got 'max'"),
    "tmpdir_some": (ValueError, "some ranks passed tmpdir"),
}


@pytest.mark.parametrize("case", sorted(VIS4D_ERRORS))
@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_vis4d_bad_input_raises_on_every_rank(dist_pool, world_size, backend, case, tmp_path):
    kind, text = VIS4D_ERRORS[case]
    for r, res in enumerate(dist_pool(rank_vis4d_errors, world_size, backend, case, str(tmp_path))):
        assert res["err"] is not None, f"rank {r} did not raise"
        name, message, took, mro = res["err"]
        assert text in message, (r, message)
        assert took < 10
        if r == world_size - 1 or case in ("shape", "tmpdir_some"):
            assert kind in mro, (r, name)  # the bad rank (or every rank) raises vis4d's type
        else:
            assert hwdist.CollectiveArgumentError in mro, (r, name)


# --------------------------------------------------------------- before or without a process group
@pytest.mark.parametrize(
    "env, rank, size, local",
    [
        ({}, 0, 1, 0),
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, 3, 4, 1),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2"}, 5, 6, 2),
        # an interactive Slurm shell: neither SLURM_NTASKS nor SLURM_PROCID describe this process
        (
            {"SLURM_JOB_NAME": "bash", "SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2"},
            2,
            1,
            2,
        ),
        ({"LOCAL_RANK": "2"}, 2, 1, 2),
    ],
)
def test_vis4d_ranks_from_the_environment_before_init(monkeypatch, env, rank, size, local):
    for var in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_JOB_NAME",
    ):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert not hwdist.is_distributed()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (rank, size, local)
    calls = []

    @dist.rank_zero_only
    def f(x):
        calls.append(x)
        return x

    assert f(7) == (7 if rank == 0 else None)
    assert calls == ([7] if rank == 0 else [])


def test_vis4d_without_a_process_group(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    assert dist.distributed_available() is False
    assert dist.synchronize() is None
    obj = {"a": [1]}
    assert dist.broadcast(obj) is obj
    t = torch.ones(2, requires_grad=True)
    assert dist.reduce_mean(t) is t
    d = {"a": torch.ones(1)}
    assert dist.all_reduce_dict(d) is d
    assert dist.all_gather_object_cpu(obj) == [obj] and dist.all_gather_object_gpu(obj) == [obj]
    assert dist.pad_to_largest_tensor(torch.ones(3))[0] == [3]
    err = _err(dist.serialize_to_tensor, obj)
    assert err is not None and AssertionError in err[3]
    with pytest.raises(ValueError, match="reduce_op must be 'sum' or 'mean'"):
        dist.all_reduce_dict(d, reduce_op="avg")


def test_vis4d_module_wrapper_is_recursive():
    inner = torch.nn.DataParallel(torch.nn.Linear(1, 1))
    assert dist.is_module_wrapper(inner)
    assert dist.is_module_wrapper(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(inner)))
    assert not dist.is_module_wrapper(torch.nn.Sequential(torch.nn.Linear(1, 1)))


def test_vis4d_signatures_match_the_documentation():
    import inspect

    documented = {
        "all_gather_object_cpu": "(data, tmpdir=None, rank_zero_return_only=True, use_system_tmp=False)",
        "all_gather_object_gpu": "(data, rank_zero_return_only=True)",
        "all_reduce_dict": "(py_dict, reduce_op='sum', to_float=True)",
        "broadcast": "(obj, src=0)",
        "create_tmpdir": "(rank, tmpdir=None, use_system_tmp=True)",
        "distributed_available": "()",
        "get_local_rank": "()",
        "get_rank": "()",
        "get_world_size": "()",
        "is_module_wrapper": "(module)",
        "obj2tensor": "(pyobj, device=device(type='cuda'))",
        "pad_to_largest_tensor": "(tensor)",
        "rank_zero_only": "(func)",
        "reduce_mean": "(tensor)",
        "serialize_to_tensor": "(data)",
        "synchronize": "()",
        "tensor2obj": "(tensor)",
    }
    assert sorted(dist.__all__) == sorted(documented)
    for name, sig in documented.items():
        params = inspect.signature(getattr(dist, name)).parameters.values()
        text = (
            "("
            + ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params)
            + ")"
        )
        assert text == sig, name
