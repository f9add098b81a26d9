"""Gloo: collectives on CPU tensors (also the fallback on any machine)."""

from __future__ import annotations

from typing import Optional

import torch

from .base import Driver

_GLOO_DTYPES = frozenset(
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


class GlooDriver(Driver):
    """Gloo on the CPU; always available where torch.distributed is."""

    name = "gloo"
    device_type = "cpu"
    priority = 0
    description = "Gloo (CPU), bundled with torch"
    env_vars = ("GLOO_*", "TORCH_GLOO_*")
    # Gloo rejects int16 and the unsigned 16/32/64-bit types ("Invalid scalar type").
    dtypes = _GLOO_DTYPES
    # Native AVG exists on recent gloo only; SUM / n is exact and always there.
    reduce_ops = frozenset({"sum", "product", "min", "max", "band", "bor", "bxor"})
    # On the CPU a packing copy costs about as much as the wire: big tensors go as they are.
    pack_max_bytes = 1 << 20
    # Gloo's ring all_reduce pays 2(n-1) synchronised steps even for a few bytes; its all_gather pays n-1.
    # Measured on 2 cores, 20 floats to 16 KiB: all_gather + local sum 0.22-0.34x the all_reduce at 2 ranks,
    # 0.75-0.87x at 3; a 64 KiB all_gather per rank was erratic (up to 5x slower), so stay well below it.
    reduce_by_gather_max_bytes = 32 << 10

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        import torch.distributed as dist

        if not dist.is_available():
            return "torch was built without torch.distributed"
        if not dist.is_gloo_available():
            return "torch was built without Gloo"
        return None

    def local_device_type(self) -> str:
        """The device a gloo-only process computes on ('mps' on Apple, else 'cpu')."""
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
        return "cpu"
