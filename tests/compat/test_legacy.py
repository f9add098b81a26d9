"""``hwdist.compat.legacy``: the torch 0.3/0.4 ``torch.distributed`` API, on real ranks.

Written from that API's documentation (torch 0.3's ``torch/distributed/__init__.py``
docstrings): collectives work in place and return None; ``gather``/``scatter``
take ``dst``/``src`` and the list as keywords, the list only on the root (where
the root's own rank is the default); ``recv`` returns the sender; ``isend``/
``irecv`` return a request with ``is_completed()``/``wait()``; ``get_rank``
asserts a process group exists; bad backend names and misplaced lists raise
``RuntimeError``. Expected values are computed from rank numbers, never by a
collective.
"""

from __future__ import annotations

import socket
import time

import pytest
import torch

import hwdist
import hwdist.compat.legacy as dist
from hwdist.testing import run_distributed
from hwdist.testing.pytest_plugin import one_backend, world_sizes

pytestmark = pytest.mark.dist


@pytest.fixture
def dist_pool(rank_pools):
    """The plugin's ``dist`` fixture under another name (``dist`` is the module under test here)."""
    return rank_pools.run


def _err(fn, *args, **kwargs):
    """(type name, is RuntimeError, is AssertionError, message, seconds) of what ``fn`` raised, or None."""
    start = time.monotonic()
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test compares type and text
        took = time.monotonic() - start
        return (
            type(exc).__name__,
            isinstance(exc, RuntimeError),
            isinstance(exc, AssertionError),
            str(exc),
            took,
        )
    return None


# ----------------------------------------------------------------------------- documented behaviour
def rank_legacy_ops() -> dict:
    r, ws = dist.get_rank(), dist.get_world_size()
    out: dict = {"rank": r, "ws": ws, "init": dist.is_initialized(), "available": dist.is_available()}
    t = torch.tensor([float(r), 10.0 * r])
    out["broadcast_ret"] = dist.broadcast(tensor=t, src=ws - 1)
    out["broadcast"] = t.tolist()
    for name in ("SUM", "PRODUCT", "MAX", "MIN"):
        t = torch.tensor([r + 1.0])
        dist.all_reduce(tensor=t, op=getattr(dist.reduce_op, name))
        out[f"all_reduce_{name}"] = t.item()
    t = torch.tensor([r + 1], dtype=torch.int32)
    dist.all_reduce(t, dist.reduce_op.SUM, dist.group.WORLD)
    out["all_reduce_int"] = (t.item(), t.dtype)
    t = torch.tensor([r + 1.0])
    dist.reduce(tensor=t, dst=0)
    out["reduce"] = t.item() if r == 0 else None
    lst = [torch.zeros(2) for _ in range(ws)]
    out["all_gather_ret"] = dist.all_gather(lst, torch.tensor([r, -r], dtype=torch.float32))
    out["all_gather"] = [x.tolist() for x in lst]
    for root in {0, ws - 1}:
        mine = torch.tensor([100.0 + r])
        if r == root:  # the 0.3 spelling: the root omits dst (its own rank is the default)
            got = [torch.zeros(1) for _ in range(ws)]
            dist.gather(mine, gather_list=got)
            out[f"gather_{root}"] = [x.item() for x in got]
        else:
            dist.gather(tensor=mine, dst=root)
        recv = torch.zeros(1)
        if r == root:
            dist.scatter(recv, scatter_list=[torch.tensor([7.0 * q]) for q in range(ws)])
        else:
            dist.scatter(tensor=recv, src=root)
        out[f"scatter_{root}"] = recv.item()
    out["barrier"] = (dist.barrier(), dist.barrier(group=dist.group.WORLD))
    g = dist.new_group(list(range(ws)))
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=g)
    out["new_group"] = t.item()
    # the *_multigpu calls with one device per process
    ts = [torch.tensor([r + 1.0])]
    dist.all_reduce_multigpu(ts)
    out["all_reduce_multigpu"] = ts[0].item()
    ts = [torch.tensor([float(r)]), torch.tensor([-1.0])]
    dist.broadcast_multigpu(ts, ws - 1)
    out["broadcast_multigpu"] = [x.item() for x in ts]
    ts = [torch.tensor([r + 1.0])]
    dist.reduce_multigpu(ts, 0, dist.reduce_op.MAX)
    out["reduce_multigpu"] = ts[0].item() if r == 0 else None
    outs = [[torch.zeros(1) for _ in range(ws)]]
    dist.all_gather_multigpu(outs, [torch.tensor([float(r)])])
    out["all_gather_multigpu"] = [x.item() for x in outs[0]]
    if ws > 1:  # a ring: send to the next rank, receive from the previous one
        nxt, prev = (r + 1) % ws, (r - 1) % ws
        got = torch.zeros(1)
        if r % 2 == 0:
            dist.send(torch.tensor([float(r)]), nxt)
            sender = dist.recv(got)  # any source: returns who sent
        else:
            sender = dist.recv(tensor=got, src=prev)
            dist.send(tensor=torch.tensor([float(r)]), dst=nxt)
        out["ring"] = (got.item(), sender)
        got = torch.zeros(1)
        reqs = [dist.isend(torch.tensor([r * 3.0]), nxt), dist.irecv(got, prev)]
        for req in reqs:
            assert req.wait() is None
        out["iring"] = (got.item(), all(req.is_completed() for req in reqs))
    return out


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", world_sizes())
def test_legacy_api_documented_behaviour(dist_pool, world_size, backend):
    for r, res in enumerate(dist_pool(rank_legacy_ops, world_size, backend)):
        ws = world_size
        assert (res["rank"], res["ws"], res["init"], res["available"]) == (r, ws, True, True)
        assert res["broadcast_ret"] is None and res["all_gather_ret"] is None
        assert res["broadcast"] == [float(ws - 1), 10.0 * (ws - 1)]
        assert res["all_reduce_SUM"] == sum(q + 1.0 for q in range(ws))
        assert res["all_reduce_PRODUCT"] == float(torch.arange(1, ws + 1).prod())
        assert (res["all_reduce_MAX"], res["all_reduce_MIN"]) == (float(ws), 1.0)
        assert res["all_reduce_int"] == (ws * (ws + 1) // 2, torch.int32)
        assert res["reduce"] == (ws * (ws + 1) / 2 if r == 0 else None)
        assert res["all_gather"] == [[float(q), float(-q)] for q in range(ws)]
        for root in {0, ws - 1}:
            if r == root:
                assert res[f"gather_{root}"] == [100.0 + q for q in range(ws)]
            assert res[f"scatter_{root}"] == 7.0 * r
        assert res["barrier"] == (None, None)
        assert res["new_group"] == float(ws)
        assert res["all_reduce_multigpu"] == ws * (ws + 1) / 2
        assert res["broadcast_multigpu"] == [float(ws - 1), float(ws - 1)]
        assert res["reduce_multigpu"] == (float(ws) if r == 0 else None)
        assert res["all_gather_multigpu"] == [float(q) for q in range(ws)]
        if ws > 1:
            assert res["ring"] == (float((r - 1) % ws), (r - 1) % ws)
            assert res["iring"] == (((r - 1) % ws) * 3.0, True)


def test_legacy_constants():
    assert (dist.dist_backend.UNDEFINED, dist.dist_backend.TCP, dist.dist_backend.MPI) == (-1, 0, 1)
    assert (dist.dist_backend.GLOO, dist.dist_backend.NCCL) == (2, 3)
    ops = [dist.reduce_op.SUM, dist.reduce_op.PRODUCT, dist.reduce_op.MAX, dist.reduce_op.MIN]
    assert len({str(op) for op in ops}) == 4
    assert dist.group.WORLD is dist.group.WORLD


# ----------------------------------------------------------------------------- bad input, every rank
def rank_legacy_errors(case: str) -> dict:
    r, ws = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(r)])
    calls = {
        # torch 0.3: "non-empty gather_list can be given only to gather destination"
        "gather_list_on_non_root": lambda: dist.gather(
            t, dst=0, gather_list=[torch.zeros(1) for _ in range(ws)] if r in (0, ws - 1) else None
        ),
        # "gather_list is a required argument in gather destination" (the root forgot it)
        "gather_list_missing_on_root": lambda: dist.gather(t, dst=0),
        # a non-root rank forgot dst: its own rank is the default, so it is a destination without a list
        "gather_dst_missing": lambda: (
            dist.gather(t, gather_list=[torch.zeros(1) for _ in range(ws)]) if r == 0 else dist.gather(t)
        ),
        "gather_unexpected_kwarg": lambda: (
            dist.gather(t, dst=0, gather_list=None, root=0)
            if r == ws - 1
            else dist.gather(
                t, dst=0, gather_list=[torch.zeros(1) for _ in range(ws)] if r == 0 else None
            )
        ),
        "scatter_list_on_non_root": lambda: dist.scatter(
            t, src=0, scatter_list=[torch.zeros(1)] * ws if r in (0, ws - 1) else None
        ),
        "scatter_list_missing_on_root": lambda: dist.scatter(t, src=0),
        "all_gather_short_list": lambda: dist.all_gather([torch.zeros(1)] * (ws - (r == ws - 1)), t),
        # the last rank's tensor is float64: its shape and dtype are named, not their digests
        "all_gather_dtype": lambda: dist.all_gather(
            [torch.zeros(1, dtype=torch.float64 if r == ws - 1 else torch.float32)] * ws,
            torch.zeros(1, dtype=torch.float64 if r == ws - 1 else torch.float32),
        ),
        # tensors that do not combine, on the last rank only
        "multigpu_list_shapes": lambda: dist.all_reduce_multigpu(
            [torch.ones(2), torch.ones(3)] if r == ws - 1 else [torch.ones(2)]
        ),
        # each list is fine, but the ranks' results differ in shape
        "multigpu_result_shape": lambda: dist.all_reduce_multigpu([torch.ones(3 if r == ws - 1 else 2)]),
    }
    err = _err(calls[case])
    return {"err": err}


ERROR_CASES = {
    "gather_list_on_non_root": "non-empty gather_list can be given only to gather destination",
    "gather_list_missing_on_root": "gather_list is a required argument in gather destination",
    "gather_dst_missing": "gather_list is a required argument in gather destination",
    "gather_unexpected_kwarg": "unexpected kwargs root",
    "scatter_list_on_non_root": "non-empty scatter_list can be given only to scatter source",
    "scatter_list_missing_on_root": "scatter_list is a required argument in scatter source",
    "all_gather_short_list": "tensor_list must hold",
    "all_gather_dtype": "the ranks disagree on the tensor's shape and dtype (rank",
    "multigpu_list_shapes": "the tensors of tensor_list differ in shape",
    "multigpu_result_shape": "the ranks disagree on len(tensor_list) or the result's shape and dtype (rank",
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_legacy_bad_lists_raise_runtime_error_on_every_rank(dist_pool, world_size, backend, case):
    results = dist_pool(rank_legacy_errors, world_size, backend, case)
    for r, res in enumerate(results):
        assert res["err"] is not None, f"rank {r} did not raise"
        name, is_runtime, _, text, took = res["err"]
        assert is_runtime, (r, name, text)  # torch 0.3 raised RuntimeError
        assert ERROR_CASES[case] in text, (r, text)
        assert took < 10, f"rank {r} took {took:.1f} s to fail"
    # the pool is still usable afterwards: nobody is left inside a collective
    assert [res["rank"] for res in dist_pool(rank_legacy_ops, world_size, backend)] == list(
        range(world_size)
    )


def rank_legacy_one_rank_errors() -> dict:
    t = torch.zeros(1)
    return {
        "gather_missing": _err(dist.gather, t),
        "scatter_missing": _err(dist.scatter, t),
        "gather_extra": _err(dist.gather, t, gather_list=[torch.zeros(1)], dst=0, bogus=1),
        "all_gather_shape": _err(dist.all_gather, [torch.zeros(3)], t),
    }


@pytest.mark.parametrize("backend", one_backend())
def test_legacy_errors_on_one_rank(dist_pool, backend):
    (res,) = dist_pool(rank_legacy_one_rank_errors, 1, backend)
    for key, err in res.items():
        assert err is not None and err[1], (key, err)
    assert "gather_list is a required argument" in res["gather_missing"][3]
    assert "unexpected kwargs bogus" in res["gather_extra"][3]
    assert "tensor_list[0] is (3,)" in res["all_gather_shape"][3]


# ----------------------------------------------------------------------------- init_process_group
def rank_legacy_init(store: str, backend_arg, second: str) -> dict:
    import os

    out: dict = {}
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out["before"] = (dist.is_initialized(), _err(dist.get_rank), _err(dist.get_world_size))
    out["collective_before"] = _err(dist.all_reduce, torch.zeros(1))
    out["bad_kwarg"] = _err(dist.init_process_group, "gloo", world_size=ws, rank=rank, timeout=3)
    out["bad_name"] = _err(dist.init_process_group, "nosuch", world_size=ws, rank=rank)
    out["tcp"] = _err(dist.init_process_group, "tcp", world_size=ws, rank=rank)
    out["tcp_id"] = _err(dist.init_process_group, dist.dist_backend.TCP, world_size=ws, rank=rank)
    out["still_none"] = hwdist.is_distributed()
    dist.init_process_group(
        backend_arg, init_method=f"file://{store}-1", world_size=ws, rank=rank, group_name=""
    )
    out["after"] = (dist.is_initialized(), dist.get_rank(), dist.get_world_size(), hwdist.get_backend())
    out["twice"] = _err(
        dist.init_process_group, "gloo", init_method=f"file://{store}-x", world_size=ws, rank=rank
    )
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    out["sum"] = t.item()
    dist.destroy_process_group()
    dist.destroy_process_group()  # safe twice
    out["destroyed"] = dist.is_initialized()
    # a backend hwdist registers (not one torch 0.3 knew) works by name
    dist.init_process_group(second, init_method=f"file://{store}-2", world_size=ws, rank=rank)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t, dist.reduce_op.MAX)
    out["second"] = (hwdist.get_driver().name, t.item())
    dist.destroy_process_group()
    # the defaults: init_method='env://', world size and rank from the environment (RANK, WORLD_SIZE)
    dist.init_process_group("gloo")
    out["env"] = (dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("world_size", [1, 2])
def test_legacy_init_process_group(world_size, tmp_path):
    results = run_distributed(
        rank_legacy_init,
        world_size,
        None,
        str(tmp_path / "store"),
        dist.dist_backend.GLOO,
        "emu",
        timeout=90,
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())},
    )
    for r, res in enumerate(results):
        initialised, rank_err, size_err = res["before"]
        assert initialised is False
        for err in (rank_err, size_err, res["collective_before"]):
            assert err is not None and err[2] and "init_process_group" in err[3]  # AssertionError
        assert res["bad_kwarg"][2] and "unexpected keyword arguments: timeout" in res["bad_kwarg"][3]
        assert res["bad_name"][1] and "Invalid distributed backend name: 'nosuch'" in res["bad_name"][3]
        assert "registered: " in res["bad_name"][3] and "gloo" in res["bad_name"][3]
        assert res["tcp"][1] and "'tcp' backend was removed" in res["tcp"][3]
        assert res["tcp_id"][1] and "'tcp' backend was removed" in res["tcp_id"][3]
        assert res["still_none"] is False
        assert res["after"] == (True, r, world_size, "gloo")
        assert res["twice"][1] and "twice" in res["twice"][3]
        assert res["sum"] == world_size * (world_size + 1) / 2
        assert res["destroyed"] is False
        assert res["second"] == ("emu", float(world_size))
        assert res["env"] == (r, world_size)
