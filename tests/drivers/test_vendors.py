"""The hccl driver against the real torch_npu package, read from its wheel without importing it.

torch_npu cannot be imported without Ascend's CANN runtime, but its PyPI wheel ships the
Python modules and C++ headers hwdist depends on. These tests fetch the wheel once into a
cache (``HWDIST_VENDOR_CACHE``, default ``~/.cache/hwdist/vendor``; skipped with the reason
when it cannot be downloaded), parse it with ``zipfile`` + ``ast`` and check every vendor
attribute, call and constant the driver relies on. The faked ``torch_npu`` of
tests/test_detection.py is checked against the same surface: the calls hwdist really makes
on the fake are recorded and bound to the real signatures.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import torch

import hwdist
from hwdist import _compat
from tests.test_detection import FakeDeviceModule
import itertools
from itertools import groupby
import torch.distributed as dist
from hwdist.drivers._vendor_caps import CONDITIONS, ENGINE_FACTS, FACTS, KINDS, SOURCES, table
from hwdist.drivers.base import ALL_OPS, REDUCE_OP_NAMES, REDUCE_OPS, Plan, PlanError, Post

NPU_VERSION = "2.14.0"
# One fixed wheel whatever the interpreter running the tests (it is read, never imported).
NPU_WHEEL = f"torch_npu-{NPU_VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl"
NPU_SHA256 = "7736f7d82cf9f16c7dfc4537f7e7c638153da760273a193455e70857f912189e"
ENV_CACHE = "HWDIST_VENDOR_CACHE"
DOWNLOAD_TIMEOUT_S = 300
ROOT = Path(__file__).resolve().parents[2]


# ---- the wheel -----------------------------------------------------------------------------


def _cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "hwdist" / "vendor")


def _pip_commands() -> list[list[str]]:
    cmds = [[sys.executable, "-m", "pip"]]  # a venv made by uv has no pip: fall back to one on PATH
    found = {os.path.realpath(p): p for p in (shutil.which("pip3"), shutil.which("pip")) if p}
    return cmds + [[p] for p in found.values()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(cache: Path) -> tuple[Optional[Path], str]:
    cache.mkdir(parents=True, exist_ok=True)
    errors = []
    deadline = time.monotonic() + DOWNLOAD_TIMEOUT_S  # for all attempts together
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        for pip in _pip_commands():
            left = deadline - time.monotonic()
            if left < 5:
                errors.append(f"gave up after {DOWNLOAD_TIMEOUT_S} s")
                break
            cmd = pip + [
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux_2_28_x86_64",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
                "--timeout",
                "20",
                "--retries",
                "2",
                "-q",
                "-d",
                tmp,
                f"torch-npu=={NPU_VERSION}",
            ]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{' '.join(pip)}: {exc}")
                continue
            got = Path(tmp) / NPU_WHEEL
            if out.returncode == 0 and got.is_file():
                os.replace(got, cache / NPU_WHEEL)  # atomic: a concurrent run sees all or nothing
                return cache / NPU_WHEEL, ""
            errors.append(
                f"{' '.join(pip)} exited {out.returncode}: {(out.stderr or out.stdout).strip()[-300:]}"
            )
    return None, "; ".join(dict.fromkeys(errors)) or "no pip found"


@functools.lru_cache(maxsize=None)
def _wheel_path() -> tuple[Optional[Path], str]:
    cache = _cache_dir()
    path = cache / NPU_WHEEL
    if not path.is_file():
        found, why = _download(cache)
        if found is None:
            return (
                None,
                f"torch-npu {NPU_VERSION} wheel could not be downloaded into {cache} (offline?): {why}",
            )
    if _sha256(path) != NPU_SHA256:
        return None, f"{path} is not the torch-npu {NPU_VERSION} wheel read for these tests (sha256 differs)"
    return path, ""


class Wheel:
    """Read-only view of a wheel: texts, Python ASTs, function signatures."""

    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)
        self.members = set(self.zip.namelist())

    def text(self, member: str) -> str:
        return self.zip.read(member).decode("utf-8", "replace")

    @functools.lru_cache(maxsize=None)  # noqa: B019 (one Wheel per test session)
    def tree(self, member: str) -> ast.Module:
        return ast.parse(self.text(member), filename=member)

    def module_member(self, dotted: str) -> Optional[str]:
        base = dotted.replace(".", "/")
        for cand in (f"{base}/__init__.py", f"{base}.py"):
            if cand in self.members:
                return cand
        return None

    def find_def(self, module: str, name: str, depth: int = 0) -> Optional[ast.FunctionDef]:
        """The ``def`` that ``module.name`` resolves to, following ``from . import`` chains."""
        member = self.module_member(module)
        if member is None or depth > 5:
            return None
        package = module if member.endswith("__init__.py") else module.rpartition(".")[0]
        stars = []
        for node in self.tree(member).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
            if isinstance(node, ast.ImportFrom):
                target = _absolute(package, node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        stars.append(target)
                    elif (alias.asname or alias.name) == name:
                        return self.find_def(target, alias.name, depth + 1)
        for target in stars:
            found = self.find_def(target, name, depth + 1)
            if found is not None:
                return found
        return None

    def calls(self, member: str, attr: str) -> list[ast.Call]:
        """Every call ``<anything>.attr(...)`` in ``member``."""
        return [
            n
            for n in ast.walk(self.tree(member))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
        ]


def _absolute(package: str, module: Optional[str], level: int) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = parts[: len(parts) - level + 1]
    return ".".join(base + ([module] if module else []))


_DEFAULT = object()


def signature_of(fn: ast.FunctionDef) -> inspect.Signature:
    """An inspect.Signature built from a parsed ``def`` (defaults are placeholders)."""
    a = fn.args
    P = inspect.Parameter
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [
        (x, P.POSITIONAL_OR_KEYWORD) for x in a.args
    ]
    n_required = len(positional) - len(a.defaults)
    params = [
        P(x.arg, kind, default=_DEFAULT if i >= n_required else P.empty)
        for i, (x, kind) in enumerate(positional)
    ]
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    for x, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(P(x.arg, P.KEYWORD_ONLY, default=P.empty if d is None else _DEFAULT))
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def _shape(sig: inspect.Signature) -> list[tuple[str, Any, bool]]:
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in sig.parameters.values()]


@pytest.fixture(scope="module")
def wheel() -> Iterator[Wheel]:
    path, why = _wheel_path()
    if path is None:
        pytest.skip(why)
    whl = Wheel(path)
    yield whl
    whl.zip.close()


@pytest.fixture(scope="module")
def hccl():
    return hwdist.get_driver("hccl")


# ---- what the wheel says ---------------------------------------------------------------------

PG_HEADER = "torch_npu/include/torch_npu/csrc/distributed/ProcessGroupHCCL.hpp"
HCCL_TYPES = "torch_npu/include/third_party/hccl/inc/hccl/hccl_types.h"
REGISTRY = "torch_npu/_init/registry/distributed.py"
DEVICE_REGISTRY = "torch_npu/_init/registry/backend.py"
COMPAT = "torch_npu/_compat/distributed.py"
PATCHES = "torch_npu/_init/patches/distributed_patches.py"
GATHER = "torch_npu/distributed/distributed_c10d.py"

# hwdist op -> the c10d Backend methods ProcessGroupHCCL must override for it.
C10D_METHODS = {
    "all_reduce": ("allreduce",),
    "broadcast": ("broadcast",),
    "all_gather": ("allgather", "_allgather_base"),
    "reduce": ("reduce",),
    "reduce_scatter": ("reduce_scatter", "_reduce_scatter_base"),
    "all_to_all": ("alltoall", "alltoall_base"),
    "send": ("send",),
    "recv": ("recv",),
    "barrier": ("barrier",),
    "gather": ("gather",),
    "scatter": ("scatter",),
}
# torch dtype name -> HCCL enum suffix it travels as (torch_npu carries bool as UINT8).
HCCL_DTYPES = {
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BFP16",
    "float32": "FP32",
    "float64": "FP64",
    "bool": "UINT8",
}
HCCL_REDUCE = {"sum": "SUM", "product": "PROD", "min": "MIN", "max": "MAX", "avg": "AVG"}


def test_the_wheel_is_the_release_read(wheel):
    meta = wheel.text(f"torch_npu-{NPU_VERSION}.dist-info/METADATA")
    assert re.search(r"^Name: torch[-_]npu$", meta, re.M | re.I)
    assert re.search(rf"^Version: {re.escape(NPU_VERSION)}$", meta, re.M)


def test_vendor_package_and_device_module(wheel, hccl):
    assert wheel.module_member(hccl.vendor_module) == f"{hccl.vendor_module}/__init__.py"
    # importing torch_npu renames privateuse1 and registers torch.<device_type> (what the fake mimics)
    renames = [c for c in wheel.calls(DEVICE_REGISTRY, "rename_privateuse1_backend")]
    assert [ast.literal_eval(c.args[0]) for c in renames] == [hccl.device_type]
    modules = wheel.calls(DEVICE_REGISTRY, "_register_device_module")
    assert [ast.literal_eval(c.args[0]) for c in modules] == [hccl.device_type]
    assert ast.unparse(modules[0].args[1]) == f"{hccl.vendor_module}.{hccl.device_type}"


def test_backend_name_devices_and_process_group_creation(wheel, hccl):
    regs = {ast.literal_eval(c.args[0]): c for c in wheel.calls(REGISTRY, "register_backend")}
    assert hccl.torch_name in regs, f"torch_npu no longer registers '{hccl.torch_name}': {sorted(regs)}"
    kw = {k.arg: k.value for k in regs[hccl.torch_name].keywords}
    # torch maps the device type to the backend (default backend for npu tensors, object collectives)
    assert ast.literal_eval(kw["devices"]) == [hccl.device_type]
    # torch calls the creator as creator(dist_backend_opts, pg_options): hwdist registers nothing itself
    assert ast.literal_eval(kw["extended_api"]) is True
    creator = regs[hccl.torch_name].args[1]
    assert isinstance(creator, ast.Lambda) and len(creator.args.args) == 2
    assert hccl.process_group_factory is None
    assert f'HCCL_BACKEND_NAME = "{hccl.torch_name}"' in wheel.text(PG_HEADER)


def test_declared_native_ops_are_process_group_methods(wheel, hccl):
    header = wheel.text(PG_HEADER)
    declared = set(re.findall(r"intrusive_ptr<c10d::Work>\s+(\w+)\(", header))
    for op in sorted(hccl.native_ops):
        missing = [m for m in C10D_METHODS[op] if m not in declared]
        assert not missing, f"hccl declares '{op}' native but ProcessGroupHCCL.hpp lacks {missing}"


def test_gather_is_emulated_as_torch_npu_does(wheel, hccl):
    aliases = ast.literal_eval(
        next(
            n.value
            for n in wheel.tree(PATCHES).body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_PUBLIC_API_ALIASES"
        )
    )
    assert ("distributed.gather", "distributed.distributed_c10d._gather") in aliases
    gather = wheel.find_def("torch_npu.distributed.distributed_c10d", "_gather")
    assert gather is not None and "allgather" in ast.unparse(gather)
    assert "gather" not in hccl.native_ops and hccl.plan("gather", torch.float32).native_op == "all_gather"


def test_declared_dtypes_and_reduce_ops_exist_in_hccl(wheel, hccl):
    types_h = wheel.text(HCCL_TYPES)
    enum = set(re.findall(r"HCCL_DATA_TYPE_(\w+)\s*=", types_h))
    reduce_enum = set(re.findall(r"HCCL_REDUCE_(\w+)\s*=", types_h))
    for name in hccl.capabilities()["dtypes"]:
        assert HCCL_DTYPES[name] in enum, (
            f"hccl declares {name}; hccl_types.h has no HCCL_DATA_TYPE_{HCCL_DTYPES[name]}"
        )
    for op in hccl.reduce_ops:
        assert HCCL_REDUCE[op] in reduce_enum, f"hccl declares reduce op {op}; hccl_types.h lacks it"
    assert "AVG" not in reduce_enum and "avg" not in hccl.reduce_ops


def _device_id_refusal(helper: ast.FunctionDef, where: str) -> Any:
    """The compiled condition under which ``helper`` raises for its ``device_id`` argument."""
    assert "device_id" in signature_of(helper).parameters, f"{where}: no device_id parameter"
    check = next(
        n.test
        for n in ast.walk(helper)
        if isinstance(n, ast.If)
        and "device_id" in ast.unparse(n.test)
        and any(isinstance(s, ast.Raise) for s in n.body)
    )
    return compile(ast.Expression(check), where, "eval")


@pytest.mark.parametrize("where", ["torch_npu", "torch"])
def test_device_id_binds_without_eager_init(wheel, hccl, recorded, where):
    """torch_npu carries its own copy of torch's process-group helper for torch < 2.14; both must
    accept the device_id hwdist passes (bound to the group, no eager communicator), and hwdist
    must pass none where the installed torch would refuse it."""
    passed = recorded["device_id"]  # what hccl.device_id(2) returned with the fake torch.npu
    assert passed in (None, [hccl.device_type, 2])
    if where == "torch_npu":
        helper = next(
            n
            for n in ast.walk(wheel.tree(COMPAT))
            if isinstance(n, ast.FunctionDef) and n.name == "_new_process_group_helper"
        )
    else:
        from torch.distributed import distributed_c10d

        if not _compat.INIT_HAS_DEVICE_ID:
            assert passed is None, f"torch {torch.__version__} has no device_id, hwdist passed {passed}"
            return
        source = inspect.getsource(distributed_c10d._new_process_group_helper)
        helper = ast.parse(inspect.cleandoc("\n" + source)).body[0]
    refuses = _device_id_refusal(helper, where)
    if not eval(refuses, {}, {"device_id": types.SimpleNamespace(type="cpu", index=0)}):
        # this torch refuses no device type (torch 2.15's helper): hwdist passes the npu device_id
        assert where == "torch" and passed == [hccl.device_type, 2], (where, torch.__version__, passed)
        return
    assert "bound_device_id = device_id" in ast.unparse(helper)
    npu = types.SimpleNamespace(type=hccl.device_type, index=2)
    if eval(refuses, {}, {"device_id": npu}):
        # torch 2.3-2.4 take only CUDA devices: hwdist passes none (set_device binds the device)
        assert where == "torch" and passed is None, f"{where} refuses device_id={npu}; hwdist passed {passed}"
    elif where == "torch":
        assert passed == [hccl.device_type, 2], "torch takes an npu device_id, hwdist should pass it"
    # the torch_npu wheel's copy serves torch >= 2.13, where hwdist passes device_id
    header = wheel.text(PG_HEADER)
    assert "supportsSplitting" not in header or "eagerConnectSingleDevice" in header


def test_object_collective_device_rules(wheel, hccl):
    # hwdist's portable object path moves uint8 bytes on comm_device() (an npu device)
    assert "UINT8" in re.findall(r"HCCL_DATA_TYPE_(\w+)\s*=", wheel.text(HCCL_TYPES))
    assert not hccl.plan("all_gather", torch.uint8).cast
    # torch_npu replaces torch's gather_object, so torch's own object path is not the same
    # code on NPU: the driver keeps hwdist's portable path everywhere
    assert "distributed.gather_object" in wheel.text(PATCHES)
    assert hccl.native_object_collectives is False


# ---- the device API hwdist calls, and the fake ------------------------------------------------

_RECORD = r"""
import importlib.machinery, json, sys, types, torch
from tests.test_detection import FakeDeviceModule
calls = []
class Recorder:
    def __init__(self, fake):
        self._fake = fake
    def __getattr__(self, name):
        attr = getattr(self._fake, name)  # AttributeError: hwdist uses something the fake lacks
        def record(*args, **kwargs):
            calls.append([name, len(args), sorted(kwargs)])
            return attr(*args, **kwargs)
        return record if callable(attr) else attr
mod = types.ModuleType('torch_npu'); mod.__spec__ = importlib.machinery.ModuleSpec('torch_npu', None)
sys.modules['torch_npu'] = mod
torch.utils.rename_privateuse1_backend('npu')
torch.npu = Recorder(FakeDeviceModule(4))
import hwdist
drv = hwdist.get_driver('hccl')
assert hwdist.detect().backend == 'hccl'
drv.set_device(5)
dev = drv.device_id(2)
drv.comm_device(); drv.current_device(); drv.is_initialized()
try:
    hwdist.check_fork_safe('fork')
except RuntimeError:
    pass
drv.synchronize()  # what the benchmark timer calls
print(json.dumps({'calls': calls, 'device_id': None if dev is None else [dev.type, dev.index]}))
"""


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _RECORD], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_device_call_hwdist_makes_binds_to_torch_npu(wheel, recorded):
    used = {name for name, _, _ in recorded["calls"]}
    assert {"device_count", "set_device", "current_device"} <= used
    for name, nargs, kwargs in recorded["calls"]:
        fn = wheel.find_def("torch_npu.npu", name)
        assert fn is not None, f"hwdist calls torch.npu.{name}, which torch_npu {NPU_VERSION} does not define"
        try:
            signature_of(fn).bind(*range(nargs), **{k: None for k in kwargs})
        except TypeError as exc:
            pytest.fail(f"hwdist calls torch.npu.{name} with {nargs} positional {kwargs}; torch_npu: {exc}")


def test_the_fake_has_torch_npus_signatures(wheel):
    public = sorted(n for n, v in vars(FakeDeviceModule).items() if callable(v) and not n.startswith("_"))
    assert public, "FakeDeviceModule lost its methods"
    for name in public:
        real = wheel.find_def("torch_npu.npu", name)
        assert real is not None, f"FakeDeviceModule.{name} has no counterpart in torch_npu.npu"
        fake = list(inspect.signature(getattr(FakeDeviceModule, name)).parameters.values())[1:]
        assert _shape(inspect.Signature(fake)) == _shape(signature_of(real)), (
            f"FakeDeviceModule.{name}{inspect.Signature(fake)} drifted from"
            f" torch_npu.npu.{name}{signature_of(real)}"
        )


# ---------- the vendor capability tables ----------
# Vendor capability facts: every declared entry has a source, and the xccl driver on the real torch.

BEGIN = "<!-- vendor-sources:begin (generated by tests/drivers/test_vendors.py; do not edit by hand) -->"
END = "<!-- vendor-sources:end -->"
DTYPE_NAMES = (
    "bool uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64 complex64 complex128".split()
)
REDUCE_NAMES = sorted((set(REDUCE_OP_NAMES) - {"mean"}) | {"avg"})
# Entries a backend may decide besides those: a dtype of torch >= 2.3, a reduce op hwdist never issues.
OPTIONAL_NAMES = {"dtype": {"uint64"}, "reduce_op": {"premul_sum"}}


@pytest.mark.parametrize("backend", sorted(FACTS))
def test_driver_table_is_exactly_its_facts(backend):
    drv = hwdist.get_driver(backend)
    caps = table(backend)
    assert drv.native_ops == caps.native_ops
    assert drv.reduce_ops == caps.reduce_ops
    assert drv.dtypes == caps.dtypes
    assert drv.reduce_dtypes == caps.reduce_dtypes
    assert drv.inexact_reductions == caps.inexact


@pytest.mark.parametrize("backend", sorted(FACTS))
def test_every_entry_is_decided_once_with_a_source(backend):
    facts = FACTS[backend]
    for f in facts:
        assert f.kind in KINDS, f
        assert all(k in SOURCES for k in f.sources), f"{backend} {f.name}: unknown source {f.sources}"
        assert f.when == "" or f.when in CONDITIONS, f
        if not f.declared:
            assert f.note or f.sources, f"{backend} leaves out {f.name} without saying why"
        if f.when:  # a conditional fact refines an unconditional one (the conservative row)
            assert any(g.kind == f.kind and g.name == f.name and not g.when for g in facts), f
    seen = [(f.kind, f.name, f.when) for f in facts]
    assert len(seen) == len(set(seen)), f"{backend}: an entry is decided twice"
    plain = [(k, n) for k, n, w in seen if not w]

    def decided(kind: str) -> set[str]:
        return {n for k, n in plain if k == kind} - OPTIONAL_NAMES.get(kind, set())

    # nothing is left undecided: every op, dtype and reduce op hwdist knows has a fact
    assert decided("native_op") == set(ALL_OPS)
    assert decided("dtype") == set(DTYPE_NAMES)
    assert decided("reduce_op") == set(REDUCE_NAMES)
    if any(k == "reduce_dtype" for k, _ in plain):
        declared = {f.name for f in facts if f.kind == "dtype" and f.declared and not f.when}
        assert decided("reduce_dtype") - OPTIONAL_NAMES["dtype"] == declared


def test_every_source_is_cited():
    every = [f for table_ in (FACTS, ENGINE_FACTS) for facts in table_.values() for f in facts]
    cited = {k for f in every for k in f.sources}
    assert cited == set(SOURCES)


def render_vendor_sources() -> str:
    """The facts and their sources, as Markdown (docs/hardware.md)."""
    out = []
    for backend, facts in FACTS.items():
        drv = hwdist.get_driver(backend)
        out += [
            f"`{backend}` ({drv.vendor_module or 'built into torch'}):",
            "",
            "| kind | entries | declared | where | sources | what differs between releases |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        key = lambda f: (f.kind, f.declared, f.sources, f.note, f.when)  # noqa: E731
        for (kind, declared, sources, note, when), group in groupby(facts, key):
            names = ", ".join(f.name for f in group)
            cite = ", ".join(f"`{s}`" for s in sources) or "from documentation only"
            where = CONDITIONS[when].what if when else "always"
            out.append(
                f"| {kind} | {names} | {'yes' if declared else 'no'} | {where} | {cite} | {note or '-'} |"
            )
        out.append("")
    for backend, facts in ENGINE_FACTS.items():
        out += [
            f"`{backend}` engines of torch 2.15 (the table is the same for each):",
            "",
            "| kind | entries | declared | sources | note |",
            "| --- | --- | --- | --- | --- |",
        ]
        for f in facts:
            cite = ", ".join(f"`{s}`" for s in f.sources)
            out.append(f"| {f.kind} | {f.name} | {'yes' if f.declared else 'no'} | {cite} | {f.note} |")
        out.append("")
    out += ["| source | file | in | release | what was read |", "| --- | --- | --- | --- | --- |"]
    for name, s in SOURCES.items():
        out.append(f"| `{name}` | `{s.path}` | {s.where} | {s.release} | {s.what} |")
    return "\n".join(out)


def test_hardware_page_shows_the_vendor_sources():
    text = (ROOT / "docs" / "hardware.md").read_text()
    assert BEGIN in text and END in text, "docs/hardware.md lost its vendor-sources markers"
    current = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    expected = render_vendor_sources()
    assert current == expected, (
        "docs/hardware.md's vendor sources are out of date; replace the block between the markers with:\n\n"
        + expected
    )


# ---- xccl on the installed torch, no fakes ------------------------------------------------------


def _expected_xccl_reason() -> str | None:
    probe = getattr(dist, "is_xccl_available", None)  # torch >= 2.7
    if probe is None:
        return "this torch has no XCCL backend"
    if not probe():
        return "torch was built without XCCL"
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return "no xpu device is visible"
    return None


def test_xccl_availability_and_reason_on_the_real_torch():
    drv = hwdist.get_driver("xccl")
    expected = _expected_xccl_reason()
    reason = drv.unavailable_reason()
    if expected is None:
        assert reason is None and drv.is_available() and drv.device_count() == torch.xpu.device_count()
        return
    assert reason is not None and reason.startswith(expected), reason
    assert not drv.is_available() and drv.device_count() == 0
    with pytest.raises(RuntimeError, match=re.escape(f"backend 'xccl' cannot bind a device: {reason}")):
        drv.set_device(0)
    assert drv.device_id(0) is None
    xpu_init = getattr(getattr(torch, "xpu", None), "is_initialized", None)
    assert drv.is_initialized() == (bool(xpu_init()) if xpu_init else False)
    assert hwdist.detect().backend != "xccl"


def test_xccl_names_agree_with_torchs_own_registration():
    """Where torch knows XCCL (>= 2.7), it maps the same backend name to the same device type."""
    if not hasattr(dist.Backend, "XCCL"):
        pytest.skip(f"torch {torch.__version__} has no Backend.XCCL (added in torch 2.7)")
    drv = hwdist.get_driver("xccl")
    assert dist.Backend.XCCL == drv.torch_name
    assert drv.torch_name in dist.Backend.backend_list
    default_map = getattr(dist.Backend, "default_device_backend_map", {})
    assert default_map.get(drv.device_type) == drv.torch_name


def test_xccl_plans_on_the_real_torch():
    drv = hwdist.get_driver("xccl")
    dtypes = [getattr(torch, n) for n in DTYPE_NAMES]
    for op, dtype in itertools.product(sorted(ALL_OPS - {"barrier"}), dtypes):
        for rop in REDUCE_OP_NAMES if op in REDUCE_OPS else (None,):
            try:
                plan = drv.plan(op, dtype, rop)
            except PlanError as exc:
                assert "backend 'xccl'" in str(exc)
                continue
            assert isinstance(plan, Plan) and plan.native_op == op  # XCCL implements every op
    mean = drv.plan("all_reduce", torch.float32, "mean")
    assert (mean.reduce_op, mean.post) == ("sum", Post.DIVIDE)  # no avg: it depends on the oneCCL version
    assert drv.plan("all_reduce", torch.int16, "sum").comm_dtype == torch.int32  # no int16 in XCCL
    cplx = drv.plan("all_reduce", torch.complex64, "sum")
    assert cplx.view and cplx.comm_dtype == torch.float32
    assert drv.plan("all_gather", torch.complex128).comm_dtype == torch.uint8
    assert drv.plan("all_reduce", torch.bool, "sum").reduce_op == "max"


# ---- gaudi: Intel Gaudi's HCCL, read from its bridge's source and Intel's documentation ------------------


def test_gaudi_names_agree_with_what_its_bridge_registers():
    """habana_frameworks is not on PyPI, so no contract test can read the package: these check the
    driver against what its source registers (read on GitHub, not run): 'hccl' on 'hpu', the torch
    name Ascend's driver has on 'npu'; the two resolve by device type."""
    drv = hwdist.get_driver("gaudi")
    what = SOURCES["hpu-register"].what
    assert "register_backend('hccl'" in what and "devices=['hpu']" in what
    assert (drv.torch_name, drv.device_type) == ("hccl", "hpu")
    assert drv.process_group_factory is None and drv.vendor_module == "habana_frameworks.torch"
    ascend = hwdist.get_driver("hccl")
    assert (ascend.torch_name, ascend.device_type) == ("hccl", "npu")
    assert hwdist.get_driver("hccl", "hpu") is drv and hwdist.get_driver("hccl", "npu") is ascend
    assert drv.unavailable_reason() == "the Python package 'habana_frameworks.torch' is not installed"


def test_gaudi_table_comes_from_source_and_documentation_not_from_a_run():
    for fact in FACTS["gaudi"]:
        assert fact.sources, fact
        for key in fact.sources:
            src = SOURCES[key]
            assert "(read, not run)" in src.release or "documentation only" in src.where, (key, src)
    assert any("documentation only" in SOURCES[k].where for f in FACTS["gaudi"] for k in f.sources)
    text = (ROOT / "docs" / "hardware.md").read_text()
    assert "nothing in it has\nrun on a Gaudi" in text or "nothing in it has run on a Gaudi" in text


def test_gaudi_plans_never_reduce_through_a_lossy_cast():
    drv = hwdist.get_driver("gaudi")
    mean = drv.plan("all_reduce", torch.float16, "mean")  # widened by hwdist, as the bridge would
    assert (mean.comm_dtype, mean.reduce_op, mean.post) == (torch.float32, "sum", Post.DIVIDE)
    for dtype in (torch.int32, torch.int64):  # the bridge reduces them in float32, which loses values
        for rop in ("max", "sum"):
            with pytest.raises(PlanError, match="backend 'gaudi'"):
                drv.plan("all_reduce", dtype, rop)
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.bool):  # every value is a float32: exact order
        found = drv.plan("all_reduce", dtype, "max")
        assert (found.comm_dtype, found.view, found.reduce_op) == (torch.float32, False, "max")
        with pytest.raises(PlanError, match="backend 'gaudi'"):  # a sum of them may leave float32's range
            drv.plan("all_reduce", dtype, "sum" if dtype != torch.bool else "bxor")
    with pytest.raises(PlanError, match="reduce op not supported"):
        drv.plan("all_reduce", torch.float32, "product")
    assert drv.plan("all_gather", torch.int64).view and drv.plan("broadcast", torch.float64).view
    assert drv.plan("gather", torch.float32).native_op == "gather"
