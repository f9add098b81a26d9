"""Run-time probes of what decides a vendor table beyond the backend name: the chip, the library.

Each probe is cheap, imports no vendor package and initialises no device: it answers only from a
vendor package some other code already imported and a device already initialised, and None
otherwise (the driver then keeps its conservative table). ``hwdist env`` shows the answers.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

__all__ = ["npu_soc", "oneccl_version"]


def npu_soc() -> Optional[int]:
    """torch_npu's SocVersion number of this process's NPU (Ascend950 = 260), once torch_npu is imported
    and the NPU initialised; else None. ``torch_npu.npu.get_soc_version`` initialises the device
    itself, so it is asked only after that happened."""
    vendor = sys.modules.get("torch_npu")
    npu = getattr(torch, "npu", None)
    if vendor is None or npu is None:
        return None
    try:
        if not npu.is_initialized():
            return None
        getter = getattr(getattr(vendor, "npu", None), "get_soc_version", None)
        if getter is None:
            getter = vendor.npu.utils.get_soc_version
        return int(getter())
    except Exception:  # an older torch_npu, a failed device: nothing known
        return None


def oneccl_version() -> Optional[str]:
    """The oneCCL version torch's XCCL backend was built with (``get_xccl_version``, in torch's XPU
    builds), or None where this torch has none."""
    c10d: Any = sys.modules.get("torch._C._distributed_c10d")
    if c10d is None:
        try:
            import torch._C._distributed_c10d as c10d
        except ImportError:
            return None
    getter = getattr(c10d, "get_xccl_version", None)
    if getter is None:
        return None
    try:
        found = getter()
    except Exception:
        return None
    if isinstance(found, (tuple, list)):
        return ".".join(str(x) for x in found)
    return str(found) if found else None
