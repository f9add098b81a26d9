"""CNCL: Cambricon MLUs through torch_mlu (imported lazily).

Capabilities follow Cambricon's CNCL documentation; not run on MLU hardware by
this project (see docs/hardware.md).
"""

from __future__ import annotations

import torch

from ._common import AcceleratorDriver
from .base import ALL_OPS


class CnclDriver(AcceleratorDriver):
    """CNCL on Cambricon MLUs."""

    name = "cncl"
    device_type = "mlu"
    priority = 40
    description = "Cambricon CNCL (MLUs, needs torch_mlu)"
    vendor_module = "torch_mlu"
    env_vars = ("CNCL_*", "MLU_VISIBLE_DEVICES")
    native_ops = ALL_OPS - {"gather", "scatter"}
    reduce_ops = frozenset({"sum", "product", "min", "max"})
    dtypes = frozenset(
        {
            torch.float16,
            torch.bfloat16,
            torch.float32,
            torch.int8,
            torch.uint8,
            torch.int16,
            torch.int32,
            torch.bool,
        }
    )
    native_object_collectives = False
