"""NCCL: NVIDIA GPUs (and ROCm GPUs through RCCL, which torch exposes as cuda)."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _compat
from ._common import AcceleratorDriver
from .base import ALL_OPS


class NcclDriver(AcceleratorDriver):
    """NCCL on CUDA devices."""

    name = "nccl"
    device_type = "cuda"
    priority = 20
    description = "NVIDIA NCCL (CUDA GPUs; RCCL on ROCm)"
    # torch's NCCL process group has gather/scatter since torch 1.11 (always, above hwdist's floor).
    native_ops = ALL_OPS if _compat.NCCL_HAS_GATHER else ALL_OPS - {"gather", "scatter"}
    reduce_ops = frozenset({"sum", "product", "min", "max", "avg"} | ({"premul_sum"} if _compat.HAS_PREMUL_SUM else set()))
    # NCCL has no int16, no uint16/32/64 (torch>=2.3 dtypes; carried as bytes) and no complex reductions
    # of its own (torch views complex as real).
    dtypes = frozenset(
        {
            torch.float16,
            torch.bfloat16,
            torch.float32,
            torch.float64,
            torch.complex64,
            torch.complex128,
            torch.int8,
            torch.uint8,
            torch.int32,
            torch.int64,
            torch.bool,
        }
    )

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        import torch.distributed as dist

        unsupported = _compat.unsupported_reason()
        if unsupported is not None:
            return unsupported
        if not dist.is_nccl_available():
            return "torch was built without NCCL (a CPU-only build?)"
        return super().unavailable_reason()

