"""Each rank's inputs for the check bodies, and what a collective must make of them.

Every input is a function of the rank number (and the reduce op, dtype and
shape); every expected value is computed here from the inputs of all ranks, in
64 bits on the CPU, then cast, never with hwdist. A body builds rank ``r``'s
input with ``contribution(r, ...)`` or ``moved(r, ...)`` and the expected
result from ``[contribution(q, ...) for q in range(world)]``.
"""

from __future__ import annotations

import functools
import operator
from typing import Sequence

import torch

__all__ = [
    "DTYPES",
    "ALL",
    "REDUCIBLE",
    "MOVABLE",
    "NUMERIC",
    "FLOAT",
    "BITWISE",
    "reduce_ops",
    "contribution",
    "combine",
    "moved",
    "on_cpu",
]

#: The dtypes a check row can name, by the name the table prints.
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
ALL = ("float32", "float16", "bfloat16", "int32", "int64", "bool")
#: Reductions: ALL, a narrow integer (a mean that overflows it) and a complex type.
REDUCIBLE = ALL + ("int8", "complex64")
#: Data movement: ALL, a 2-byte integer and a 16-byte complex type (byte views on a backend without them).
MOVABLE = ALL + ("int16", "complex128")
NUMERIC = ("float32", "float16", "bfloat16", "int32", "int64")
FLOAT = ("float32", "float16", "bfloat16")

_ARITH = ("sum", "mean", "product", "min", "max")
_BIG = 2**40  # added to int64 data
BITWISE = ("band", "bor", "bxor")


def reduce_ops(dtype: torch.dtype) -> tuple[str, ...]:
    """The reduce ops meaningful on ``dtype`` (hwdist's names)."""
    if dtype == torch.bool:
        return ("sum", "max", "min", "product")  # on bool: sum/max = any, min/product = all
    if dtype.is_complex:
        return ("sum", "mean")  # the only reductions defined on complex numbers
    if dtype.is_floating_point:
        return _ARITH
    return ("sum", "product", "min", "max") + BITWISE + ("mean",)  # an integer mean: the floor


def _numel(shape: tuple[int, ...]) -> int:
    return int(torch.tensor(shape, dtype=torch.int64).prod())


def _as_complex(values: torch.Tensor) -> torch.Tensor:
    real = values.double()
    return torch.complex(real, -real)


def contribution(rank: int, rop: str, dtype: torch.dtype, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    """Rank ``rank``'s input for reduce op ``rop`` on ``dtype`` (float64/int64/complex128 on the CPU).

    Products use 1s and 2s (exact in every dtype); bitwise ops distinct bits per rank;
    an integer mean mixes negative values (floor, not truncation) with values whose sum
    overflows int8 (the reduction must widen); int64 values lie beyond int32's range.
    """
    k = torch.arange(_numel(shape)).reshape(shape)
    if dtype == torch.bool:
        return ((k == rank) | (k == 5)).long()  # 5: true everywhere; slot `rank`: one rank only
    if rop == "product":
        out = (1 + (k + rank) % 2).double()
    elif rop in BITWISE:
        out = ((k + 1) * 5 + (1 << rank % 20)).long()
    elif rop == "mean" and not (dtype.is_floating_point or dtype.is_complex):
        base = k % 3 + rank + 1
        out = torch.where(k % 2 == 1, -base, base + 90).long()
    else:
        out = (k % 3 + rank + 1).double()
    if dtype == torch.int64 and rop != "product":
        out = out.long() + _BIG  # beyond int32: a lossy cast would show
    return _as_complex(out) if dtype.is_complex else out


def combine(parts: Sequence[torch.Tensor], rop: str, dtype: torch.dtype) -> torch.Tensor:
    """What reducing ``parts`` with ``rop`` must give on ``dtype``: computed in 64 bits, then cast.

    An integer mean is the floor of the exact mean (torch's floor division).
    """
    stack = torch.stack(list(parts))
    if dtype == torch.bool:
        return (stack.amin(0) if rop in ("min", "product") else stack.amax(0)).bool()
    if rop == "sum":
        out = stack.sum(0)
    elif rop == "mean":
        if dtype.is_floating_point or dtype.is_complex:
            out = stack.sum(0) / len(parts)
        else:
            out = torch.div(stack.long().sum(0), len(parts), rounding_mode="floor")
    elif rop == "product":
        out = stack.prod(0)
    elif rop == "min":
        out = stack.amin(0)
    elif rop == "max":
        out = stack.amax(0)
    else:
        bit = {"band": operator.and_, "bor": operator.or_, "bxor": operator.xor}[rop]
        out = functools.reduce(bit, [p.long() for p in parts])
    return out.to(dtype)


def moved(rank: int, dtype: torch.dtype, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    """Rank ``rank``'s data for ops that only move data: distinct per rank (CPU, wide dtype)."""
    k = torch.arange(_numel(shape)).reshape(shape)
    if dtype == torch.bool:
        return ((k + rank) % 2).long()
    out = (k + 10 * rank).double()
    if dtype == torch.int64:
        return out.long() + _BIG
    return _as_complex(out) if dtype.is_complex else out


def on_cpu(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (from ``moved`` or a reduction) as ``dtype`` on the CPU."""
    return (values != 0) if dtype == torch.bool else values.to(dtype)
