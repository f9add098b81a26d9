"""Hardware detection: which device and backend this process would use, and why.

Drivers are tried in priority order (data on each driver, not line order).
``HWDIST_BACKEND`` names a backend to use; ``HWDIST_DEVICE`` names a device
type (the highest-priority available driver for it is chosen). Both are
checked against what is available and refused with a clear error otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from . import registry, settings
from .drivers import FALLBACK_BACKEND

__all__ = ["Detection", "detect", "get_device", "ENV_BACKEND", "ENV_DEVICE"]

ENV_BACKEND = "HWDIST_BACKEND"
ENV_DEVICE = "HWDIST_DEVICE"


@dataclass(frozen=True)
class Detection:
    """The outcome of [`detect`][hwdist.detect.detect].

    Attributes:
        device_type: device type computation runs on (cuda, npu, cpu, ...).
        backend: backend name collectives use.
        source: 'auto', or the environment variable that chose it.
        reason: one line on why.
        device_count: devices of ``device_type`` visible.
    """

    device_type: str
    backend: str
    source: str
    reason: str
    device_count: int

    @property
    def overridden(self) -> bool:
        """Whether an environment variable chose the result."""
        return self.source != "auto"

    def as_dict(self) -> dict[str, Any]:
        """Plain-data form (for ``--json``)."""
        return {**asdict(self), "overridden": self.overridden}


def detect() -> Detection:
    """Decide the device and backend for this process.

    Returns:
        A [`Detection`][hwdist.detect.Detection]. Environment overrides win over auto-detection;
        an override naming something unavailable raises.

    Raises:
        hwdist.BackendError: ``HWDIST_BACKEND`` unknown or unavailable, or
            ``HWDIST_DEVICE`` names a device no available driver serves.
    """
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
    for drv in registry.drivers():
        if drv.priority < 0:
            continue  # opt-in backends (e.g. MPI) are never picked automatically
        if drv.is_available():
            return Detection(
                drv.compute_device_type(),
                drv.name,
                "auto",
                f"highest-priority available driver ({drv.description})",
                drv.device_count(),
            )
    fallback = registry.get_driver(FALLBACK_BACKEND)
    return Detection(fallback.device_type, fallback.name, "auto", "no driver reported itself available", 1)


def get_device() -> str:
    """The device type this process computes on, like ``mmengine.device.get_device()``.

    Returns:
        cuda, npu, mlu, xpu, musa, mps or cpu (or a custom
        driver's device type).
    """
    return detect().device_type
