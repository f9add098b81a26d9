"""Detection and driver decisions with vendor packages FAKED in sys.modules.

We have no Ascend, Cambricon or NVIDIA hardware in CI: these tests fake the
vendor module (``torch_npu``, ``torch_mlu``) and the ``torch.<device>`` module
to check each driver's decisions (availability, priority, binding by local
rank). They never mock torch.distributed.
"""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import types

import pytest
import torch

import hwdist
from hwdist.detect import ENV_BACKEND, ENV_DEVICE


class FakeDeviceModule:
    """Stands in for torch.npu / torch.mlu / torch.cuda.

    Its methods are exactly the device API hwdist uses, with torch_npu's signatures:
    tests/unit/test_vendor_contract.py checks them against the real torch_npu wheel.
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


def fake_vendor(monkeypatch, module_name: str, device_type: str, count: int) -> FakeDeviceModule:
    mod = types.ModuleType(module_name)
    mod.__spec__ = importlib.machinery.ModuleSpec(module_name, None)
    monkeypatch.setitem(sys.modules, module_name, mod)
    dev = FakeDeviceModule(count)
    monkeypatch.setattr(torch, device_type, dev, raising=False)
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


def test_fake_ascend_wins_over_cuda(monkeypatch):
    fake_vendor(monkeypatch, "torch_npu", "npu", 8)
    # torch_npu can make CUDA look available; Ascend must still win.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
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
        "from tests.unit.test_detect import FakeDeviceModule\n"
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
    """No duck typing and no os.environ in detect.py: the driver says its compute device, settings the
    overrides.
    """
    import inspect

    from hwdist import detect as detect_mod
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
