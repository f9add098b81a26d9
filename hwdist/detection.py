"""Hardware detection: which device and backend this process would use, and why.

The order, first match wins:

1. ``HWDIST_BACKEND`` names a backend to use;
2. ``HWDIST_DEVICE`` names a device type (the highest-priority available driver for it);
3. torch's own answer (torch >= 2.6): the device ``torch.accelerator`` names, when devices of it are
   visible, and the highest-priority driver for that device, else the backend torch itself uses on it
   (``get_default_backend_for_device``: a backend registered only with torch gets a generic driver);
4. drivers in priority order (data on each driver, not line order): how torch < 2.6 detects, and what
   finds a vendor extension that torch does not load by itself;
5. gloo.

Overrides are checked against what is available and refused with a clear error otherwise. Detection
initialises no device: torch's accelerator is read as built (``current_accelerator()`` without
``check_available``), and a driver is available when its device module counts devices, which on CUDA is
the NVML-based count (what torch itself does under ``PYTORCH_NVML_BASED_CUDA_CHECK=1``), so processes
forked after ``detect()`` can still use the device.

This module is ``hwdist.detection``; ``hwdist.detect`` is the function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from . import _compat, registry, settings
from .drivers import FALLBACK_BACKEND
from .drivers.base import Driver

__all__ = ["Detection", "detect", "get_device", "ENV_BACKEND", "ENV_DEVICE"]

ENV_BACKEND = "HWDIST_BACKEND"
ENV_DEVICE = "HWDIST_DEVICE"


@dataclass(frozen=True)
class Detection:
    """The outcome of [`detect`][hwdist.detection.detect].

    Attributes:
        device_type: device type computation runs on (cuda, npu, cpu, ...).
        backend: backend name collectives use.
        source: 'auto', or the environment variable that chose it.
        reason: one line on why.
        device_count: devices of ``device_type`` visible.
        vendor_note: who really makes the device when it is not who its name says (a ``cuda`` device
            that is not NVIDIA's) and whose table hwdist plans with; None otherwise.
    """

    device_type: str
    backend: str
    source: str
    reason: str
    device_count: int
    vendor_note: Optional[str] = None

    @property
    def overridden(self) -> bool:
        """Whether an environment variable chose the result."""
        return self.source != "auto"

    def as_dict(self) -> dict[str, Any]:
        """Plain-data form (for ``--json``)."""
        return {**asdict(self), "overridden": self.overridden}


def detect() -> Detection:
    """Decide the device and backend for this process; the chosen driver's ``vendor_note()`` says when
    the device is not who its name says (a ``cuda`` device that is not NVIDIA's).

    Initialises no device driver: a process forked afterwards can still use the device.

    Returns:
        A [`Detection`][hwdist.detection.Detection]. Environment overrides win over auto-detection;
        an override naming something unavailable raises.

    Raises:
        hwdist.BackendError: ``HWDIST_BACKEND`` unknown or unavailable, or
            ``HWDIST_DEVICE`` names a device no available driver serves.
    """
    found = _decide()
    try:
        note = registry.get_driver(found.backend).vendor_note()
    except Exception:  # a broken vendor install must not break detection
        note = None
    return replace(found, vendor_note=note) if note else found


def _decide() -> Detection:
    backend = settings.text(ENV_BACKEND)
    device = settings.text(ENV_DEVICE)
    if device is not None:
        device = device.lower()  # torch's device types are lower case; CPU means cpu, as GLOO means gloo
    if backend is not None:
        drv = registry.get_driver(backend)
        registry.require_available(drv, f"{ENV_BACKEND}={backend!r} names a backend that is")
        if device is not None and device != drv.device_type:
            raise registry.BackendError(
                f"{ENV_DEVICE}={device!r} conflicts with {ENV_BACKEND}={backend!r},"
                f" which runs on {drv.device_type!r}"
            )
        return Detection(drv.device_type, drv.name, ENV_BACKEND, f"set by {ENV_BACKEND}", drv.device_count())
    if device is not None:
        served = [d for d in registry.drivers() if d.device_type == device]
        for drv in served:
            if drv.is_available():
                return Detection(device, drv.name, ENV_DEVICE, f"set by {ENV_DEVICE}", drv.device_count())
        known = sorted({d.device_type for d in registry.drivers()})
        reasons = "; ".join(f"{d.name}: {d.unavailable_reason()}" for d in served)
        raise registry.BackendError(
            f"{ENV_DEVICE}={device!r} is not available here"
            + (f" ({reasons})" if reasons else f"; known device types: {', '.join(known)}")
            + f". Available backends: {', '.join(registry.available_backends())}"
        )
    return _auto()


def _auto() -> Detection:
    """Detection without an override: torch's accelerator first, then the drivers by priority."""
    accelerator = _compat.accelerator_type()
    if accelerator is not None:
        drv = _first_available(accelerator)
        why = "its highest-priority driver"
        if drv is None:
            drv, why = _torch_default(accelerator), "the backend torch uses on it"
        if drv is not None:
            return Detection(
                drv.compute_device_type(),
                drv.name,
                "auto",
                f"torch.accelerator names {accelerator!r}; {why} ({drv.description})",
                drv.device_count(),
            )
    drv = _first_available(None)
    if drv is not None:
        return Detection(
            drv.compute_device_type(),
            drv.name,
            "auto",
            f"highest-priority available driver ({drv.description})",
            drv.device_count(),
        )
    fallback = registry.get_driver(FALLBACK_BACKEND)
    return Detection(fallback.device_type, fallback.name, "auto", "no driver reported itself available", 1)


def _first_available(device_type: Optional[str]) -> Optional[Driver]:
    """The highest-priority available driver (of ``device_type`` if given); opt-in drivers never."""
    for drv in registry.drivers():
        if drv.priority < 0:
            continue  # opt-in backends (e.g. MPI) are never picked automatically
        if device_type is not None and drv.device_type != device_type:
            continue
        if drv.is_available():
            return drv
    return None


def _torch_default(device_type: str) -> Optional[Driver]:
    """The driver of the backend torch uses on ``device_type`` if it can run here (a generic driver for a
    backend only torch knows), else None."""
    name = _compat.default_backend_for_device(device_type)
    if name is None:
        return None
    try:
        drv = registry.get_driver(name, device_type)
    except registry.BackendError:
        return None
    return drv if drv.is_available() else None


def get_device() -> str:
    """The device type this process computes on, like ``mmengine.device.get_device()``.

    Returns:
        cuda, npu, mlu, xpu, musa, mps or cpu (or a custom
        driver's device type).
    """
    return detect().device_type
