"""CNCL: Cambricon MLUs through torch_mlu (imported lazily).

The capability table is read from torch_mlu's source; every entry names its source in
[`hwdist.drivers._vendor_caps`][hwdist.drivers._vendor_caps] (and docs/hardware.md). Not run on MLU hardware
by this project.
"""

from __future__ import annotations

from ._common import AcceleratorDriver
from ._vendor_caps import table

# Deliberately the same shape as the other vendor modules: a driver module is data (its table), not logic.
_CAPS = table("cncl")


class CnclDriver(AcceleratorDriver):
    """CNCL on Cambricon MLUs."""

    name = "cncl"
    device_type = "mlu"
    priority = 40
    description = "Cambricon CNCL (MLUs, needs torch_mlu)"
    vendor_module = "torch_mlu"
    env_vars = ("CNCL_*", "MLU_VISIBLE_DEVICES")
    native_ops = _CAPS.native_ops
    reduce_ops = _CAPS.reduce_ops
    dtypes = _CAPS.dtypes
    reduce_dtypes = _CAPS.reduce_dtypes
    native_object_collectives = False
