"""Backends registered with torch only (never with hwdist), for tests/drivers/test_generic.py.

Importing this module registers, with ``torch.distributed.Backend.register_backend`` on ``cpu``:

* ``tonly``: a gloo process group wrapped so that one op (``gather``) and one dtype (``float16``)
  are refused on every call; everything else goes to gloo as it is. It stands in for a vendor
  extension hwdist has no driver for (Intel Gaudi's ``hccl`` before hwdist had one, Tecorigin's
  ``tccl``, ...): ``hwdist check --backend tonly`` must measure exactly gloo's table less those two;
* ``tonly_raises``: a creator that raises, as a vendor extension does on a machine without its device.

Both are registered once per process (torch 2.1 refuses a second registration of a name).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hwdist.testing import EmulatedProcessGroup

BACKEND = "tonly"
RAISING = "tonly_raises"
#: What the ``tonly`` wrapper refuses on top of what gloo itself refuses.
REFUSED_OP = "gather"
REFUSED_DTYPE = torch.float16  # a dtype torch never hands over as another (complex is viewed as real)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


class RefusingProcessGroup(EmulatedProcessGroup):
    """Gloo with ``gather`` and ``float16`` refused (every other call passed to gloo as it is)."""

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def _check(self, op: str, tensors: Any, opts: Any = None) -> None:
        if op == REFUSED_OP:
            raise RuntimeError(f"{BACKEND}: op '{op}' is not supported")
        for t in _tensors(tensors):
            if t.dtype == REFUSED_DTYPE:
                raise RuntimeError(f"{BACKEND}: dtype {t.dtype} is not supported by '{op}'")


def create(store: Any, rank: int, size: int, timeout: Any) -> RefusingProcessGroup:
    """The ``tonly`` creator torch calls."""
    return RefusingProcessGroup(store, rank, size, timeout)


def create_raising(store: Any, rank: int, size: int, timeout: Any) -> Any:
    """The ``tonly_raises`` creator: fails as an extension without its device does."""
    raise RuntimeError(f"{RAISING}: no device of this kind is visible on rank {rank}")


def _register(name: str, creator: Any) -> None:
    if name in dist.Backend.backend_list:
        return
    try:
        dist.Backend.register_backend(name, creator, devices=["cpu"])
    except TypeError:  # a torch without devices= (below the CI's versions)
        dist.Backend.register_backend(name, creator)


_register(BACKEND, create)
_register(RAISING, create_raising)
