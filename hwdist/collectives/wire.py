"""The wire format and the argument checks of the tensor collectives; nothing here communicates.

A [`Plan`][hwdist.drivers.base.Plan] says how one call travels (comm device, comm dtype, byte view); these
helpers apply it without a copy where none is needed. The ``hwdist`` torch backend (hwdist/backend/) uses them
too, so a call travels exactly as the same hwdist collective would. The argument checks run on every rank
before any communication, naming the argument, what was expected and what was given.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence, Union

import torch
import torch.distributed as torch_dist

from ..drivers.base import Driver, Plan, Post

Tensor = torch.Tensor

#: Reduce-op names a Plan issues -> torch values ('avg' is the native mean).
TORCH_OPS: dict[str, Any] = (
    {
        n: getattr(torch_dist.ReduceOp, n.upper())
        for n in ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
    }
    if torch_dist.is_available()
    else {}
)

_ITEMSIZE: dict[torch.dtype, int] = {}


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


def torch_op(plan: Plan) -> Any:
    """The ``torch.distributed.ReduceOp`` a reduction plan issues."""
    return TORCH_OPS[plan.reduce_op or "sum"]


# Comm devices without an index (e.g. 'cpu') cannot change with set_device: remember them.
_FIXED_COMM_DEVICE: dict[Driver, torch.device] = {}


def comm_device(driver: Driver, data: Tensor) -> Optional[torch.device]:
    """None when ``data`` already sits on the driver's comm device, else that device."""
    cdev = _FIXED_COMM_DEVICE.get(driver)
    if cdev is None:
        cdev = driver.comm_device()
        if cdev.index is None:
            _FIXED_COMM_DEVICE[driver] = cdev
    return None if data.device == cdev else cdev


def fixed_comm_device(driver: Driver) -> bool:
    """Whether ``driver``'s comm device is fixed (no index: ``set_device`` cannot change it), once known."""
    return driver in _FIXED_COMM_DEVICE


def dense_flat(t: Tensor) -> Tensor:
    """``t``'s elements in C order, flat with stride 1: a view when ``t`` is contiguous, else a copy.

    torch calls a tensor of at most one element contiguous whatever its strides, and ``reshape(-1)`` keeps
    them, which ``view(dtype)`` refuses for a dtype of another size: such a tensor gets stride 1 (an empty one
    also storage offset 0, which any wider dtype divides).
    """
    flat = t.reshape(-1)
    n = flat.numel()
    if n == 0 and (flat.stride(0) != 1 or flat.storage_offset()):
        return flat.as_strided((0,), (1,), 0)
    if n == 1 and flat.stride(0) != 1:
        return flat.as_strided((1,), (1,))
    if flat.stride(0) != 1:  # a strided 1-D tensor: reshape(-1) returns it as it is
        return flat.contiguous()
    return flat


def byte_view(t: Tensor) -> Tensor:
    """``t``'s bytes as one flat uint8 tensor (a view when ``t`` is contiguous, else a copy); any strides."""
    flat = dense_flat(t)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def retype(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t``'s bytes flat, read as ``dtype`` (``view(dtype)`` that accepts any strides)."""
    flat = dense_flat(t)
    return flat if flat.dtype == dtype else flat.view(dtype)


def prepare(data: Tensor, plan: Plan, cdev: Optional[torch.device]) -> tuple[Tensor, bool]:
    """The tensor to communicate and whether it shares memory with ``data``."""
    if plan.view:
        t = data if cdev is None else data.to(cdev)
        aliased = cdev is None and data.is_contiguous()
        return retype(t, plan.comm_dtype), aliased
    if plan.comm_dtype != plan.dtype or cdev is not None:
        device = cdev if cdev is not None else data.device
        return data.to(device=device, dtype=plan.comm_dtype, memory_format=torch.contiguous_format), False
    if not data.is_contiguous():
        return data.contiguous(), False
    return data, True


def comm_numel(shape: Sequence[int], plan: Plan) -> int:
    """Number of comm-dtype elements a tensor of ``shape`` occupies on the wire."""
    n = math.prod(shape)
    if plan.view:
        return n * itemsize(plan.dtype) // itemsize(plan.comm_dtype)
    return n


def as_comm_flat(t: Tensor, plan: Plan, cdev: Optional[torch.device]) -> Tensor:
    """``t`` flattened in the plan's comm dtype on the comm device (may alias ``t``)."""
    return dense_flat(prepare(t, plan, cdev)[0])


def copy_source(t: Tensor, plan: Plan, cdev: Optional[torch.device]) -> Tensor:
    """``t`` flattened, to ``copy_`` into a comm buffer (which casts and moves); the byte view if planned."""
    return dense_flat(prepare(t, plan, cdev)[0]) if plan.view else t.reshape(-1)


def from_comm(buf: Tensor, plan: Plan, shape: Sequence[int], device: torch.device) -> Tensor:
    """A received comm buffer as a tensor of the caller's dtype, ``shape`` and device."""
    if plan.view:
        out = retype(buf, plan.dtype).reshape(shape)
    elif buf.dtype != plan.dtype:
        out = buf.to(plan.dtype).reshape(shape)
    else:
        out = buf.reshape(shape)
    return out if out.device == device else out.to(device)


def restore(data: Tensor, buf: Tensor, plan: Plan) -> None:
    """Copy a comm buffer back into the caller's tensor (its dtype, shape and device)."""
    with torch.no_grad():
        if plan.view:
            data.copy_(retype(buf, plan.dtype).reshape(data.shape))
        else:
            data.copy_(buf.reshape(data.shape))


def divide(buf: Tensor, n: int, dtype: Optional[torch.dtype] = None) -> None:
    """In-place mean from a sum: true division for floats, floor division for integers (``dtype``: the
    caller's, default ``buf``'s; an integer summed in float64 is floor-divided)."""
    with torch.no_grad():
        kind = buf if dtype is None else torch.empty(0, dtype=dtype)
        if kind.is_floating_point() or kind.is_complex():
            buf.div_(n)
        else:
            buf.div_(n, rounding_mode="floor")


def exact_mean(plan: Plan) -> bool:
    """Whether ``plan`` is an integer mean summed in the caller's own width (int64: no wider type)."""
    return plan.post is Post.DIVIDE and plan.comm_dtype == torch.int64 and plan.dtype == torch.int64


def split_mean(buf: Tensor, ws: int) -> Tensor:
    """An int64 mean's wire: quotients then remainders by ``ws`` along the last dim (twice as wide).

    ``x = q * ws + r`` with ``0 <= r < ws``; the mean's floor is ``sum(q) + sum(r) // ws``. The remainders'
    sum is below ``ws**2`` and the quotients' sum wraps (two's complement) at most on the way to a result that
    fits, so the mean is exact for any int64 inputs.
    """
    q = torch.div(buf, ws, rounding_mode="floor")
    return torch.cat([q, buf - q * ws], dim=-1)


def join_mean(two: Tensor, ws: int) -> Tensor:
    """The floor of the mean from ``split_mean``'s summed wire (halves along the last dim)."""
    q, r = two.chunk(2, dim=-1)
    return q + torch.div(r, ws, rounding_mode="floor")


def reduction_send(data: Tensor, plan: Plan, cdev: Optional[torch.device], ws: int) -> tuple[Tensor, bool]:
    """A reduction's send buffer and whether it is ``data`` itself; an int64 mean's as quotients and
    remainders (``split_mean``), undone by [`finish_reduction`][hwdist.collectives.wire.finish_reduction]."""
    send, aliased = prepare(data, plan, cdev)
    if exact_mean(plan):
        return split_mean(send.reshape(-1), ws), False
    return send, aliased


def finish_reduction(data: Tensor, buf: Tensor, plan: Plan, ws: int, aliased: bool) -> None:
    """After a reduction: an int64 mean joined from its halves, or the mean's division; then the copy
    back unless ``buf`` is ``data``."""
    if exact_mean(plan):
        restore(data, join_mean(buf, ws), plan)
        return
    if plan.post is Post.DIVIDE:
        divide(buf, ws, plan.dtype)
    if not aliased:
        restore(data, buf, plan)


_WIDE = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def copy_bytes(dst: Tensor, src: Tensor) -> None:
    """``dst.copy_(src)`` for two flat uint8 tensors of one length, copied as the widest word that fits.

    torch splits a copy over its intra-op threads by element count, so a byte copy of 32 KiB or more is
    split where the same bytes as int64 are not (docs/benchmarks.md: ranks sharing a host wait on it).
    """
    n = src.numel()
    if n > 1 and dst.is_contiguous() and src.is_contiguous():
        for w, dtype in _WIDE:
            if n % w == 0 and dst.storage_offset() % w == 0 and src.storage_offset() % w == 0:
                dst.view(dtype).copy_(src.view(dtype))
                return
    dst.copy_(src)


# ---------------------------------------------------------------------------
# argument checks (every rank, before any communication)
# ---------------------------------------------------------------------------
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
    check_shapes(items, output, "input_list", fn, "output's shape")
    return items


def check_shapes(
    items: Sequence[Tensor], like: Tensor, argname: str, fn: str, what: str = "the shape of data"
) -> None:
    """ValueError unless every tensor of ``items`` has ``like``'s shape (``what``: whose shape that is)."""
    for i, t in enumerate(items):
        if t.shape != like.shape:
            raise ValueError(
                f"{fn}: {argname}[{i}] has shape {tuple(t.shape)}, expected {tuple(like.shape)} ({what})"
            )
