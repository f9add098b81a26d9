"""The driver of a backend torch knows and hwdist does not: built from torch's registry.

A vendor extension registers its backend with torch (``Backend.register_backend(name, creator,
devices=[...])``), and a group torch makes on it reports that name. Without a hwdist driver for the name,
the registry builds a [`GenericDriver`][hwdist.drivers.generic.GenericDriver] from what torch knows (the
name, the device types it serves, the module that registered it) with a conservative capability table:

* native ops: ``all_reduce``, ``broadcast``, ``all_gather`` and ``barrier``, what torch's own features
  rely on (DDP reduces and broadcasts, torch's object collectives gather and broadcast); ``reduce``,
  ``reduce_scatter``, ``gather``, ``scatter`` and ``all_to_all`` are emulated with them, point to point
  is refused;
* reduce ops ``sum``, ``min`` and ``max`` on int32 and float32, which every collective library hwdist
  knows implements; narrower dtypes are widened to them losslessly, mean is a sum then a division;
* data moves as uint8, int32 or float32; any other dtype travels as a byte view;
* no flat forms, no async, hwdist's own object path.

Anything the table does not cover is refused with a [`PlanError`][hwdist.drivers.base.PlanError] that
names the backend and ``hwdist check --backend NAME``, which measures the backend's real table and can
write it out as a driver (``--write-driver``; docs/writing-a-driver.md).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import PlanError
from ._common import AcceleratorDriver
from .base import Driver, Plan

__all__ = ["GenericDriver", "GenericAcceleratorDriver", "generic_driver", "measure_hint", "GENERIC_SUMMARY"]

GENERIC_OPS = frozenset({"all_reduce", "broadcast", "all_gather", "barrier"})
GENERIC_REDUCE_OPS = frozenset({"sum", "min", "max"})
GENERIC_DTYPES = frozenset({torch.uint8, torch.int32, torch.float32})
GENERIC_REDUCE_DTYPES = frozenset({torch.int32, torch.float32})
#: The generic table in one line (error messages, ``hwdist env``).
GENERIC_SUMMARY = (
    "all_reduce, broadcast, all_gather and barrier; sum, min and max on int32 and float32; data moved"
    " as uint8, int32 or float32"
)


def measure_hint(backend: str) -> str:
    """The command that measures ``backend``'s real table and writes it as a driver."""
    return f"hwdist check --backend {backend} --write-driver {backend}_driver.py"


class GenericTable:
    """What both generic drivers share: the conservative table, and refusals that say how to measure."""

    priority = -100  # never chosen by detection
    native_ops = GENERIC_OPS
    flat_ops: frozenset[str] = frozenset()
    reduce_ops = GENERIC_REDUCE_OPS
    dtypes: Optional[frozenset[torch.dtype]] = GENERIC_DTYPES
    reduce_dtypes: Optional[frozenset[torch.dtype]] = GENERIC_REDUCE_DTYPES
    avg_dtypes: frozenset[torch.dtype] = frozenset()
    torch_backend: Optional[str] = None
    native_object_collectives = False
    supports_async = False

    _device: str
    name: str
    #: The module whose creator torch calls for this backend (where it was registered), or None.
    creator_module: Optional[str] = None

    def _setup(self, backend: str, device_type: str, creator_module: Optional[str]) -> None:
        self.name = backend
        self.torch_backend = backend
        self._device = device_type
        self.creator_module = creator_module
        self.description = (
            f"{backend} on {device_type}: known to torch only; hwdist's generic table ({GENERIC_SUMMARY})"
        )

    @property
    def device_type(self) -> str:
        """The device type torch says the backend serves (the one the group uses for it)."""
        return self._device

    def plan(self, op: str, dtype: torch.dtype, reduce_op: Optional[str] = None) -> Plan:
        """The planner over the generic table; a refusal names the backend and how to measure it."""
        try:
            return Driver.plan(self, op, dtype, reduce_op)  # type: ignore[arg-type]
        except PlanError as exc:
            raise PlanError(
                f"{exc}. Backend '{self.name}' is known to torch only, so hwdist plans with its generic"
                f" table ({GENERIC_SUMMARY}). Measure the backend's real table on this machine:"
                f" `{measure_hint(self.name)}`, then register the written driver"
                " (docs/writing-a-driver.md)"
            ) from None


class GenericDriver(GenericTable, Driver):
    """The generic driver of a CPU backend torch knows and hwdist does not (see the module docstring)."""

    def __init__(self, backend: str, device_type: str = "cpu", creator_module: Optional[str] = None) -> None:
        Driver.__init__(self)
        self._setup(backend, device_type, creator_module)


class GenericAcceleratorDriver(GenericTable, AcceleratorDriver):
    """The generic driver of an accelerator backend: placement through ``torch.<device_type>``."""

    def __init__(self, backend: str, device_type: str, creator_module: Optional[str] = None) -> None:
        AcceleratorDriver.__init__(self)
        self._setup(backend, device_type, creator_module)


def generic_driver(backend: str, device_type: str, creator_module: Optional[str] = None) -> Driver:
    """The generic driver of torch backend ``backend`` on ``device_type``."""
    if device_type == "cpu":
        return GenericDriver(backend, device_type, creator_module)
    return GenericAcceleratorDriver(backend, device_type, creator_module)
