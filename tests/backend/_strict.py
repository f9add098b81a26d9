"""An accelerator's limits for the backend tests: the emulated accelerator with a stricter table, counted.

``emu-strict`` moves float16/32/64, int8, uint8 and int32 only (no bfloat16, no int64), reduces with
SUM, PRODUCT and MIN only (no MAX, no AVG, no PREMUL_SUM) and has no native gather, scatter,
reduce_scatter or all_to_all. Its process group refuses anything else (the emulated accelerator's
check), and records every call it receives in ``CALLS`` (the spy: what the wrapper really issued).
"""

from __future__ import annotations

import os
from typing import Any

import torch

import hwdist
from hwdist.launch.core import destroy, init_backend
from hwdist.testing.emulated import EmulatedDriver, EmulatedProcessGroup

STRICT = "emu-strict"
#: (op, reduce op or None, first tensor's dtype or None) of every call the strict group received, in order.
CALLS: list[tuple[str, Any, Any]] = []


class StrictProcessGroup(EmulatedProcessGroup):
    """The emulated accelerator's checking group with the strict table, counting its calls."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any) -> None:
        super().__init__(store, rank, size, timeout)
        self._caps = StrictDriver().caps

    def _check(self, op: str, tensors: Any, opts: Any = None) -> None:
        rop = getattr(opts, "reduceOp", None)
        name = str(getattr(rop, "op", rop)).rpartition(".")[2].lower() if rop is not None else None
        first = _first(tensors)
        CALLS.append((op, name, None if first is None else str(first.dtype).replace("torch.", "")))
        super()._check(op, tensors, opts)


def _first(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj
    for item in obj if isinstance(obj, (list, tuple)) else ():
        found = _first(item)
        if found is not None:
            return found
    return None


def _first(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj
    for item in obj if isinstance(obj, (list, tuple)) else ():
        found = _first(item)
        if found is not None:
            return found
    return None


class StrictDriver(EmulatedDriver):
    """The strict table (see the module)."""

    name = STRICT
    reduce_ops = frozenset({"sum", "product", "min"})

    @staticmethod
    def process_group_factory(store: Any, rank: int, size: int, timeout: Any) -> StrictProcessGroup:
        """The counting, checking group."""
        return StrictProcessGroup(store, rank, size, timeout)


def init(backend: str, store: str, timeout: float = 60.0) -> None:
    """Create the default group on ``backend`` in this rank (registering the strict driver first)."""
    if hwdist.registry.registered(STRICT) is None:
        hwdist.register_backend(STRICT, StrictDriver)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_backend(backend, rank=rank, world_size=ws, init_method=f"file://{store}", timeout=timeout)
    CALLS.clear()


def calls() -> list[tuple[str, Any, Any]]:
    """The strict group's calls since ``init`` (a copy)."""
    return list(CALLS)


def done() -> None:
    """Destroy the group."""
    destroy()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (NaN included)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    )
