"""HCCL: Huawei Ascend NPUs through torch_npu (imported lazily).

The capability table is read from torch_npu's source and its 2.14.0 wheel; every entry
names its source in [`hwdist.drivers._vendor_caps`][hwdist.drivers._vendor_caps] (and docs/hardware.md). It
has not been run on Ascend hardware by this project.
"""

from __future__ import annotations

from ._common import AcceleratorDriver
from ._vendor_caps import table

# Deliberately the same shape as the other vendor modules: a driver module is data (its table), not logic.
_CAPS = table("hccl")


class HcclDriver(AcceleratorDriver):
    """HCCL on Ascend NPUs."""

    name = "hccl"
    device_type = "npu"
    # Before CUDA: torch_npu can make torch.cuda look available.
    priority = 50
    description = "Huawei HCCL (Ascend NPUs, needs torch_npu)"
    vendor_module = "torch_npu"
    env_vars = ("HCCL_*", "ASCEND_*")
    # gather runs as all_gather (as torch_npu itself does), scatter as broadcast (older
    # torch_npu releases lack it); reductions refuse uint8/bool/float64 (widened by hwdist).
    native_ops = _CAPS.native_ops
    reduce_ops = _CAPS.reduce_ops
    dtypes = _CAPS.dtypes
    reduce_dtypes = _CAPS.reduce_dtypes
    # torch_npu replaces torch's gather_object; hwdist's portable object path is the same everywhere.
    native_object_collectives = False
