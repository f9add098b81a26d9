"""Devices that call themselves ``cuda`` but are not NVIDIA's: which vendor, and whose table applies.

Several vendors keep torch's ``cuda`` device and ``nccl`` backend names: Moore Threads' torchada
patches ``torch.cuda`` to MUSA and turns ``nccl`` into MCCL; Kunlunxin's P800 stack and T-Head's PPU
(SAIL) present their devices as ``cuda``. NVIDIA's capability table is then a guess.
[`identify`][hwdist.drivers.impostors.identify] finds such a device from what is visible without
initialising it (torch's version attributes, the modules already imported, the device nodes, the
name of an already initialised device); the nccl
driver then plans with that vendor's table where hwdist has one (MUSA: ``mccl``), and otherwise
``hwdist env`` and ``detect()`` say that NVIDIA's table is assumed.

Each signature names where it was read. None has been seen on its hardware by this project.
"""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["Impostor", "SIGNATURES", "identify"]


@dataclass(frozen=True)
class Impostor:
    """A non-NVIDIA device behind ``cuda``: its vendor, the hwdist table that applies, and the evidence."""

    vendor: str
    table: Optional[str]  # a registered driver whose capability table applies; None: unknown
    evidence: str
    source: str

    def note(self) -> str:
        """One line for ``hwdist env`` and ``detect()``."""
        if self.table:
            return (
                f"a cuda device from {self.vendor} ({self.evidence}): hwdist plans with the '{self.table}'"
                " table"
            )
        return (
            f"a cuda device from {self.vendor} ({self.evidence}): NVIDIA's table is assumed;"
            " `hwdist check --conformance` checks it on this machine"
        )


def _initialised_name() -> Optional[str]:
    """The first cuda device's name, only where the device is already initialised (asking would init it)."""
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized() or cuda.device_count() < 1:
            return None
        return str(cuda.get_device_name(0))
    except Exception:
        return None


def _musa() -> Optional[str]:
    version = getattr(torch.version, "musa", None)
    if version:
        return f"torch.version.musa = {version}"
    name = getattr(getattr(torch, "cuda", None), "__name__", "")
    if "musa" in str(name).lower():
        return f"torch.cuda is {name}"
    return "torchada imported" if "torchada" in sys.modules else None


def _kunlunxin() -> Optional[str]:
    name = _initialised_name() or ""
    if "kunlun" in name.lower() or name.upper().startswith("P800"):
        return f"device name {name!r}"
    for module in ("torch_xmlir", "xmlir"):
        if module in sys.modules:
            return f"{module} imported"
    nodes = glob.glob("/dev/xpu[0-9]*")
    if nodes and not os.path.exists("/proc/driver/nvidia/version"):
        return f"device nodes {nodes[0]}... and no NVIDIA kernel module"
    return None


def _sail() -> Optional[str]:
    name = _initialised_name() or ""
    return f"device name {name!r}" if name.upper().startswith("PPU-") else None


#: (vendor, table, test, source), tried in order; the first test that answers wins.
SIGNATURES: tuple[tuple[str, Optional[str], Callable[[], Optional[str]], str], ...] = (
    (
        "Moore Threads (MUSA via torchada)",
        "mccl",
        _musa,
        "MooreThreads/torchada README and tests/test_cuda_patching.py: `import torchada` makes torch.cuda"
        " torch_musa and init_process_group('nccl') use MCCL; torch_musa sets torch.version.musa",
    ),
    (
        "Kunlunxin (P800)",
        None,
        _kunlunxin,
        "vllm-kunlun vllm_kunlun/platforms/kunlun.py: device_type 'cuda', dist_backend 'nccl'; FlagPerf's"
        " kunlunxin configurations pass --device=/dev/xpu0...",
    ),
    (
        "T-Head (PPU, SAIL)",
        None,
        _sail,
        "a public ms-swift helper is_ppu(): nvidia-smi lists the devices as 'PPU-...'",
    ),
)


def identify() -> Optional[Impostor]:
    """The vendor behind a ``cuda`` device that is not NVIDIA's, or None (NVIDIA, AMD ROCm, or nothing to
    tell). Initialises no device and imports no vendor package."""
    for vendor, table, test, source in SIGNATURES:
        found = test()
        if found:
            return Impostor(vendor, table, str(found), source)
    return None
