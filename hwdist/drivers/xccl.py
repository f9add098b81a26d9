"""XCCL: Intel GPUs (torch.xpu, oneCCL), built into torch >= 2.8 XPU builds."""

from __future__ import annotations

from typing import Optional

from ._common import AcceleratorDriver


class XcclDriver(AcceleratorDriver):
    """XCCL on Intel XPU devices."""

    name = "xccl"
    device_type = "xpu"
    priority = 30
    description = "Intel XCCL (XPU GPUs)"
    env_vars = ("CCL_*", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR")
    reduce_ops = frozenset({"sum", "product", "min", "max", "avg"})

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        import torch.distributed as dist

        checker = getattr(dist, "is_xccl_available", None)
        if checker is None or not checker():
            return "torch was built without XCCL"
        return super().unavailable_reason()
