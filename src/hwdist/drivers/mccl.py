"""MCCL: Moore Threads GPUs through torch_musa (imported lazily); not run here.

The capability table is read from torch_musa's source; every entry names its source in
[`hwdist.drivers._vendor_caps`][hwdist.drivers._vendor_caps] (and docs/hardware.md).
"""

from __future__ import annotations

from ._common import AcceleratorDriver
from ._vendor_caps import table

# Deliberately the same shape as the other vendor modules: a driver module is data (its table), not logic.
_CAPS = table("mccl")


class McclDriver(AcceleratorDriver):
    """MCCL on MUSA devices."""

    name = "mccl"
    device_type = "musa"
    priority = 35
    description = "Moore Threads MCCL (MUSA GPUs, needs torch_musa)"
    vendor_module = "torch_musa"
    env_vars = ("MCCL_*", "MUSA_VISIBLE_DEVICES")
    native_ops = _CAPS.native_ops
    reduce_ops = _CAPS.reduce_ops
    dtypes = _CAPS.dtypes
    reduce_dtypes = _CAPS.reduce_dtypes
    native_object_collectives = False
