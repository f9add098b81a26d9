"""HCCL: Huawei Ascend NPUs through torch_npu (imported lazily).

The capability table follows torch_npu's documentation for HCCL; it has not
been run on Ascend hardware by this project (see docs/hardware.md).
"""

from __future__ import annotations

import torch

from ._common import AcceleratorDriver
from .base import ALL_OPS


class HcclDriver(AcceleratorDriver):
    """HCCL on Ascend NPUs."""

    name = "hccl"
    device_type = "npu"
    # Before CUDA: torch_npu can make torch.cuda look available.
    priority = 50
    description = "Huawei HCCL (Ascend NPUs, needs torch_npu)"
    vendor_module = "torch_npu"
    env_vars = ("HCCL_*", "ASCEND_*")
    # mmengine emulates gather on HCCL with all_gather; do the same.
    native_ops = ALL_OPS - {"gather"}
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
            torch.int64,
            torch.bool,
        }
    )
    # torch's object collectives move bytes on the wrong device for HCCL.
    native_object_collectives = False
