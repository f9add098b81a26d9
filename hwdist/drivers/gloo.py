"""Gloo: collectives on CPU tensors (also the fallback on any machine)."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _compat
from ._common import torch_build_reason
from .base import ALL_OPS, Driver

# Gloo rejects int16 and the unsigned 16/32/64-bit types ("Invalid scalar type"), and bfloat16 before
# torch 2.2. It has no complex type at all: torch views complex as real for some ops only (all_reduce and
# all_gather always, broadcast and reduce from 2.9, all_to_all from 2.12, gather never), so hwdist
# carries complex itself (as bytes to move, as real pairs to reduce) on every version.
_GLOO_DTYPES = frozenset(
    {
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
        torch.bool,
    }
    | ({torch.bfloat16} if _compat.GLOO_HAS_BFLOAT16 else set())
)
# Ops this torch's gloo lacks, or gets wrong (reduce_scatter ignores the op before 2.9): emulated. Before
# 2.12 all_to_all has only its flat form (all_to_all_single, claimed in flat_ops on every version), which
# hwdist issues for every all_to_all there: one collective, never the all_gather emulation.
_GLOO_OPS = (
    ALL_OPS
    - (set() if _compat.GLOO_HAS_REDUCE_SCATTER else {"reduce_scatter"})
    - (set() if _compat.GLOO_HAS_ALL_TO_ALL_LIST else {"all_to_all"})
)


class GlooDriver(Driver):
    """Gloo on the CPU; always available where torch.distributed is."""

    name = "gloo"
    device_type = "cpu"
    priority = 0
    description = "Gloo (CPU), bundled with torch"
    env_vars = ("GLOO_*", "TORCH_GLOO_*")
    dtypes = _GLOO_DTYPES
    native_ops = frozenset(_GLOO_OPS)
    # No native AVG: gloo has none before torch 2.8, and from 2.8 torch divides in place under autograd (a
    # leaf that requires grad raises "a leaf Variable that requires grad is being used in an in-place
    # operation"). SUM then / n is exact and works on every version. No PREMUL_SUM on any version.
    reduce_ops = frozenset({"sum", "product", "min", "max", "band", "bor", "bxor"})
    # The flat all_gather_into_tensor exists from torch 2.2; all_to_all_single on every version;
    # reduce_scatter_tensor from 2.9, as the list form (before, missing or summing whatever the op).
    flat_ops = frozenset(
        {"all_to_all"}
        | ({"all_gather"} if _compat.GLOO_HAS_ALL_GATHER_INTO_TENSOR else set())
        | ({"reduce_scatter"} if _compat.GLOO_HAS_REDUCE_SCATTER else set())
    )

    # gloo's reduce_scatter Works (list and flat forms) never report completion: is_completed() stays
    # False after wait() (seen on torch 2.13 and 2.15; its other ops' Works do report it).
    silent_works = frozenset({"reduce_scatter"} if _compat.GLOO_HAS_REDUCE_SCATTER else set())

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        return torch_build_reason("is_gloo_available", "Gloo")

    def compute_device_type(self) -> str:
        """The device a gloo-only process computes on ('mps' on Apple, else 'cpu')."""
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
        return "cpu"
