"""MCCL: Moore Threads GPUs through torch_musa (imported lazily); not run here."""

from __future__ import annotations

from ._common import AcceleratorDriver


class McclDriver(AcceleratorDriver):
    """MCCL on MUSA devices."""

    name = "mccl"
    device_type = "musa"
    priority = 35
    description = "Moore Threads MCCL (MUSA GPUs, needs torch_musa)"
    vendor_module = "torch_musa"
    env_vars = ("MCCL_*", "MUSA_VISIBLE_DEVICES")
    reduce_ops = frozenset({"sum", "product", "min", "max"})
    native_object_collectives = False
