"""torch's types in the restricted unpickler: dense, sparse, quantized and meta tensors, parameters, sizes.

Each handler checks what a payload gives before torch sees it: a known dtype,
a shape, a buffer of exactly the right size; index and value tensors that the
payload itself built (dense, through the tensor handler) for a sparse tensor,
whose invariants torch then checks; integer values and well-formed
parameters for a quantized tensor. These are the kinds torch's own
``weights_only=True`` loader accepts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..tensors import QSCHEMES, QUANTIZED_INTS, SPARSE_LAYOUTS
from ..tensors import rebuild_quantized, rebuild_sparse, rebuild_tensor
from .base import arity, byte_view, check_bool_bytes, int_arg, refuse, shape_of

if TYPE_CHECKING:  # the handlers get the running interpreter; never imported at run time
    from .loader import Loader

__all__ = ["SERIALIZATION", "TORCH_DTYPES", "TORCH_CALLS", "TORCH_HANDLERS", "TORCH_VALUES"]

#: The module whose ``rebuild_*`` functions hwdist's tensor streams name.
SERIALIZATION = "hwdist.serialization.tensors"

#: The tensor dtypes a payload may name (the float8 kinds and wide unsigned ints where torch has them).
TORCH_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64 complex64"
        " complex128 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz"
    ).split()
    if isinstance(getattr(torch, name, None), torch.dtype)
}


def _tensor(u: Loader, args: tuple) -> torch.Tensor:
    arity("tensor", args, 4, 4)
    buf, name, shape, requires_grad = args
    view = byte_view("tensor", buf)
    dt = TORCH_DTYPES.get(name) if type(name) is str else None
    if dt is None:
        raise refuse(f"tensor dtype {name!r} is not one of {', '.join(sorted(TORCH_DTYPES))}")
    _, count = shape_of("tensor", shape)
    if view.nbytes != count * dt.itemsize:
        raise refuse(
            f"tensor: shape {tuple(shape)} of {name} needs {count * dt.itemsize} bytes, got {view.nbytes}"
        )
    if type(requires_grad) is not bool or (requires_grad and not (dt.is_floating_point or dt.is_complex)):
        raise refuse(
            f"tensor: requires_grad must be a bool (True only for float or complex), got {requires_grad!r}"
        )
    u.charge(view.nbytes)
    if dt is torch.bool:
        check_bool_bytes("tensor", view)
    return rebuild_tensor(view, name, tuple(shape), requires_grad)


def _parameter(u: Loader, args: tuple) -> torch.nn.Parameter:
    arity("torch parameter", args, 3, 4)
    data, requires_grad, hooks = args[:3]
    state = args[3] if len(args) == 4 else None
    if type(data) is not torch.Tensor or type(requires_grad) is not bool:
        raise refuse("torch parameter takes (tensor, requires_grad)")
    if hooks or state not in (None, {}, (None, {}), ({}, None)):
        raise refuse("torch parameter: backward hooks and extra state are not accepted")
    return torch.nn.Parameter(data, requires_grad)


def _size(u: Loader, args: tuple) -> torch.Size:
    arity("torch.Size", args, 1, 1)
    shape_of("torch.Size", args[0])
    return torch.Size(args[0])


def _device(u: Loader, args: tuple) -> torch.device:
    arity("torch.device", args, 1, 2)
    if (
        type(args[0]) is not str
        or len(args[0]) > 64
        or (len(args) == 2 and args[1] is not None and type(args[1]) is not int)
    ):
        raise refuse("torch.device takes (type string, index)")
    return torch.device(*args)


_INDEX_DTYPES = (torch.int64, torch.int32)


def _tensor_arg(name: str, x: Any) -> torch.Tensor:
    if type(x) is not torch.Tensor or x.layout != torch.strided or x.is_quantized:
        raise refuse(f"{name} must be a dense tensor, got {type(x).__name__}")
    return x


def _sparse(u: Loader, args: tuple) -> torch.Tensor:
    arity("sparse tensor", args, 5, 5)
    layout, parts, shape, coalesced, requires_grad = args
    if type(layout) is not str or layout not in SPARSE_LAYOUTS:
        raise refuse(f"sparse tensor: layout {layout!r} is not one of {', '.join(SPARSE_LAYOUTS)}")
    want = 2 if layout == "sparse_coo" else 3
    if type(parts) is not tuple or len(parts) != want:
        raise refuse(f"sparse tensor: {layout} takes {want} tensors (indices, values)")
    *indices, values = [_tensor_arg(f"sparse tensor {layout} part", p) for p in parts]
    if any(i.dtype not in _INDEX_DTYPES for i in indices):
        raise refuse(f"sparse tensor: indices must be int64 or int32, got {[str(i.dtype) for i in indices]}")
    shape_of("sparse tensor", shape)
    if type(coalesced) is not bool or type(requires_grad) is not bool:
        raise refuse("sparse tensor: is_coalesced and requires_grad must be bools")
    if requires_grad and not (values.dtype.is_floating_point or values.dtype.is_complex):
        raise refuse("sparse tensor: requires_grad is True only for float or complex values")
    return rebuild_sparse(layout, tuple(parts), tuple(shape), coalesced, requires_grad)  # checks invariants


def _quantized(u: Loader, args: tuple) -> torch.Tensor:
    arity("quantized tensor", args, 2, 2)
    values, params = args
    values = _tensor_arg("quantized tensor values", values)
    if values.dtype not in QUANTIZED_INTS.values() or values.requires_grad:
        raise refuse(f"quantized tensor: values must be uint8, int8 or int32, got {values.dtype}")
    if type(params) is not tuple or not params or params[0] not in QSCHEMES:
        raise refuse(f"quantized tensor: the scheme must be one of {', '.join(QSCHEMES)}")
    if params[0] == "per_tensor_affine":
        if len(params) != 3 or type(params[1]) is not float or type(params[2]) is not int:
            raise refuse("quantized tensor: per_tensor_affine takes (scale, zero_point)")
        if not (math.isfinite(params[1]) and params[1] > 0) or abs(params[2]) > 1 << 31:
            raise refuse("quantized tensor: the scale must be finite and positive, the zero point an int32")
        return rebuild_quantized(values, params)
    if len(params) != 4 or type(params[3]) is not int:
        raise refuse(f"quantized tensor: {params[0]} takes (scales, zero_points, axis)")
    scales = _tensor_arg("quantized scales", params[1])
    zeros = _tensor_arg("quantized zero points", params[2])
    axis = int_arg("quantized tensor axis", params[3])
    want_zero = torch.int64 if params[0] == "per_channel_affine" else scales.dtype
    if (
        axis >= values.dim()
        or scales.dim() != 1
        or zeros.dim() != 1
        or len(scales) != values.shape[axis]
        or len(zeros) != len(scales)
        or not scales.dtype.is_floating_point
        or zeros.dtype != want_zero
    ):
        raise refuse(
            f"quantized tensor: {params[0]} needs 1-D float scales and {want_zero} zero points,"
            " one per entry of the axis"
        )
    return rebuild_quantized(values, params)


def _meta(u: Loader, args: tuple) -> torch.Tensor:
    """torch's form of a meta tensor (no data): dtype, shape, strides, requires_grad."""
    arity("meta tensor", args, 4, 4)
    dt, shape, stride, requires_grad = args
    if not isinstance(dt, torch.dtype) or dt not in TORCH_DTYPES.values():
        raise refuse(f"meta tensor: dtype {dt!r} is not accepted")
    ndim, _ = shape_of("meta tensor", shape)
    if type(stride) not in (tuple, list) or len(stride) != ndim or any(type(s) is not int for s in stride):
        raise refuse("meta tensor: strides must be a tuple of ints, one per dimension")
    if type(requires_grad) is not bool or (requires_grad and not (dt.is_floating_point or dt.is_complex)):
        raise refuse("meta tensor: requires_grad must be a bool (True only for float or complex)")
    out = torch.empty_strided(tuple(shape), tuple(stride), dtype=dt, device="meta")
    return out.requires_grad_(True) if requires_grad else out


TORCH_CALLS: dict[Any, Callable[[Loader, tuple], Any]] = {
    torch.Size: _size,
    torch.device: _device,
}
TORCH_HANDLERS: dict[tuple[str, str], Callable[[Loader, tuple], Any]] = {
    ("torch._utils", "_rebuild_parameter"): _parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _parameter,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _meta,
    (SERIALIZATION, "rebuild_tensor"): _tensor,
    (SERIALIZATION, "rebuild_sparse"): _sparse,
    (SERIALIZATION, "rebuild_quantized"): _quantized,
}
TORCH_VALUES: dict[tuple[str, str], Any] = {
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
}
