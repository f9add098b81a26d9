"""Registry: registration, lookup, mixed backend strings, entry points, errors."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import hwdist
from hwdist import registry
from hwdist.drivers.base import Driver


class _ToyDriver(Driver):
    device_type = "cpu"
    description = "toy"


@pytest.fixture
def clean_name():
    names = []
    yield names.append
    for n in names:
        if n in registry._drivers:
            hwdist.unregister_backend(n)


def test_builtins_are_registered_in_priority_order():
    names = hwdist.list_backends()
    for builtin in ("gloo", "nccl", "hccl", "cncl", "mpi", "xccl", "mccl"):
        assert builtin in names
    prios = [hwdist.get_driver(n).priority for n in names]
    assert prios == sorted(prios, reverse=True)
    # Ascend is tried before CUDA (torch_npu can make CUDA look available).
    assert names.index("hccl") < names.index("nccl")


def test_register_call_and_decorator_forms(clean_name):
    clean_name("toy_a")
    clean_name("toy_b")
    drv = hwdist.register_backend("toy_a", _ToyDriver())
    assert hwdist.get_driver("toy_a") is drv and drv.name == "toy_a"

    @hwdist.register_backend("Toy_B")
    class B(_ToyDriver):
        pass

    assert isinstance(hwdist.get_driver("toy_b"), B)
    assert hwdist.get_driver("TOY_B").name == "toy_b"  # case-insensitive


def test_duplicate_refused_unless_override(clean_name):
    clean_name("toy_dup")
    hwdist.register_backend("toy_dup", _ToyDriver)
    with pytest.raises(hwdist.BackendError, match="already registered.*override=True"):
        hwdist.register_backend("toy_dup", _ToyDriver)
    new = hwdist.register_backend("toy_dup", _ToyDriver, override=True)
    assert hwdist.get_driver("toy_dup") is new
    with pytest.raises(hwdist.BackendError, match="already registered"):
        hwdist.register_backend("gloo", _ToyDriver)


def test_unknown_backend_error_lists_names_and_hint():
    with pytest.raises(hwdist.BackendError) as info:
        hwdist.get_driver("foo")
    msg = str(info.value)
    assert msg.startswith("unknown backend 'foo'; registered: gloo, nccl, hccl, cncl, mpi")
    assert "HINT: hwdist.register_backend('foo', ...)" in msg


def test_unregister_unknown_is_clear():
    with pytest.raises(hwdist.BackendError, match="unknown backend 'nope'; registered: gloo"):
        hwdist.unregister_backend("nope")


def test_driver_missing_members_is_refused():
    class NotADriver:
        name = "x"
        device_type = "cpu"

    with pytest.raises(hwdist.BackendError, match="missing required members: priority, is_available"):
        hwdist.register_backend("broken", NotADriver())
    assert "broken" not in hwdist.list_backends()


def test_bad_names_refused():
    with pytest.raises(hwdist.BackendError, match="non-empty str"):
        hwdist.register_backend("", _ToyDriver)
    with pytest.raises(hwdist.BackendError, match="'tcp' backend was removed"):
        hwdist.register_backend("tcp", _ToyDriver)


def test_legacy_tcp_lookup_gives_mapping_hint():
    with pytest.raises(hwdist.BackendError, match="removed from torch.*use 'gloo'"):
        hwdist.get_driver("tcp")


@pytest.mark.parametrize(
    "spec, device, expected",
    [
        ("cpu:gloo,cuda:nccl", "cpu", "gloo"),
        ("cpu:gloo,cuda:nccl", "cuda", "nccl"),
        ("cpu:gloo,cuda:nccl", torch.device("cuda", 1), "nccl"),
        ("cpu:gloo,cuda:nccl", "cuda:0", "nccl"),
        ("cuda:nccl", "cpu", "nccl"),  # no cpu entry: the only backend serves it
        ("cpu:gloo,cuda:nccl", None, "gloo"),  # no CUDA here: the available entry
        ("gloo", "cuda", "gloo"),
        (" GLOO ", None, "gloo"),
    ],
)
def test_mixed_backend_strings(spec, device, expected):
    assert hwdist.get_driver(spec, device).name == expected


def test_aliases_resolve_to_the_driver():
    mpi = hwdist.get_driver("mpi")
    for alias in mpi.aliases:
        assert hwdist.get_driver(alias) is mpi


def test_entry_point_drivers_load_lazily(monkeypatch, clean_name):
    clean_name("ep_toy")
    mod = types.ModuleType("hwdist_ep_toy")

    class EpDriver(Driver):
        device_type = "cpu"

    mod.EpDriver = EpDriver
    monkeypatch.setitem(sys.modules, "hwdist_ep_toy", mod)

    from importlib.metadata import EntryPoint

    ep = EntryPoint(name="ep_toy", value="hwdist_ep_toy:EpDriver", group=registry.ENTRY_POINT_GROUP)

    def fake_entry_points(group=None):
        return [ep] if group == registry.ENTRY_POINT_GROUP else []

    from hwdist import _plugins

    monkeypatch.setattr(_plugins, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    assert isinstance(hwdist.get_driver("ep_toy"), EpDriver)
    assert "ep_toy" in hwdist.list_backends()


def test_broken_entry_point_warns_and_is_skipped(monkeypatch):
    from importlib.metadata import EntryPoint

    ep = EntryPoint(name="ep_broken", value="no_such_module_xyz:Driver", group=registry.ENTRY_POINT_GROUP)
    from hwdist import _plugins

    monkeypatch.setattr(_plugins, "entry_points", lambda group=None: [ep])
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    with pytest.warns(UserWarning, match="could not load driver entry point 'ep_broken'"):
        names = hwdist.list_backends()
    assert "ep_broken" not in names


def test_resolve_without_process_group_is_clear():
    with pytest.raises(RuntimeError, match="no process group: call hwdist.init_dist"):
        hwdist.resolve()


def test_launcher_entry_points_load_lazily(monkeypatch):
    from importlib.metadata import EntryPoint

    from hwdist import _plugins
    from hwdist.launch import resolvers

    mod = types.ModuleType("hwdist_ep_launcher")

    class EpLauncher(resolvers.Launcher):
        priority = -100

    mod.EpLauncher = EpLauncher
    monkeypatch.setitem(sys.modules, "hwdist_ep_launcher", mod)
    ep = EntryPoint(name="eplaunch", value="hwdist_ep_launcher:EpLauncher", group=resolvers.LAUNCHER_ENTRY_POINT_GROUP)
    monkeypatch.setattr(_plugins, "entry_points", lambda group=None: [ep] if group == resolvers.LAUNCHER_ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(resolvers, "_entry_points_loaded", False)
    try:
        assert isinstance(hwdist.get_launcher("eplaunch"), EpLauncher)
        assert "eplaunch" in hwdist.list_launchers()
    finally:
        hwdist.unregister_launcher("eplaunch")
