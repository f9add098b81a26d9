"""mmengine.dist's edge cases at hwdist's top level, checked against mmengine's documented behaviour.

* ``all_reduce_dict(data)`` and ``broadcast_object_list(data)`` check their
  argument with ``assert isinstance(data, dict)`` / ``list``: a wrong type is an
  ``AssertionError`` (hwdist's is also its usual ``TypeError`` with its message).
* ``init_dist(launcher, backend, init_backend='torch', **kwargs)``: the third
  positional is ``init_backend``; ``timeout`` travels in ``kwargs`` (seconds);
  ``'deepspeed'`` and ``'colossalai'`` call those packages' initialisers.
* ``infer_launcher()``: ``WORLD_SIZE`` -> ``'pytorch'``, else ``SLURM_NTASKS`` ->
  ``'slurm'``, else ``OMPI_COMM_WORLD_LOCAL_RANK`` -> ``'mpi'``, else ``'none'``.

mmengine, DeepSpeed and ColossalAI are not installed: the DeepSpeed test fakes
the ``deepspeed`` module (its ``init_distributed`` creates the group the way
DeepSpeed does, from the launcher's variables) and says so.
"""

from __future__ import annotations

import importlib.machinery
import inspect
import itertools
import os
import socket
import sys
import types

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist.errors import MissingPackageError
from hwdist.testing import run_distributed
from hwdist.testing.pytest_plugin import one_backend, world_sizes

pytestmark = pytest.mark.dist


def _caught(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the test inspects the type and text
        return {
            "assertion": isinstance(exc, AssertionError),
            "type_error": isinstance(exc, TypeError),
            "hwdist": isinstance(exc, hwdist.HwdistError),
            "text": str(exc),
        }
    return None


def rank_assert_cases(only_last: bool) -> dict:
    r, ws = hwdist.get_rank(), hwdist.get_world_size()
    bad = (r == ws - 1) or not only_last
    return {
        "dict": _caught(hwdist.all_reduce_dict, "foo" if bad else {"a": torch.zeros(1)}),
        "list": _caught(hwdist.broadcast_object_list, "foo" if bad else [None]),
    }


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", world_sizes())
def test_mmengine_asserts_are_assertion_errors(dist, world_size, backend):
    for r, res in enumerate(dist(rank_assert_cases, world_size, backend, False)):
        for key, what in (("dict", "all_reduce_dict"), ("list", "broadcast_object_list")):
            got = res[key]
            assert got is not None, (r, key)
            assert got["assertion"] and got["type_error"] and got["hwdist"], (r, key, got)
            assert what in got["text"] and "must be a " in got["text"], got["text"]


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", [w for w in world_sizes() if w > 1])
def test_mmengine_assert_on_one_rank_raises_everywhere(dist, world_size, backend):
    results = dist(rank_assert_cases, world_size, backend, True)
    for key in ("dict", "list"):
        bad = results[-1][key]
        assert bad is not None and bad["assertion"], (key, bad)  # the rank that passed 'foo'
    for r, res in enumerate(results[:-1]):  # all_reduce_dict: the others raise too instead of waiting
        assert res["dict"] is not None, r
    # the pool is healthy afterwards: a normal call on every rank still works
    assert dist(hwdist.get_rank, world_size, backend) == list(range(world_size))


def test_init_dist_signature_is_mmengines():
    params = list(inspect.signature(hwdist.init_dist).parameters.values())
    assert [(p.name, p.default) for p in params[:3]] == [
        ("launcher", "auto"),
        ("backend", None),
        ("init_backend", "torch"),
    ]
    assert params[3].kind is inspect.Parameter.VAR_KEYWORD


def test_init_backend_packages_missing_say_what_to_install(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # an import of it fails, as when not installed
    monkeypatch.setitem(sys.modules, "colossalai", None)
    before = dict(os.environ)
    for name in ("deepspeed", "colossalai"):
        with pytest.raises(ImportError, match=f"needs the '{name}' package.*pip install {name}") as info:
            hwdist.init_dist("pytorch", "gloo", name)  # mmengine's positional order
        assert isinstance(info.value, MissingPackageError)
    with pytest.raises(
        ValueError, match="init_backend must be one of 'torch', 'deepspeed', 'colossalai'"
    ):
        hwdist.init_dist("pytorch", "gloo", "horovod")
    assert dict(os.environ) == before and not hwdist.is_distributed()


def _fake_deepspeed() -> types.ModuleType:
    """A stand-in for ``deepspeed`` (not installed here): ``init_distributed`` as DeepSpeed does it."""
    mod = types.ModuleType("deepspeed")
    mod.__spec__ = importlib.machinery.ModuleSpec("deepspeed", None)
    mod.calls = []

    def init_distributed(dist_backend=None, timeout=None, **kwargs):
        mod.calls.append((dist_backend, timeout, sorted(kwargs)))
        extra = {} if timeout is None else {"timeout": timeout}
        torch_dist.init_process_group(backend=dist_backend, init_method="env://", **extra)

    mod.init_distributed = init_distributed
    return mod


def rank_init_dist_mmengine(port: int) -> dict:
    out: dict = {}
    info = hwdist.init_dist(
        "pytorch", "gloo", "torch", timeout=30, port=port
    )  # timeout in kwargs, as mmengine
    t = torch.tensor([hwdist.get_rank() + 1.0])
    hwdist.all_reduce(t)
    out["torch"] = (info.backend, t.item())
    hwdist.destroy()
    fake = sys.modules["deepspeed"] = _fake_deepspeed()
    try:
        info = hwdist.init_dist("pytorch", "gloo", init_backend="deepspeed", timeout=20, port=port + 1)
        t = torch.tensor([hwdist.get_rank() + 1.0])
        hwdist.all_reduce(t, "max")
        out["deepspeed"] = (info.backend, hwdist.get_driver().name, t.item(), fake.calls)
    finally:
        del sys.modules["deepspeed"]
        hwdist.destroy()
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("world_size", [1, 2])
def test_init_dist_mmengine_positional_and_deepspeed(world_size):
    env = {"MASTER_ADDR": "127.0.0.1", "HWDIST_DEVICE": "cpu"}
    port = _free_port()
    results = run_distributed(rank_init_dist_mmengine, world_size, None, port, env=env, timeout=90)
    for res in results:
        assert res["torch"] == ("gloo", world_size * (world_size + 1) / 2)
        backend, driver, top, calls = res["deepspeed"]
        assert (backend, driver, top) == ("gloo", "gloo", float(world_size))
        assert len(calls) == 1 and calls[0][0] == "gloo" and calls[0][1].total_seconds() == 20


def _mmengine_infer_launcher(env: dict) -> str:
    """mmengine's documented rule (``mmengine.dist.utils.infer_launcher``)."""
    if "WORLD_SIZE" in env:
        return "pytorch"
    if "SLURM_NTASKS" in env:
        return "slurm"
    if "OMPI_COMM_WORLD_LOCAL_RANK" in env:
        return "mpi"
    return "none"


MMENGINE_VARS = {"WORLD_SIZE": "4", "SLURM_NTASKS": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
# variables mmengine does not look at, that real launchers set next to the ones it does
COMPANIONS = [
    {},
    {"RANK": "1", "LOCAL_RANK": "1"},
    {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"},
    {"PMI_RANK": "1", "PMI_SIZE": "4"},
    {"SLURM_PROCID": "1", "SLURM_LOCALID": "1"},
]


@pytest.mark.parametrize("companions", COMPANIONS, ids=lambda d: ",".join(d) or "alone")
def test_infer_launcher_gives_mmengines_answer(companions):
    for n in range(len(MMENGINE_VARS) + 1):
        for names in itertools.combinations(MMENGINE_VARS, n):
            env = {**companions, **{k: MMENGINE_VARS[k] for k in names}}
            expected = _mmengine_infer_launcher(env)
            if expected == "none" and any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")):
                expected = (
                    "mpi"  # hwdist's extension, only where mmengine answers 'none' (docs/porting.md)
                )
            assert hwdist.infer_launcher(env) == expected, env


def test_infer_launcher_extension_only_where_mmengine_says_none():
    assert hwdist.infer_launcher({"OMPI_COMM_WORLD_LOCAL_RANK": "0"}) == "mpi"
    assert hwdist.infer_launcher({"PMI_RANK": "0", "PMI_SIZE": "2"}) == "mpi"  # mmengine: 'none'
    assert hwdist.infer_launcher({"SLURM_NTASKS": "2", "PMI_SIZE": "2", "PMI_RANK": "0"}) == "slurm"
