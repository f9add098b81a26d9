"""Registry: registration, lookup, mixed backend strings, entry points, errors."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import hwdist
from hwdist import registry
from hwdist.drivers.base import Driver
from hwdist.drivers import startup
import json
import os
import subprocess
import warnings
from pathlib import Path
from hwdist import _plugins
from hwdist.testing import run_distributed


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


def test_only_a_driver_is_registered():
    """Registration checks the Driver ABC: a look-alike object is refused, and so is a class without
    device_type.
    """

    class NotADriver:
        name = "x"
        device_type = "cpu"

    with pytest.raises(
        hwdist.BackendError, match="must be a hwdist.Driver subclass or instance, got NotADriver"
    ):
        hwdist.register_backend("broken", NotADriver())
    with pytest.raises(hwdist.BackendError, match="got NotADriver.*HINT: class MyDriver"):
        hwdist.register_backend("broken", NotADriver)

    class NoDevice(Driver):
        description = "forgot device_type"

    with pytest.raises(
        hwdist.BackendError, match=r"driver class NoDevice for backend 'broken' does not set device_type"
    ):
        hwdist.register_backend("broken", NoDevice)
    with pytest.raises(TypeError):
        NoDevice()  # abstract: an ABC refuses it outright
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
    ep = EntryPoint(
        name="eplaunch", value="hwdist_ep_launcher:EpLauncher", group=resolvers.LAUNCHER_ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(
        _plugins,
        "entry_points",
        lambda group=None: [ep] if group == resolvers.LAUNCHER_ENTRY_POINT_GROUP else [],
    )
    monkeypatch.setattr(resolvers, "_entry_points_loaded", False)
    try:
        assert isinstance(hwdist.get_launcher("eplaunch"), EpLauncher)
        assert "eplaunch" in hwdist.list_launchers()
    finally:
        hwdist.unregister_launcher("eplaunch")


# ---------------------------------------------------------------- bad input, group rule


def test_name_differing_only_by_case_is_the_same_backend(clean_name):
    clean_name("toy_case")
    hwdist.register_backend("toy_case", _ToyDriver)
    with pytest.raises(hwdist.BackendError) as info:
        hwdist.register_backend("Toy_Case", _ToyDriver)
    assert str(info.value).startswith(
        "backend 'Toy_Case' is already registered as 'toy_case' (backend names are case-insensitive)"
    )
    with pytest.raises(hwdist.BackendError, match="'GLOO' is already registered as 'gloo'"):
        hwdist.register_backend("GLOO", _ToyDriver)


def test_torch_undefined_name_is_refused():
    with pytest.raises(
        hwdist.BackendError, match=r"its torch name 'undefined' is torch.distributed.Backend.UNDEFINED"
    ):
        hwdist.register_backend("undefined", _ToyDriver)

    class Undefined(_ToyDriver):
        torch_backend = "undefined"

    with pytest.raises(hwdist.BackendError, match="names no backend"):
        hwdist.register_backend("toy_undef", Undefined)
    assert "undefined" not in hwdist.list_backends() and "toy_undef" not in hwdist.list_backends()


def test_factory_on_a_torch_reserved_name_is_refused():
    class GlooWithFactory(_ToyDriver):
        torch_backend = "gloo"

        @staticmethod
        def process_group_factory(store, rank, size, timeout):
            raise AssertionError("never called")

    with pytest.raises(hwdist.BackendError, match="torch would never call the factory"):
        hwdist.register_backend("toy_gloo_factory", GlooWithFactory)


def test_shared_torch_name_is_no_alias(clean_name):
    clean_name("toy_mygloo")

    class MyGloo(_ToyDriver):
        torch_backend = "gloo"

    hwdist.register_backend("toy_mygloo", MyGloo)
    # torch reports 'gloo' for plain gloo groups: that is gloo's, not toy_mygloo's
    assert registry.canonical_name("gloo") == "gloo"
    assert hwdist.get_driver("gloo").name == "gloo"
    assert hwdist.get_driver("toy_mygloo").torch_name == "gloo"


def test_start_up_rule_without_process_group():
    from hwdist.drivers.startup import fallback_process_group_factory, gloo_process_group

    class Accel(_ToyDriver):
        device_type = "toyaccel"

    assert fallback_process_group_factory("cpu") is gloo_process_group
    assert fallback_process_group_factory("toyaccel") is None
    drv = Accel()
    drv.name = "toy_accel"
    with pytest.raises(hwdist.BackendError) as info:
        startup.ensure_torch_backend(drv)
    msg = str(info.value)
    assert msg.startswith("backend 'toy_accel' cannot start: torch.distributed has no backend 'toy_accel'")
    assert msg.endswith("or give process_group_factory") and "gloo" in msg


class _PlanRaises(_ToyDriver):
    def plan(self, op, dtype, reduce_op=None):
        raise KeyError(op)


class _PlanNotAPlan(_ToyDriver):
    def plan(self, op, dtype, reduce_op=None):
        return "pass it through"


class _PlanWrongView(_ToyDriver):
    def plan(self, op, dtype, reduce_op=None):
        return hwdist.Plan(op, op, dtype, torch.int64, view=True, reduce_op="sum")


class _PlanBadReduce(_ToyDriver):
    def plan(self, op, dtype, reduce_op=None):
        return hwdist.Plan(op, op, dtype, dtype, reduce_op="average")


@pytest.mark.parametrize(
    "cls, dtype, expected",
    [
        (
            _PlanRaises,
            torch.float32,
            r"plan\('all_reduce', torch.float32, 'sum'\) raised KeyError: 'all_reduce'",
        ),
        (
            _PlanNotAPlan,
            torch.float32,
            r"returned a malformed plan: expected a hwdist.Plan, got str: 'pass it through'",
        ),
        (
            _PlanWrongView,
            torch.int16,
            r"a torch.int16 element \(2 bytes\) cannot be viewed as torch.int64 \(8 bytes\)",
        ),
        (_PlanBadReduce, torch.float32, r"reduce_op 'average' is not a reduce op"),
    ],
)
def test_broken_plan_is_an_error_naming_the_driver(clean_name, cls, dtype, expected):
    clean_name("toy_broken_plan")
    drv = hwdist.register_backend("toy_broken_plan", cls)
    with pytest.raises(
        hwdist.BackendError, match=rf"^driver 'toy_broken_plan' \({cls.__name__}\): .*{expected}"
    ):
        drv.plan("all_reduce", dtype, "sum")


class _SlottedNotAPlan(_ToyDriver):
    __slots__ = ("extra",)  # the check is part of the class: nothing is patched onto the instance

    def plan(self, op, dtype, reduce_op=None):
        return "pass it through"


def test_a_slotted_driver_and_an_unregistered_instance_get_the_check_too(clean_name):
    drv = _SlottedNotAPlan()  # not registered: the check comes with the class
    with pytest.raises(hwdist.BackendError, match="returned a malformed plan"):
        drv.plan("broadcast", torch.float32)
    clean_name("toy_slotted")
    registered = hwdist.register_backend("toy_slotted", _SlottedNotAPlan)
    with pytest.raises(hwdist.BackendError, match=r"^driver 'toy_slotted' \(_SlottedNotAPlan\)"):
        registered.plan("broadcast", torch.float32)


def test_a_subclass_calling_super_plan_is_checked_once_and_gets_the_planner_plan():
    class Narrower(_ToyDriver):
        def plan(self, op, dtype, reduce_op=None):
            if dtype == torch.int16:
                raise hwdist.PlanError(f"{op} on int16: refused by this test driver")
            return super().plan(op, dtype, reduce_op)

    drv = Narrower()
    got = drv.plan("all_reduce", torch.float32, "sum")
    assert isinstance(got, hwdist.Plan) and got.op == "all_reduce" and got.dtype == torch.float32
    with pytest.raises(hwdist.PlanError, match="refused by this test driver"):
        drv.plan("all_reduce", torch.int16, "sum")


def test_plan_errors_and_value_errors_pass_through_the_guard():
    gloo = hwdist.get_driver("gloo")
    with pytest.raises(ValueError, match="unknown op"):
        gloo.plan("teleport", torch.float32)
    emu = hwdist.get_driver("emu") if "emu" in hwdist.list_backends() else None
    if emu is not None:
        with pytest.raises(hwdist.PlanError):
            emu.plan("all_reduce", torch.int64, "sum")


def test_guarded_driver_pickles():
    import pickle

    gloo = pickle.loads(pickle.dumps(hwdist.get_driver("gloo")))
    assert gloo.plan("all_gather", torch.int8).comm_dtype == torch.int8


@pytest.mark.parametrize(
    "dtypes, expected",
    [
        (None, torch.uint8),
        (frozenset({torch.float32, torch.int32}), torch.int32),
        (frozenset({torch.float32, torch.int16, torch.int64}), torch.int16),
        (frozenset({torch.int8}), torch.int8),
    ],
)
def test_byte_carrier_is_the_smallest_integer_dtype(dtypes, expected):
    from hwdist.drivers.base import byte_carrier

    class T(_ToyDriver):
        pass

    T.dtypes = dtypes
    drv = T()
    drv.name = "toy_carrier"
    assert byte_carrier(drv, "all_gather") == expected


def test_byte_carrier_names_what_it_needs():
    from hwdist.drivers.base import byte_carrier

    class T(_ToyDriver):
        dtypes = frozenset({torch.float32, torch.float64})

    drv = T()
    drv.name = "toy_floats"
    with pytest.raises(hwdist.PlanError) as info:
        byte_carrier(drv, "broadcast")
    msg = str(info.value)
    assert msg.startswith(
        "backend 'toy_floats' cannot carry bytes for 'broadcast' (object collectives need it)"
    )
    assert "none of uint8, int8, int16, int32, int64" in msg and "HINT: add one integer dtype" in msg


# ---------------------------------------------------------------- torch's map, shared names, generic


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("cpu:gloo", {"cpu": "gloo"}),
        ("cpu:gloo,cuda:nccl", {"cpu": "gloo", "cuda": "nccl"}),
        (" CPU:Gloo , hpu:hccl ", {"cpu": "gloo", "hpu": "hccl"}),
    ],
)
def test_torch_backend_strings_parse(spec, expected):
    assert registry.parse_backend_config(spec) == expected


@pytest.mark.parametrize(
    "spec, why",
    [
        ("gloo", "'gloo' is not 'DEVICE:BACKEND'"),
        ("cpu=gloo", "'cpu=gloo' is not 'DEVICE:BACKEND'"),
        ("cpu:gloo,", "'' is not 'DEVICE:BACKEND'"),
        ("cpu:", "'cpu:' is not 'DEVICE:BACKEND'"),
        ("cpu:gloo:x", "'cpu:gloo:x' is not 'DEVICE:BACKEND'"),
        ("cpu:gloo,cpu:mpi", "device 'cpu' is named twice"),
    ],
)
def test_unreadable_backend_strings_say_why(spec, why):
    with pytest.raises(hwdist.BackendError) as info:
        registry.parse_backend_config(spec)
    assert str(info.value) == f"cannot parse backend string {spec!r}: {why}"


@pytest.mark.parametrize(
    "mapping, order, expected",
    [
        ({"cuda": "nccl"}, [], "cuda"),  # one backend: it
        ({"cpu": "gloo", "cuda": "nccl"}, ["cuda", "cpu"], "cpu"),  # a CPU backend: it (torch's rule)
        ({"cuda": "nccl", "cpu": "gloo"}, [], "cpu"),
        ({"cuda": "nccl", "hpu": "hccl"}, ["hpu", "cuda"], "hpu"),  # no CPU: the first torch lists
        ({"cuda": "nccl", "hpu": "hccl"}, [], "cuda"),
    ],
)
def test_a_call_without_a_tensor_takes_torchs_object_collective_rule(mapping, order, expected):
    assert registry._no_tensor_device(mapping, order) == expected


def test_no_tensor_rule_is_torchs_own_where_torch_has_it():
    """torch's ``_get_object_coll_device`` documents the rule hwdist applies (torch 2.2 through 2.15)."""
    import inspect

    from hwdist import _compat

    if _compat.object_coll_device is None:
        pytest.skip(f"torch {torch.__version__} has no _get_object_coll_device (torch >= 2.2)")
    source = inspect.getsource(_compat.object_coll_device)
    assert 'If "cpu" is among those pairs, use "cpu"' in source
    assert 'torch.device("cpu") in devices' in source


def test_a_tensor_on_a_device_the_backend_string_does_not_serve_is_refused():
    assert hwdist.get_driver("cpu:gloo,cuda:nccl", "cpu").name == "gloo"
    with pytest.raises(hwdist.BackendError) as info:
        hwdist.get_driver("cpu:gloo,cuda:nccl", "meta")
    msg = str(info.value)
    assert msg.startswith("a tensor on device 'meta', but backend string 'cpu:gloo,cuda:nccl' has no backend")
    assert "Fix: move the tensor to a device the group serves (cpu, cuda; e.g. tensor.to('cpu'))" in msg
    assert "init_process_group(backend='cpu:gloo,cuda:nccl,meta:<backend>')" in msg


def test_a_shared_torch_name_is_found_by_device_type():
    """'hccl' is Ascend's on npu and Intel Gaudi's on hpu: two drivers, one torch name."""
    assert hwdist.get_driver("hccl", "npu").name == "hccl"
    assert hwdist.get_driver("hccl", "hpu").name == "gaudi"
    assert hwdist.get_driver("hpu:hccl").name == "gaudi"
    assert hwdist.get_driver("npu:hccl").name == "hccl"
    assert hwdist.get_driver("cpu:gloo,hpu:hccl", "hpu").name == "gaudi"
    assert hwdist.get_driver("cpu:gloo,hpu:hccl").name == "gloo"  # no tensor: the CPU backend
    gaudi = hwdist.get_driver("gaudi")
    assert (gaudi.device_type, gaudi.torch_name) == ("hpu", "hccl")
    assert hwdist.get_driver("hccl").name == "hccl"  # the name alone: the driver registered under it


def test_a_shared_name_alone_picks_the_one_available_driver(monkeypatch):
    """``init_dist(backend="hccl")`` on a Gaudi machine (no torch_npu) starts Gaudi's HCCL."""
    from hwdist.drivers.vendors import GaudiDriver, HcclDriver

    monkeypatch.setattr(HcclDriver, "unavailable_reason", lambda self: "no torch_npu")
    monkeypatch.setattr(GaudiDriver, "unavailable_reason", lambda self: None)
    assert hwdist.get_driver("hccl").name == "gaudi"
    monkeypatch.setattr(GaudiDriver, "unavailable_reason", lambda self: "no habana_frameworks")
    assert hwdist.get_driver("hccl").name == "hccl"  # neither: the named one, whose error says why


@pytest.fixture
def torch_only_backend():
    """A backend registered with torch only (once per process: torch 2.1 refuses a second one)."""
    import torch.distributed as dist

    from hwdist import _compat

    name = "hwdist_unit_tonly"
    if name not in dist.Backend.backend_list:
        _compat.register_torch_backend(name, lambda *a: None, ["cpu"])
    return name


def test_a_backend_torch_knows_gets_a_generic_driver(torch_only_backend):
    from hwdist.drivers.base import Post
    from hwdist.drivers.generic import GENERIC_SUMMARY

    name = torch_only_backend
    drv = hwdist.get_driver(name)
    assert registry.is_generic(drv) and (drv.name, drv.device_type, drv.torch_name) == (name, "cpu", name)
    assert drv is hwdist.get_driver(name, "cpu") and name not in hwdist.list_backends()
    assert drv.creator_module == __name__
    assert not registry.is_generic(hwdist.get_driver("gloo"))
    # the conservative table: widened, moved as bytes, emulated ...
    mean = drv.plan("all_reduce", torch.float16, "mean")
    assert (mean.comm_dtype, mean.reduce_op, mean.post) == (torch.float32, "sum", Post.DIVIDE)
    assert drv.plan("all_reduce", torch.int8, "max").comm_dtype == torch.int32
    assert drv.plan("all_gather", torch.int64).comm_dtype == torch.uint8
    assert drv.plan("gather", torch.float32).native_op == "all_gather"
    assert drv.plan("reduce_scatter", torch.float32, "sum").native_op == "all_reduce"
    # ... or refused, naming the backend and how to measure its real table
    for op, dtype, rop in (("all_reduce", torch.int64, "sum"), ("send", torch.float32, None),
                           ("all_reduce", torch.float32, "product")):
        with pytest.raises(hwdist.PlanError) as info:
            drv.plan(op, dtype, rop)
        msg = str(info.value)
        assert f"backend '{name}'" in msg and GENERIC_SUMMARY in msg
        assert f"`hwdist check --backend {name} --write-driver {name}_driver.py`" in msg


def test_a_name_neither_knows_is_still_unknown():
    with pytest.raises(hwdist.BackendError, match=r"^unknown backend 'nobody_knows'; registered: gloo"):
        hwdist.get_driver("nobody_knows")


class _Options:
    """Stands in for torch's _DistributedBackendOptions."""

    def __init__(self, ranks, rank=1, size=3):
        self.store, self.group_rank, self.group_size, self.timeout = "store", rank, size, 30
        self.group_id, self.global_ranks_in_group = "7", ranks


def test_a_factory_gets_torchs_options_when_it_takes_them():
    seen = []

    def with_options(store, rank, size, timeout, *, options=None):
        seen.append((store, rank, size, timeout, options.global_ranks_in_group, options.group_id))
        return "pg"

    def classic(store, rank, size, timeout):
        seen.append((store, rank, size, timeout))
        return "pg"

    create = startup._torch_creator("mycl", with_options, ["cpu"], extended=True)
    assert create(_Options([]), None) == "pg"  # torch's [] for the default group: filled in
    assert create(_Options([0, 2], rank=1, size=2), None) == "pg"
    assert seen == [("store", 1, 3, 30, [0, 1, 2], "7"), ("store", 1, 2, 30, [0, 2], "7")]
    seen.clear()
    assert startup._torch_creator("mycl", classic, ["cpu"], extended=True)(_Options([0, 1]), None) == "pg"
    assert startup._torch_creator("mycl", classic, ["cpu"], extended=False)("s", 0, 2, 5) == "pg"
    assert seen == [("store", 1, 3, 30), ("s", 0, 2, 5)]


def test_a_factory_that_raises_names_the_backend_and_what_to_do():
    def broken(store, rank, size, timeout):
        raise RuntimeError("no device")

    with pytest.raises(hwdist.BackendError) as info:
        startup._torch_creator("mycl", broken, ["cpu"], extended=True)(_Options([0, 1], rank=1), None)
    msg = str(info.value)
    assert msg.startswith("backend 'mycl' could not create its process group on rank 1:")
    assert "raised RuntimeError: no device" in msg and "hwdist check --backend mycl" in msg
    assert "The group's backends: 'cpu:mycl' (device(s) cpu)" in msg


# ---------- broken or hostile plug-ins ----------
# Broken or hostile driver plug-ins (``hwdist.drivers`` entry points) never break hwdist.

ROOT = Path(__file__).resolve().parents[1]

MODULES = {
    "hwp_good": "import hwdist\n\nclass Good(hwdist.Driver):\n    device_type = 'cpu'\n",
    "hwp_notdriver": "class NotADriver:\n    pass\n",
    "hwp_prio": (
        "import hwdist\n\nclass High(hwdist.Driver):\n    device_type = 'cpu'\n    priority = 'high'\n"
    ),
    "hwp_exit": "raise SystemExit(3)\n",
    "hwp_interrupt": "raise KeyboardInterrupt\n",
    "hwp_printer": (
        "print('hello from a plug-in')\nimport hwdist\n\nclass P(hwdist.Driver):\n    device_type = 'cpu'\n"
    ),
    "hwp_missing": "import hwdist_no_such_dependency_xyz\n",
}
ENTRY_POINTS = {
    "aanotdriver": "hwp_notdriver:NotADriver",
    "abprio": "hwp_prio:High",
    "acexit": "hwp_exit:X",
    "adinterrupt": "hwp_interrupt:X",
    "aeprinter": "hwp_printer:P",
    "afmissing": "hwp_missing:X",
    "zzgood": "hwp_good:Good",
}
BAD = ["aanotdriver", "abprio", "acexit", "adinterrupt", "afmissing"]


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    for mod, text in MODULES.items():
        (tmp_path / f"{mod}.py").write_text(text)
    info = tmp_path / "hwdist_hostile_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hwdist-hostile-plugins\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in ENTRY_POINTS.items())
    (info / "entry_points.txt").write_text(f"[hwdist.drivers]\n{lines}")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(_plugins, "_failed", {})
    yield tmp_path
    for name in ENTRY_POINTS:
        if name in registry._drivers:
            hwdist.unregister_backend(name)
    for mod in MODULES:
        sys.modules.pop(mod, None)


def test_bad_plugins_warn_by_name_and_the_good_ones_still_load(plugins, capfd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = hwdist.list_backends()
    text = "\n".join(str(w.message) for w in caught)
    assert "zzgood" in first and "aeprinter" in first, first
    assert not set(BAD) & set(first), first
    assert "'aanotdriver'" in text and "must be a hwdist.Driver subclass or instance, got NotADriver" in text
    assert "'abprio'" in text and "priority must be a number, got 'high'" in text, text
    assert "'acexit'" in text and "SystemExit: 3" in text, text
    assert "'adinterrupt'" in text and "KeyboardInterrupt" in text, text
    assert hwdist.list_backends() == first  # later calls keep every plug-in
    hwdist.detect()  # no TypeError from a bad priority
    out, err = capfd.readouterr()
    assert "hello from a plug-in" not in out and "hello from a plug-in" in err
    with pytest.raises(hwdist.BackendError) as info:
        hwdist.get_driver("afmissing")
    msg = str(info.value)
    assert msg.startswith("unknown backend 'afmissing'; registered: "), msg
    assert "driver plug-in 'afmissing' failed to load: ModuleNotFoundError: No module named" in msg
    assert "hwdist_no_such_dependency_xyz" in msg, msg


def test_a_bad_priority_is_refused_at_registration():
    class Bad(hwdist.Driver):
        device_type = "cpu"
        priority = "high"  # type: ignore[assignment]

    for prio in ("high", None, True, float("nan")):
        Bad.priority = prio  # type: ignore[assignment]
        with pytest.raises(hwdist.BackendError, match="backend 'badprio': priority must be a number"):
            hwdist.register_backend("badprio", Bad)
    assert "badprio" not in hwdist.list_backends()


def test_hwdist_env_survives_hostile_plugins(plugins):
    env = {**os.environ, "PYTHONPATH": f"{plugins}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [sys.executable, "-m", "hwdist", "env", "--json"], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env=env,
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    data = json.loads(run.stdout)  # nothing a plug-in printed is mixed in
    assert "zzgood" in json.dumps(data)
    for name in ("aanotdriver", "abprio", "acexit", "adinterrupt", "afmissing"):
        assert f"entry point {name!r}" in run.stderr, (name, run.stderr[-3000:])
    assert "hello from a plug-in" in run.stderr


def _rank_with_plugins() -> list:
    import hwdist

    return [hwdist.get_rank(), "zzgood" in hwdist.list_backends(), hwdist.detect().backend]


@pytest.mark.slow
def test_ranks_start_and_detect_with_hostile_plugins_installed(plugins):
    ws = 2  # plug-ins load per process: two ranks show it, a third adds nothing
    env = {"PYTHONPATH": f"{plugins}{os.pathsep}{ROOT}"}
    results = run_distributed(_rank_with_plugins, ws, "gloo", timeout=90, env=env)
    assert [r[:2] for r in results] == [[q, True] for q in range(ws)], results
