"""Helpers shared by the built-in drivers (device modules, vendor imports)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Optional

import torch

from .. import _compat
from .base import Driver


def vendor_missing(module: str) -> Optional[str]:
    """A reason string if ``module`` cannot be imported, else None (no import)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"the Python package '{module}' is not installed"


def torch_build_reason(available: str, library: str) -> Optional[str]:
    """Why a backend built into torch cannot run here, or None: this torch is not supported by hwdist,
    or it was built without ``library`` (``torch.distributed.<available>()`` says so)."""
    unsupported = _compat.unsupported_reason()
    if unsupported is not None:
        return unsupported
    import torch.distributed as dist

    if not getattr(dist, available)():
        return f"torch was built without {library}"
    return None


def package_version(module: str) -> Optional[str]:
    """The installed distribution version of ``module`` (read from its metadata, not imported), or None."""
    from importlib import metadata

    if vendor_missing(module) is not None:
        return None
    for dist in (module, module.replace("_", "-")):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


class AcceleratorDriver(Driver):
    """A driver for a device with a ``torch.<device_type>`` module.

    Subclasses set ``device_type`` and, when the device comes from a vendor
    extension, ``vendor_module``; the module is imported only when the driver
    is asked about the device, never at ``import hwdist``.
    """

    # Availability is the device module's count, never its is_available(): torch.cuda.is_available()
    # initialises the CUDA driver (cudaGetDeviceCount) unless PYTORCH_NVML_BASED_CUDA_CHECK=1, and a process
    # forked afterwards cannot use CUDA; torch.cuda.device_count() counts through NVML without initialising
    # it (torch falls back to the CUDA runtime only where NVML cannot count: no libnvidia-ml, MIG UUIDs in
    # CUDA_VISIBLE_DEVICES). It is torch's own check under PYTORCH_NVML_BASED_CUDA_CHECK=1, and what
    # torch.xpu.is_available() is (count > 0). A vendor module's count may raise where it finds no device.

    # One rank binds one device: NCCL refuses two ranks on one GPU at init ("Duplicate GPU
    # detected", seen on an H100 with NCCL 2.28); the vendor libraries bind one device per rank too.
    ranks_per_device = 1

    def _module(self) -> Any:
        if self.vendor_module is not None:
            importlib.import_module(self.vendor_module)
        return getattr(torch, self.device_type, None)

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        if self.vendor_module is not None:
            missing = vendor_missing(self.vendor_module)
            if missing:
                return missing
        try:
            mod = self._module()
        except Exception as exc:  # a broken vendor install must not crash detection
            return f"importing '{self.vendor_module}' failed: {exc}"
        if mod is None:
            return f"no {self.device_type} device is visible (this torch has no torch.{self.device_type})"
        try:
            count = int(mod.device_count())
        except Exception as exc:  # some vendor modules raise where no device is found
            return f"no {self.device_type} device is visible (torch.{self.device_type}.device_count(): {exc})"
        if count <= 0:
            return f"no {self.device_type} device is visible"
        return None

    def device_count(self) -> int:
        """Number of devices of ``device_type`` visible to this process (CUDA: through NVML, no init)."""
        if self.unavailable_reason() is not None:
            return 0
        return int(self._module().device_count())

    def is_initialized(self) -> bool:
        """Whether ``torch.<device_type>.is_initialized()`` says so (never imports the vendor package)."""
        if self.vendor_module is not None and self.vendor_module not in sys.modules:
            return False  # the vendor extension was never imported: its device cannot be initialised
        fn = getattr(getattr(torch, self.device_type, None), "is_initialized", None)
        if fn is None:
            return False
        try:
            return bool(fn())
        except Exception:  # a broken vendor install must not crash the check
            return False

    def synchronize(self) -> None:
        """``torch.<device_type>.synchronize()``: wait for this device's queued work."""
        fn = getattr(self._module(), "synchronize", None)
        if callable(fn):
            fn()

    def details(self) -> dict[str, Any]:
        """The vendor package's version (read without importing it) and the visible devices' names."""
        facts: dict[str, Any] = {}
        vendor = self.vendor_module
        version = package_version(vendor) if vendor is not None else None
        if vendor is not None and version is not None:
            facts[vendor] = version
        if self.unavailable_reason() is None:
            mod = self._module()
            name = getattr(mod, "get_device_name", None)
            facts["devices"] = (
                [str(name(i)) for i in range(self.device_count())] if callable(name) else self.device_count()
            )
        return facts

    def set_device(self, local_rank: int) -> None:
        """Bind this process to device ``local_rank % device_count``."""
        count = self.device_count()
        if count == 0:
            raise RuntimeError(f"backend '{self.name}' cannot bind a device: {self.unavailable_reason()}")
        self._module().set_device(local_rank % count)

    def current_device(self) -> torch.device:
        """The device this process is bound to."""
        return torch.device(self.device_type, self._module().current_device())

    def device_id(self, local_rank: int) -> Optional[torch.device]:
        """The ``device_id`` passed to init_process_group (binds eagerly)."""
        count = self.device_count()
        if not count or not _compat.init_accepts_device_id(self.device_type):
            return None  # torch 2.3-2.4 refuse a non-CUDA device_id
        return torch.device(self.device_type, local_rank % count)


_accel_current_device = AcceleratorDriver.current_device
