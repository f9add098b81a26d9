"""Argument checks shared by the tensor collectives (run on every rank before any communication).

Nothing here communicates: a bad argument raises on the rank that passed it,
with a message naming the argument, what was expected and what was given.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence, Union

import torch
import torch.distributed as torch_dist

__all__ = [
    "REDUCE_OP_NAMES",
    "ReduceOpLike",
    "normalize_reduce_op",
    "op_field",
    "check_tensor",
    "not_dense",
    "check_tensor_list",
    "split_input",
]

Tensor = torch.Tensor
ReduceOpLike = Union[str, Any]  # a name or a torch.distributed.ReduceOp value

#: Reduce-op names accepted by every reducing collective (case-insensitive).
REDUCE_OP_NAMES = ("sum", "mean", "product", "min", "max", "band", "bor", "bxor")

_STR_OPS: dict[str, str] = {n: n for n in REDUCE_OP_NAMES}
_TORCH_TO_NAME: dict[Any, str] = {}
#: What a ReduceOp given as a value may be: ``ReduceOp`` or its ``RedOpType`` (``ReduceOp.SUM``).
_TORCH_OP_TYPES: tuple[type, ...] = ()
if torch_dist.is_available():
    _R = torch_dist.ReduceOp
    _TORCH_TO_NAME = {
        _R.SUM: "sum", _R.AVG: "mean", _R.PRODUCT: "product", _R.MIN: "min", _R.MAX: "max",
        _R.BAND: "band", _R.BOR: "bor", _R.BXOR: "bxor",
    }
    _TORCH_OP_TYPES = (_R, type(_R.SUM))


def normalize_reduce_op(op: ReduceOpLike, argname: str = "op", fn: str = "") -> str:
    """The hwdist name ('sum', 'mean', ...) of a reduce op given by name or ``ReduceOp``.

    ``fn``: the public function whose argument it is (starts the message).

    Raises:
        ValueError: an unknown name or an unsupported ``ReduceOp`` value.
    """
    if isinstance(op, str):
        name = _STR_OPS.get(op)
        if name is not None:
            return name
        name = _STR_OPS.get(op.lower())
        if name is not None:
            _STR_OPS[op] = name  # remember this spelling
            return name
    elif isinstance(op, _TORCH_OP_TYPES):  # not a bare int: RedOpType hashes and compares equal to its value
        name = _TORCH_TO_NAME.get(op)
        if name is None:  # a ReduceOp instance wrapping a RedOpType
            inner = getattr(op, "op", None)
            name = _TORCH_TO_NAME.get(inner) if isinstance(inner, _TORCH_OP_TYPES) else None
        if name is not None:
            return name
    raise ValueError(
        f"{fn + ': ' if fn else ''}{argname} must be one of {', '.join(repr(n) for n in REDUCE_OP_NAMES)}"
        f" (case-insensitive) or a torch.distributed.ReduceOp with one of those meanings;"
        f" got {op!r}"
        + (" (a plain number is not a ReduceOp: pass the name or the torch.distributed.ReduceOp member)"
           if isinstance(op, numbers.Number) else "")
    )


def op_field(op: Any) -> str:
    """A reduce op as verification mode's fingerprint shows it: its hwdist name, or its repr when invalid."""
    try:
        return normalize_reduce_op(op)
    except ValueError:
        return repr(op)


def check_tensor(value: Any, argname: str, fn: str) -> None:
    """TypeError unless ``value`` is a dense (strided) tensor."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {argname} must be a torch.Tensor, got {type(value).__name__}: {value!r:.80}")
    if value.layout is not torch.strided:
        not_dense(value, argname, fn)


def not_dense(value: Tensor, argname: str, fn: str) -> None:
    """Raise the TypeError for a sparse (or other non-strided) tensor."""
    raise TypeError(
        f"{fn}: {argname} must be a dense (strided) tensor, got a"
        f" {str(value.layout).replace('torch.', '')} tensor;"
        " collectives move dense tensors only: pass value.to_dense() (or its values and indices)"
    )


def check_tensor_list(value: Any, argname: str, fn: str, length: int, like: Optional[Tensor]) -> list[Tensor]:
    """``value`` as a list of ``length`` dense tensors (of ``like``'s dtype when given)."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{fn}: {argname} must be a list of {length} tensors, got {type(value).__name__}")
    if len(value) != length:
        raise ValueError(f"{fn}: {argname} must hold {length} tensors (one per rank), got {len(value)}")
    for i, t in enumerate(value):
        check_tensor(t, f"{argname}[{i}]", fn)
        if like is not None and t.dtype != like.dtype:
            raise TypeError(
                f"{fn}: {argname}[{i}] has dtype {t.dtype}, expected {like.dtype} (like the other tensors)"
            )
    return list(value)


def split_input(value: Any, output: Tensor, ws: int, fn: str) -> list[Tensor]:
    """reduce_scatter's input: a list of ``ws`` tensors of ``output``'s shape, or one tensor holding them."""
    if isinstance(value, torch.Tensor):
        if value.dtype != output.dtype:
            raise TypeError(f"{fn}: input has dtype {value.dtype}, expected {output.dtype} (output's dtype)")
        if value.numel() != ws * output.numel():
            raise ValueError(
                f"{fn}: input must hold world_size * output.numel() = {ws} * {output.numel()} elements,"
                f" got {value.numel()} (shape {tuple(value.shape)})"
            )
        return [c.reshape(output.shape) for c in value.reshape(ws, -1).unbind(0)]
    items = check_tensor_list(value, "input_list", fn, ws, output)
    for i, t in enumerate(items):
        if t.shape != output.shape:
            raise ValueError(
                f"{fn}: input_list[{i}] has shape {tuple(t.shape)}, expected {tuple(output.shape)}"
                " (output's shape)"
            )
    return items


def check_shapes(items: Sequence[Tensor], like: Tensor, argname: str, fn: str) -> None:
    """ValueError unless every tensor of ``items`` has ``like``'s shape."""
    for i, t in enumerate(items):
        if t.shape != like.shape:
            raise ValueError(
                f"{fn}: {argname}[{i}] has shape {tuple(t.shape)}, expected {tuple(like.shape)}"
                " (the shape of data)"
            )
