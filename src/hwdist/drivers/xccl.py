"""XCCL: Intel GPUs (torch.xpu, oneCCL), built into torch >= 2.8 XPU builds.

The capability table is read from torch-xpu-ops' ProcessGroupXCCL; every entry names its
source in [`hwdist.drivers._vendor_caps`][hwdist.drivers._vendor_caps] (and docs/hardware.md).
"""

from __future__ import annotations

from typing import Optional

from .. import _compat
from ._common import AcceleratorDriver
from ._vendor_caps import table

# Deliberately the same shape as the other vendor modules: a driver module is data (its table), not logic.
_CAPS = table("xccl")


class XcclDriver(AcceleratorDriver):
    """XCCL on Intel XPU devices."""

    name = "xccl"
    device_type = "xpu"
    priority = 30
    description = "Intel XCCL (XPU GPUs)"
    env_vars = ("CCL_*", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR")
    native_ops = _CAPS.native_ops
    # No 'avg': it is native only with oneCCL >= 2021.15, which hwdist cannot see; mean is sum / n.
    reduce_ops = _CAPS.reduce_ops
    dtypes = _CAPS.dtypes
    reduce_dtypes = _CAPS.reduce_dtypes

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        checker = _compat.is_xccl_available
        if checker is None:
            return (
                "this torch has no XCCL backend (torch.distributed.is_xccl_available appeared in torch 2.7;"
                " XPU builds of torch >= 2.8 ship XCCL)"
            )
        if not checker():
            return "torch was built without XCCL"
        return super().unavailable_reason()
