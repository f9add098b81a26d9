"""NCCL: NVIDIA GPUs (and ROCm GPUs through RCCL, which torch exposes as cuda)."""

from __future__ import annotations

import re
from typing import Any, Optional

import torch

from . import impostors
from ._common import AcceleratorDriver, torch_build_reason
from ._planner import Capabilities
from .base import ALL_OPS


class NcclDriver(AcceleratorDriver):
    """NCCL on CUDA devices."""

    name = "nccl"
    device_type = "cuda"
    # torch 2.15's other names of NCCL engines: a group torch reports under one of them resolves here.
    aliases = ("nccl-legacy", "nccl2", "nccl-lazy", "nccl4py")
    priority = 20
    description = "NVIDIA NCCL (CUDA GPUs; RCCL on ROCm)"
    env_vars = (
        "NCCL_*",
        "TORCH_NCCL_*",
        "TORCH_DIST_USE_NCCL2",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_LAUNCH_BLOCKING",
        "HIP_VISIBLE_DEVICES",
    )
    # torch's NCCL process group has every op (gather/scatter since torch 1.11, below hwdist's floor).
    native_ops = ALL_OPS
    # The same on every engine of torch 2.15 (nccl2, nccl-legacy, nccl-lazy, nccl4py): no bitwise op, which
    # ProcessGroupNCCL refuses and torchcomms once issued as SUM (``_vendor_caps.ENGINE_FACTS``).
    reduce_ops = frozenset({"sum", "product", "min", "max", "avg"})
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

    _impostor: Optional[impostors.Impostor] = None
    _looked = False

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        reason = torch_build_reason("is_nccl_available", "NCCL (a CPU-only build?)")
        return reason or super().unavailable_reason()

    def impostor(self) -> Optional[impostors.Impostor]:
        """The vendor behind this process's ``cuda`` device when it is not NVIDIA (looked up once)."""
        if not self._looked:
            self._impostor, self._looked = impostors.identify(), True
        return self._impostor

    def vendor_note(self) -> Optional[str]:
        """Who makes the ``cuda`` device when it is not NVIDIA, and whose table hwdist plans with."""
        found = self.impostor()
        return found.note() if found else None

    @property
    def caps(self) -> Capabilities:
        """NVIDIA's table, or the table of the vendor really behind ``cuda`` where hwdist has one (MUSA
        via torchada: mccl's); with an unknown vendor NVIDIA's table is assumed, and said once."""
        found = self.impostor() if type(self).name == self.name else None
        if found is not None and not getattr(self, "_adopted", False):
            self._adopted = True
            if found.table:
                from ._vendor_caps import table

                theirs = table(found.table)
                self.native_ops, self.reduce_ops = theirs.native_ops, theirs.reduce_ops
                self.dtypes, self.reduce_dtypes = theirs.dtypes, theirs.reduce_dtypes
                self.inexact_reductions = theirs.inexact
                self._caps, self._plans = None, {}
            else:
                import warnings

                warnings.warn(f"hwdist: {found.note()}", stacklevel=3)
        return super().caps

    def details(self) -> dict[str, Any]:
        """The CUDA (or ROCm) runtime torch was built with, NCCL's version, the NVIDIA driver, the visible
        GPUs.
        """
        import torch.distributed as dist

        from .. import _compat

        facts: dict[str, Any] = {
            "cuda_runtime": torch.version.cuda,
            "rocm_runtime": getattr(torch.version, "hip", None),
            "nvidia_driver": _nvidia_driver(),
        }
        if dist.is_available() and dist.is_nccl_available():
            facts["engine"] = ENGINES.get(_compat.nccl_engine() or "")  # torch >= 2.15: what "nccl" builds
            try:
                version = torch.cuda.nccl.version()
                facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            except Exception as exc:  # report, never crash the environment report
                facts["nccl"] = f"unknown ({type(exc).__name__}: {exc})"
        found = self.impostor()
        if found is not None:
            facts["vendor"] = found.note()
        facts = {k: v for k, v in facts.items() if v is not None}
        if facts:  # a CPU-only torch: nothing to say about CUDA
            facts.update(super().details())
        return facts


#: The process group torch 2.15 builds for "nccl" -> the engine's own name, as ``hwdist env`` shows it.
ENGINES = {
    "ProcessGroupNCCL2": "nccl2 (torchcomms; TORCH_DIST_USE_NCCL2=0 picks nccl-legacy)",
    "ProcessGroupNCCL": "nccl-legacy (ProcessGroupNCCL; TORCH_DIST_USE_NCCL2=0)",
}


def _nvidia_driver() -> Optional[str]:
    """The NVIDIA kernel driver's version from /proc (no CUDA call), or None."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d[\w.-]*)", fh.read())
    except OSError:
        return None
    return found.group(1) if found else "unknown"
