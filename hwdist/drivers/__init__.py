"""Built-in device drivers: one module per hardware family.

This package is the only place in hwdist where backend and device names
appear. Adding a backend in-tree: a module here (or, for an accelerator whose
capabilities are a ``_vendor_caps`` table, a row of ``vendors.VENDORS`` and a
three-line class) and one line below.
"""

from __future__ import annotations

from .base import Capabilities, Driver, Plan, PlanError
from .gloo import GlooDriver
from .mpi import MpiDriver
from .nccl import NcclDriver
from .vendors import CnclDriver, GaudiDriver, HcclDriver, McclDriver, XcclDriver

#: Registered by hwdist.registry at import (a dict insert; no vendor import).
BUILTIN_DRIVERS: tuple[type[Driver], ...] = (
    GlooDriver,
    NcclDriver,
    HcclDriver,
    CnclDriver,
    MpiDriver,
    XcclDriver,
    McclDriver,
    GaudiDriver,
)

#: Backend names torch used to accept and no longer does -> what to use instead.
LEGACY_BACKENDS = {
    "tcp": "the 'tcp' backend was removed from torch in 1.0; use 'gloo' for CPU tensors",
}

LEGACY_BACKEND_IDS: dict[int, str] = {1: MpiDriver.name, 2: GlooDriver.name, 3: NcclDriver.name}
"""Integer ids of torch<=0.4's ``dist_backend`` enum -> backend names (0, TCP, is gone)."""
LEGACY_TCP_ID = 0

#: The driver that runs when nothing else is available.
FALLBACK_BACKEND = GlooDriver.name

__all__ = [
    "Driver",
    "Capabilities",
    "Plan",
    "PlanError",
    "BUILTIN_DRIVERS",
    "FALLBACK_BACKEND",
    "LEGACY_BACKENDS",
    "LEGACY_BACKEND_IDS",
    "LEGACY_TCP_ID",
]
