"""Detection and driver decisions with vendor packages FAKED in sys.modules.

We have no Ascend, Cambricon or NVIDIA hardware in CI: these tests fake the
vendor module (``torch_npu``, ``torch_mlu``) and the ``torch.<device>`` module
to check each driver's decisions (availability, priority, binding by local
rank). They never mock torch.distributed.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import types

import pytest
import torch

import hwdist
from hwdist import _compat
from hwdist.detection import ENV_BACKEND, ENV_DEVICE


class FakeDeviceModule:
    """Stands in for torch.npu / torch.mlu / torch.cuda.

    Its methods are exactly the device API hwdist uses, with torch_npu's signatures:
    tests/drivers/test_vendors.py checks them against the real torch_npu wheel.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.current = 0
        self.bound: list[int] = []
        self.synced = 0

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def set_device(self, device: int) -> None:
        self.bound.append(device)
        self.current = device

    def current_device(self) -> int:
        return self.current

    def is_initialized(self) -> bool:
        return bool(self.bound)

    def synchronize(self, device: object = None) -> None:
        self.synced += 1


def fake_vendor(
    monkeypatch, module_name: str, device_type: str, count: int, accelerator: bool = True
) -> FakeDeviceModule:
    """A vendor package and its ``torch.<device_type>`` module; with ``accelerator``, torch >= 2.6 names
    its device as the accelerator, as it does once an extension registers its device with torch (torch_npu
    renames PrivateUse1 to 'npu', which torch then names even on a CUDA build).
    """
    mod = types.ModuleType(module_name)
    mod.__spec__ = importlib.machinery.ModuleSpec(module_name, None)
    monkeypatch.setitem(sys.modules, module_name, mod)
    dev = FakeDeviceModule(count)
    monkeypatch.setattr(torch, device_type, dev, raising=False)
    if accelerator and hasattr(torch, "accelerator"):  # torch >= 2.6
        monkeypatch.setattr(_compat, "_current_accelerator", lambda: types.SimpleNamespace(type=device_type))
    return dev


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch):
    monkeypatch.delenv(ENV_BACKEND, raising=False)
    monkeypatch.delenv(ENV_DEVICE, raising=False)


def test_cpu_machine_detects_gloo():
    det = hwdist.detect()
    assert (det.device_type, det.backend, det.source) == ("cpu", "gloo", "auto")
    assert not det.overridden
    assert hwdist.get_device() == "cpu"


def test_missing_vendor_package_is_the_reason():
    assert hwdist.get_driver("hccl").unavailable_reason() == "the Python package 'torch_npu' is not installed"
    assert hwdist.get_driver("cncl").unavailable_reason() == "the Python package 'torch_mlu' is not installed"
    assert hwdist.get_driver("hccl").device_count() == 0


@pytest.mark.parametrize("torch_names_it", [True, False], ids=["torch.accelerator", "driver-priority"])
def test_fake_ascend_wins_over_cuda(monkeypatch, torch_names_it):
    fake_vendor(monkeypatch, "torch_npu", "npu", 8)
    if torch_names_it:
        monkeypatch.setattr(_compat, "_current_accelerator", lambda: types.SimpleNamespace(type="npu"))
    else:  # torch < 2.6, or an extension torch was not told about: the drivers' priority decides
        monkeypatch.setattr(_compat, "_current_accelerator", None)
    # torch_npu can make CUDA look available; Ascend must still win.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    det = hwdist.detect()
    assert (det.device_type, det.backend, det.device_count) == ("npu", "hccl", 8)
    assert hwdist.get_device() == "npu"


def test_fake_mlu_detected(monkeypatch):
    fake_vendor(monkeypatch, "torch_mlu", "mlu", 4)
    det = hwdist.detect()
    assert (det.device_type, det.backend) == ("mlu", "cncl")


def test_device_bound_by_local_rank_modulo_count():
    """Runs in a subprocess: like torch_npu, the fake renames torch's privateuse1 device
    to 'npu' (process-global, so it must not leak into other tests)."""
    code = (
        "import sys, types, importlib.machinery, torch\n"
        "from tests.test_detection import FakeDeviceModule\n"
        "mod = types.ModuleType('torch_npu'); mod.__spec__ = importlib.machinery.ModuleSpec('torch_npu',"
        " None)\n"
        "sys.modules['torch_npu'] = mod\n"
        "torch.utils.rename_privateuse1_backend('npu')\n"
        "dev = FakeDeviceModule(4); torch.npu = dev\n"
        "import hwdist\n"
        "drv = hwdist.get_driver('hccl')\n"
        "drv.set_device(5)\n"
        "assert dev.bound == [1], dev.bound\n"
        "assert drv.current_device() == torch.device('npu', 1)\n"
        "assert drv.comm_device() == torch.device('npu', 1)\n"
        "from hwdist import _compat  # torch 2.3-2.4 take only a CUDA device_id: hwdist passes none there\n"
        "assert drv.device_id(2) == (torch.device('npu', 2) if _compat.init_accepts_device_id('npu') else"
        " None)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_binding_without_device_is_clear():
    with pytest.raises(
        RuntimeError, match="backend 'hccl' cannot bind a device: the Python package 'torch_npu'"
    ):
        hwdist.get_driver("hccl").set_device(0)


def test_broken_vendor_install_does_not_crash_detection(monkeypatch):
    mod = types.ModuleType("torch_mlu")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_mlu", None)
    monkeypatch.setitem(sys.modules, "torch_mlu", None)  # import of it raises ImportError
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: mod.__spec__ if name == "torch_mlu" else None
    )
    reason = hwdist.get_driver("cncl").unavailable_reason()
    assert reason is not None and reason.startswith("importing 'torch_mlu' failed")
    assert hwdist.detect().backend == "gloo"


def test_backend_override(monkeypatch):
    monkeypatch.setenv(ENV_BACKEND, "gloo")
    det = hwdist.detect()
    assert (det.backend, det.source, det.overridden) == ("gloo", ENV_BACKEND, True)


def test_backend_override_unavailable_is_clear(monkeypatch):
    monkeypatch.setenv(ENV_BACKEND, "hccl")
    with pytest.raises(hwdist.BackendError) as info:
        hwdist.detect()
    msg = str(info.value)
    assert "HWDIST_BACKEND='hccl' names a backend that is not available here" in msg
    assert "torch_npu" in msg and "Available: gloo" in msg


def test_backend_override_unknown_is_clear(monkeypatch):
    monkeypatch.setenv(ENV_BACKEND, "foo")
    with pytest.raises(hwdist.BackendError, match="unknown backend 'foo'; registered:"):
        hwdist.detect()


def test_device_override(monkeypatch):
    fake_vendor(monkeypatch, "torch_npu", "npu", 2)
    monkeypatch.setenv(ENV_DEVICE, "cpu")
    det = hwdist.detect()
    assert (det.device_type, det.backend, det.source) == ("cpu", "gloo", ENV_DEVICE)


def test_device_override_unavailable_is_clear(monkeypatch):
    monkeypatch.setenv(ENV_DEVICE, "mlu")
    with pytest.raises(
        hwdist.BackendError,
        match=r"HWDIST_DEVICE='mlu' is not available here \(cncl: the Python package 'torch_mlu'",
    ):
        hwdist.detect()
    monkeypatch.setenv(ENV_DEVICE, "quantum")
    with pytest.raises(hwdist.BackendError, match="known device types: cpu, cuda"):
        hwdist.detect()


def test_conflicting_overrides(monkeypatch):
    monkeypatch.setenv(ENV_BACKEND, "gloo")
    monkeypatch.setenv(ENV_DEVICE, "npu")
    with pytest.raises(
        hwdist.BackendError, match="conflicts with HWDIST_BACKEND='gloo', which runs on 'cpu'"
    ):
        hwdist.detect()


def test_import_hwdist_is_clean():
    """`import hwdist` imports no vendor package and initialises no device or group."""
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import hwdist\n"
        "new = set(sys.modules) - before\n"
        "bad = sorted(m for m in new if m.split('.')[0] in"
        " ('torch_npu','torch_mlu','torch_musa','mpi4py','hwdist_mpi'))\n"
        "assert not bad, bad\n"
        "assert not torch.distributed.is_initialized()\n"
        "assert 'hwdist.testing' not in sys.modules\n"
        "import torch.distributed as d\n"
        "assert 'emu' not in d.Backend.backend_list and 'hwdist_mpi' not in d.Backend.backend_list\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


def test_detection_asks_the_driver_and_reads_settings(monkeypatch):
    """No duck typing and no os.environ in hwdist/detection.py: the driver says its compute device, settings
    the overrides.
    """
    import inspect

    from hwdist import detection as detect_mod
    from hwdist.drivers.gloo import GlooDriver

    source = inspect.getsource(detect_mod)
    assert "os.environ" not in source and "getattr(" not in source
    monkeypatch.setattr(GlooDriver, "compute_device_type", lambda self: "mps")
    monkeypatch.delenv("HWDIST_BACKEND", raising=False)
    monkeypatch.delenv("HWDIST_DEVICE", raising=False)
    if hwdist.detect().backend == "gloo":  # a CPU machine
        assert hwdist.get_device() == "mps"
    monkeypatch.setenv("HWDIST_BACKEND", "  gloo ")  # read through hwdist.settings: stripped
    assert hwdist.detect().source == "HWDIST_BACKEND"


# ---- hwdist.detect is the function, hwdist.detection its module ------------------------------------


def test_the_function_and_its_module_do_not_hide_each_other(monkeypatch):
    import importlib
    from unittest import mock

    module = importlib.import_module("hwdist.detection")
    assert isinstance(module, types.ModuleType)
    assert callable(hwdist.detect) and hwdist.detect is module.detect
    import hwdist.detection as by_import

    assert by_import is module
    # mock.patch walks the dotted path: it must reach the module the function reads
    monkeypatch.setenv("MY_BACKEND_VARIABLE", "gloo")
    with mock.patch("hwdist.detection.ENV_BACKEND", "MY_BACKEND_VARIABLE"):
        assert hwdist.detect().source == "MY_BACKEND_VARIABLE"
    assert hwdist.detect().source == "auto"


# ---- detection initialises no CUDA driver ----------------------------------------------------------


class FakeCuda:
    """Stands in for torch.cuda on a CPU machine, with torch's fork rules (torch/cuda/__init__.py, 2.13):
    ``is_available()`` calls cudaGetDeviceCount, which initialises the CUDA driver, unless
    PYTORCH_NVML_BASED_CUDA_CHECK=1; ``device_count()`` counts through NVML without initialising it;
    ``init()`` / ``_lazy_init()`` initialise. Every initialising call is recorded.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.initialised: list[str] = []

    def is_available(self) -> bool:
        self.initialised.append("is_available")
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def init(self) -> None:
        self.initialised.append("init")

    def _lazy_init(self) -> None:
        self.initialised.append("_lazy_init")

    def is_initialized(self) -> bool:
        return bool(self.initialised)


@pytest.mark.parametrize("torch_accelerator", [True, False], ids=["torch.accelerator", "torch<2.6"])
def test_detect_does_not_initialise_cuda(monkeypatch, torch_accelerator):
    """A fake torch.cuda on this CPU machine (no GPU here): detection finds its 2 devices, through
    torch.accelerator (torch >= 2.6) or the drivers' priority walk (older torch), and never makes the
    calls that initialise the CUDA driver. The real fork check on a GPU: docs/hardware.md.
    """
    import torch.distributed as dist

    cuda = FakeCuda(2)
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    asked: list[object] = []

    def current_accelerator(check_available: bool = False) -> torch.device:
        asked.append(check_available)  # check_available=True would call cuda.is_available()
        return torch.device("cuda")

    monkeypatch.setattr(_compat, "_current_accelerator", current_accelerator if torch_accelerator else None)
    det = hwdist.detect()
    assert (det.device_type, det.backend, det.device_count) == ("cuda", "nccl", 2)
    assert ("torch.accelerator" in det.reason) == torch_accelerator, det.reason
    assert asked == ([False] if torch_accelerator else [])
    assert cuda.initialised == [], f"detect() initialised CUDA through {cuda.initialised}"
    assert not hwdist.get_driver("nccl").is_initialized()
    # the fake does notice an initialising call (so the test above can fail)
    torch.cuda.is_available()
    assert cuda.initialised == ["is_available"]


def test_torch_accelerator_without_devices_falls_back_to_the_drivers(monkeypatch):
    """torch built for an accelerator (a CUDA wheel) on a machine without one: gloo, no CUDA call."""
    import torch.distributed as dist

    cuda = FakeCuda(0)
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(_compat, "_current_accelerator", lambda: torch.device("cuda"))
    det = hwdist.detect()
    assert (det.device_type, det.backend, det.source) == ("cpu", "gloo", "auto")
    assert cuda.initialised == []


def test_torch_accelerator_picks_the_device_over_driver_priority(monkeypatch):
    """torch names the accelerator; hwdist's priority only orders the drivers for that device. An MLU
    package present but not what torch was set up for does not take over (it would by priority alone).
    """
    import torch.distributed as dist

    fake_vendor(monkeypatch, "torch_mlu", "mlu", 4)
    monkeypatch.setattr(torch, "cuda", FakeCuda(2))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(_compat, "_current_accelerator", lambda: torch.device("cuda"))
    assert hwdist.detect().backend == "nccl"
    monkeypatch.setattr(_compat, "_current_accelerator", None)  # torch < 2.6: priority decides
    assert hwdist.detect().backend == "cncl"


def test_accelerator_type_on_this_torch():
    """What torch.accelerator says here (a CPU build: nothing); None on torch < 2.6."""
    accel = getattr(torch, "accelerator", None)
    expected = accel.current_accelerator() if accel is not None else None
    assert _compat.accelerator_type() == (None if expected is None else expected.type)


_FORK_PROBE = r"""
import os, torch
import hwdist
{call}
pid = os.fork()
if pid == 0:
    os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
_, status = os.waitpid(pid, 0)
print(os.WEXITSTATUS(status))
"""


@pytest.mark.skipif(
    not torch.backends.cuda.is_built() or not hasattr(os, "fork"),
    reason="needs a CUDA build of torch (this one has no CUDA) and os.fork",
)
def test_a_child_forked_after_detect_can_still_use_cuda():
    """On a CUDA build of torch (a GPU is not needed): after ``detect()`` a forked child is not in torch's
    "bad fork" state, where its first CUDA call raises "Cannot re-initialize CUDA in forked subprocess";
    after ``torch.cuda.is_available()`` it is. CUDA_VISIBLE_DEVICES is empty, so torch's own count needs
    neither NVML nor the CUDA runtime (on a machine without NVML it falls back to the runtime).
    """
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HWDIST_BACKEND": "", "HWDIST_DEVICE": ""}
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    for call, bad in (("hwdist.detect(); hwdist.get_driver('nccl').is_available()", "0"),
                      ("torch.cuda.is_available()", "3")):
        out = subprocess.run(
            [sys.executable, "-c", _FORK_PROBE.format(call=call)],
            capture_output=True, text=True, timeout=120, env=env,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == bad, (call, out.stdout, out.stderr)


def test_a_device_only_torch_knows_gets_the_backend_torch_uses_on_it():
    """A vendor extension hwdist has no driver for: its device registered with torch (PrivateUse1 renamed,
    a device module), its backend registered only with torch. torch >= 2.6 names the device, and detection
    takes the backend torch would use there, through a generic driver; older torch cannot name the device
    and detection falls back to gloo. In a subprocess: the renaming is process-global.
    """
    code = (
        "import torch, torch.distributed as dist\n"
        "from tests.test_detection import FakeDeviceModule\n"
        "torch.utils.rename_privateuse1_backend('foo')\n"
        "torch._register_device_module('foo', FakeDeviceModule(3))\n"
        "def creator(*args):\n"
        "    raise RuntimeError('no group is created in this test')\n"
        "dist.Backend.register_backend('fooccl', creator, devices=['foo'])\n"
        "import hwdist\n"
        "d = hwdist.detect()\n"
        "print(d.device_type, d.backend, d.device_count, hwdist.get_device())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWDIST_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    expected = "foo fooccl 3 foo" if hasattr(torch, "accelerator") else "cpu gloo 1 cpu"
    assert out.stdout.strip() == expected
