"""Tensor collectives with mmengine.dist's names, dispatched through the drivers.

Every function follows the same path (see docs/collectives.md):

1. Not distributed (or a one-rank group where mmengine says so): mmengine's
   no-op semantics (``all_gather`` returns ``[data]``, ``all_reduce`` does
   nothing, ...).
2. ``driver = registry.resolve(group, data.device)`` and
   ``plan = driver.plan(op, dtype, reduce_op)``: the driver's capability table
   decides between pass-through, a lossless cast, a byte view, an emulation
   with another op, or a [`hwdist.PlanError`][hwdist.drivers.base.PlanError].
3. The data is moved to ``driver.comm_device()`` and ``plan.comm_dtype`` only
   when needed (no copy when the tensor is already right).
4. The torch.distributed call(s), then ``plan.post`` (mean = SUM / n), then a
   copy back into the caller's tensor in its own dtype and device.

In verification mode ([`hwdist.verify`][hwdist.verify]) every collective except
send/recv first checks that every rank makes the same call.

No function here looks at a backend name. ``src``/``dst`` are global ranks, as
in torch.distributed.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import zlib
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as torch_dist

from .. import _compat, registry
from .. import verify as _verify
from ..drivers.base import Driver, Plan, PlanError, Post
from . import _transport
from ._calls import collective

__all__ = [
    "all_reduce",
    "all_gather",
    "gather",
    "broadcast",
    "reduce",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "send",
    "recv",
    "isend",
    "irecv",
    "sync_random_seed",
    "reduce_mean",
    "pad_to_largest_tensor",
    "CollectiveHandle",
]

Tensor = torch.Tensor
ReduceOpLike = Union[str, Any]  # a name or a torch.distributed.ReduceOp value

#: Reduce-op names accepted by every reducing collective (case-insensitive).
REDUCE_OP_NAMES = ("sum", "mean", "product", "min", "max", "band", "bor", "bxor")

_R = torch_dist.ReduceOp
_STR_OPS: dict[str, str] = {n: n for n in REDUCE_OP_NAMES}
_TORCH_TO_NAME: dict[Any, str] = {
    _R.SUM: "sum",
    _R.AVG: "mean",
    _R.PRODUCT: "product",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.BAND: "band",
    _R.BOR: "bor",
    _R.BXOR: "bxor",
}
# Reduce-op names a Plan issues -> torch values ('avg' is the native mean).
_NAME_TO_TORCH: dict[str, Any] = {
    "sum": _R.SUM,
    "avg": _R.AVG,
    "product": _R.PRODUCT,
    "min": _R.MIN,
    "max": _R.MAX,
    "band": _R.BAND,
    "bor": _R.BOR,
    "bxor": _R.BXOR,
}
#: What a ReduceOp given as a value may be: ``ReduceOp`` or its ``RedOpType`` (``ReduceOp.SUM``).
_TORCH_OP_TYPES = (_R, type(_R.SUM))
if hasattr(_R, "PREMUL_SUM"):
    _NAME_TO_TORCH["premul_sum"] = _R.PREMUL_SUM

_is_initialized = torch_dist.is_initialized if _compat.DIST_AVAILABLE else (lambda: False)


# ---------------------------------------------------------------------------
# argument checks (run on every rank before any collective)
# ---------------------------------------------------------------------------
def normalize_reduce_op(op: ReduceOpLike, argname: str = "op") -> str:
    """The hwdist name ('sum', 'mean', ...) of a reduce op given by name or ``ReduceOp``.

    Raises:
        ValueError: an unknown name or an unsupported ``ReduceOp`` value.
    """
    if isinstance(op, str):
        name = _STR_OPS.get(op)
        if name is None:
            name = _STR_OPS.get(op.lower())
            if name is not None:
                _STR_OPS[op] = name  # remember this spelling
        if name is not None:
            return name
    elif isinstance(op, _TORCH_OP_TYPES):  # not a bare int: RedOpType hashes and compares equal to its value
        name = _TORCH_TO_NAME.get(op)
        if name is None:  # a ReduceOp instance wrapping a RedOpType
            inner = getattr(op, "op", None)
            name = _TORCH_TO_NAME.get(inner) if isinstance(inner, _TORCH_OP_TYPES) else None
        if name is not None:
            return name
    raise ValueError(
        f"{argname} must be one of {', '.join(repr(n) for n in REDUCE_OP_NAMES)}"
        f" (case-insensitive) or a torch.distributed.ReduceOp with one of those meanings;"
        f" got {op!r}"
        + (" (a plain number is not a ReduceOp: pass the name or the torch.distributed.ReduceOp member)"
           if isinstance(op, numbers.Number) else "")
    )


def _check_tensor(value: Any, argname: str, fn: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {argname} must be a torch.Tensor, got {type(value).__name__}: {value!r:.80}")
    if value.layout is not torch.strided:
        _not_dense(value, argname, fn)


def _not_dense(value: Tensor, argname: str, fn: str) -> None:
    raise TypeError(
        f"{fn}: {argname} must be a dense (strided) tensor, got a {str(value.layout).replace('torch.', '')} tensor;"
        " collectives move dense tensors only: pass value.to_dense() (or its values and indices)"
    )


def _check_tensor_list(value: Any, argname: str, fn: str, length: int, like: Optional[Tensor]) -> list[Tensor]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{fn}: {argname} must be a list of {length} tensors, got {type(value).__name__}")
    if len(value) != length:
        raise ValueError(f"{fn}: {argname} must hold {length} tensors (one per rank), got {len(value)}")
    for i, t in enumerate(value):
        _check_tensor(t, f"{argname}[{i}]", fn)
        if like is not None and t.dtype != like.dtype:
            raise TypeError(f"{fn}: {argname}[{i}] has dtype {t.dtype}, expected {like.dtype} (like the other tensors)")
    return list(value)


def _group_ranks(group: Any) -> Optional[list[int]]:
    """Global ranks of a non-default group, or None for the default group."""
    if group is None or group is _compat.default_group():
        return None
    return list(torch_dist.get_process_group_ranks(group))


def _check_rank(value: Any, argname: str, fn: str, group: Any, ws: int) -> int:
    """``value`` as a plain int global rank of ``group`` (numpy integers accepted, as the object collectives do)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: {argname} must be an int rank, got {type(value).__name__}: {value!r}")
    value = int(value)
    ranks = _group_ranks(group)
    if ranks is None:
        if not 0 <= value < ws:
            raise ValueError(f"{fn}: {argname} must be a rank in 0..{ws - 1} (world size {ws}), got {value}")
    elif value not in ranks:
        raise ValueError(f"{fn}: {argname} must be a global rank of the group {ranks}, got {value}")
    return value


def _group_index(group: Any, global_rank: int) -> int:
    """Position of a global rank inside ``group`` (the index into gathered lists)."""
    ranks = _group_ranks(group)
    return global_rank if ranks is None else ranks.index(global_rank)


# ---------------------------------------------------------------------------
# verification mode (hwdist.verify): only called when it is on
# ---------------------------------------------------------------------------
def _verify_call(fn: str, group: Any, sample: Any, /, **fields: Any) -> None:
    """Check that every rank of ``group`` makes this call (verification mode is on).

    ``sample`` (a tensor of the call, if any) picks the driver; ``fields`` must agree across ranks.
    """
    if not _is_initialized():
        return
    device = sample.device if isinstance(sample, torch.Tensor) else None
    _verify.check_call(fn, group, registry.resolve(group, device), **fields)


def _op_field(op: Any) -> str:
    """A reduce op as the fingerprint shows it: its hwdist name, or its repr when invalid."""
    try:
        return normalize_reduce_op(op)
    except ValueError:
        return repr(op)


def _describe_many(value: Any) -> Any:
    """Fingerprint of a tensor or a list of tensors."""
    if isinstance(value, (list, tuple)):
        return [_verify.describe_tensor(t) for t in value]
    return _verify.describe_tensor(value)


def _piece_size_errors(table: list[list[int]], ws: int) -> list[str]:
    """Disagreements in an all_to_all size table (row j: rank j's send sizes, then its receive sizes)."""
    return [
        f"rank {j} sends {table[j][r]} elements to rank {r}, which expects {table[r][ws + j]}"
        for j in range(ws)
        for r in range(ws)
        if table[j][r] != table[r][ws + j]
    ]


# ---------------------------------------------------------------------------
# plans and the comm buffer
# ---------------------------------------------------------------------------
def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# Comm devices without an index (e.g. 'cpu') cannot change with set_device: remember them.
_FIXED_COMM_DEVICE: dict[Driver, torch.device] = {}


def _comm_dev(driver: Driver, data: Tensor) -> Optional[torch.device]:
    """None when ``data`` already sits on the driver's comm device, else that device."""
    cdev = _FIXED_COMM_DEVICE.get(driver)
    if cdev is None:
        cdev = driver.comm_device()
        if cdev.index is None:
            _FIXED_COMM_DEVICE[driver] = cdev
    return None if data.device == cdev else cdev


# (driver, op, dtype, reduce op) -> (plan, torch reduce op when the plan is a pure pass-through)
_FAST: dict[tuple[Driver, str, torch.dtype, Optional[str]], tuple[Plan, Any]] = {}


def _fast_plan(driver: Driver, op: str, dtype: torch.dtype, rop: Optional[str]) -> tuple[Plan, Any]:
    """The plan, and the torch op to call directly when it is a pure pass-through (else None)."""
    key = (driver, op, dtype, rop)
    found = _FAST.get(key)
    if found is None:
        plan = driver.plan(op, dtype, rop)
        fast = None
        if plan.passthrough:
            fast = _NAME_TO_TORCH[plan.reduce_op] if plan.reduce_op is not None else True
        found = _FAST[key] = (plan, fast)
    return found


def _prepare(data: Tensor, plan: Plan, cdev: Optional[torch.device]) -> tuple[Tensor, bool]:
    """The tensor to communicate and whether it shares memory with ``data``."""
    if plan.view:
        t = data if cdev is None else data.to(cdev)
        aliased = cdev is None and data.is_contiguous()
        return t.contiguous().reshape(-1).view(plan.comm_dtype), aliased
    if plan.comm_dtype != plan.dtype or cdev is not None:
        return (
            data.to(
                device=cdev if cdev is not None else data.device,
                dtype=plan.comm_dtype,
                memory_format=torch.contiguous_format,
            ),
            False,
        )
    if not data.is_contiguous():
        return data.contiguous(), False
    return data, True


def _comm_numel(data: Tensor, plan: Plan) -> int:
    """Number of comm-dtype elements ``data`` occupies on the wire."""
    if plan.view:
        return data.numel() * _itemsize(plan.dtype) // _itemsize(plan.comm_dtype)
    return data.numel()


def _as_comm_flat(t: Tensor, plan: Plan, cdev: Optional[torch.device]) -> Tensor:
    """``t`` flattened in the plan's comm dtype on the comm device (may alias ``t``)."""
    return _prepare(t, plan, cdev)[0].reshape(-1)


def _from_comm(buf: Tensor, plan: Plan, shape: Sequence[int], device: torch.device) -> Tensor:
    """A received comm buffer as a tensor of the caller's dtype, ``shape`` and device."""
    if plan.view:
        out = buf.reshape(-1).view(plan.dtype).reshape(shape)
    elif buf.dtype != plan.dtype:
        out = buf.to(plan.dtype).reshape(shape)
    else:
        out = buf.reshape(shape)
    return out if out.device == device else out.to(device)


def _restore(data: Tensor, buf: Tensor, plan: Plan) -> None:
    """Copy a comm buffer back into the caller's tensor (its dtype, shape and device)."""
    with torch.no_grad():
        if plan.view:
            data.copy_(buf.reshape(-1).view(plan.dtype).reshape(data.shape))
        else:
            data.copy_(buf.reshape(data.shape))


def _divide(buf: Tensor, n: int) -> None:
    """In-place mean from a sum: true division for floats, floor division for integers."""
    with torch.no_grad():
        if buf.is_floating_point() or buf.is_complex():
            buf.div_(n)
        else:
            buf.div_(n, rounding_mode="floor")


def _finish_reduction(data: Tensor, buf: Tensor, plan: Plan, ws: int, aliased: bool) -> None:
    """After a reduction: the mean's division, then the copy back unless ``buf`` is ``data``."""
    if plan.post is Post.DIVIDE:
        _divide(buf, ws)
    if not aliased:
        _restore(data, buf, plan)


def _torch_op(plan: Plan) -> Any:
    return _NAME_TO_TORCH[plan.reduce_op or "sum"]


# ---------------------------------------------------------------------------
# async handles
# ---------------------------------------------------------------------------
class CollectiveHandle:
    """What ``async_op=True`` returns: ``wait()`` finishes the communication *and*
    the copy back into the caller's tensors (dtype, device, post-division).

    ``wait()`` returns what the synchronous call returns (None for in-place
    collectives, the list of tensors for gathers, the sender rank for
    ``irecv``). Safe to call more than once.
    """

    __slots__ = ("_work", "_finish", "_done", "_result")

    def __init__(self, work: Any = None, finish: Optional[Callable[[], Any]] = None, result: Any = None) -> None:
        self._work = work
        self._finish = finish
        self._done = work is None and finish is None
        self._result = result

    def wait(self, timeout: Any = None) -> Any:
        """Block until the collective and its copy back are complete; return its result."""
        if not self._done:
            if self._work is not None:
                if timeout is None:
                    self._work.wait()
                else:
                    self._work.wait(timeout)
            if self._finish is not None:
                self._result = self._finish()
            self._done = True
            self._work = self._finish = None
        return self._result

    def is_completed(self) -> bool:
        """Whether the communication has finished (``wait()`` still does the copy back)."""
        return self._done or self._work is None or bool(self._work.is_completed())

    def __repr__(self) -> str:
        return f"<CollectiveHandle done={self._done}>"


def _run(
    driver: Driver,
    async_op: bool,
    issue: Callable[[bool], Any],
    finish: Optional[Callable[[], Any]],
) -> Any:
    """Issue a collective (async where the driver supports it) and finish it."""
    if async_op and driver.supports_async:
        return CollectiveHandle(issue(True), finish)
    issue(False)
    result = finish() if finish is not None else None
    return CollectiveHandle(result=result) if async_op else result


def _done(async_op: bool, result: Any = None) -> Any:
    return CollectiveHandle(result=result) if async_op else result


# ---------------------------------------------------------------------------
# all_reduce / reduce
# ---------------------------------------------------------------------------
@collective(2)
def all_reduce(data: Tensor, op: ReduceOpLike = "sum", group: Optional[Any] = None, *, async_op: bool = False) -> Any:
    """Reduce ``data`` across all ranks so that every rank gets the result, in place.

    ``op`` is one of ``'sum', 'mean', 'product', 'min', 'max', 'band', 'bor',
    'bxor'`` (case-insensitive) or a ``torch.distributed.ReduceOp``
    (``ReduceOp.AVG`` means ``'mean'``). ``'mean'`` uses the backend's native
    AVG where the driver says it is correct for the dtype, else SUM / world
    size. For integer tensors the mean keeps the integer dtype and rounds
    toward minus infinity (floor division; mmengine truncates toward zero,
    which differs only for negative means); the sum is taken in a wider
    integer where the backend has one, so it does not overflow.

    Dtypes the backend cannot reduce are widened losslessly (bf16 -> fp32,
    bool -> uint8 with SUM -> MAX, ...); when no lossless plan exists
    (e.g. int64 on a backend without it) [`hwdist.PlanError`][hwdist.drivers.base.PlanError] is raised
    on every rank before any communication. Non-distributed: does nothing.

    Args:
        data: input and output, modified in place (any device the group's
            driver can reach; it is moved to the comm device and back only
            when needed).
        op: the reduce op.
        group: process group (default group if None).
        async_op: return a [`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle] whose ``wait()`` also
            finishes the copy back (torch's ``Work`` on pure pass-through).

    Returns:
        None, or a handle when ``async_op`` is True.

    Raises:
        ValueError: unknown ``op`` (a plain int such as ``5`` included).
        TypeError: ``data`` is not a dense tensor.
        hwdist.PlanError: no correct plan for this dtype/op on this backend.

    Examples:
        >>> data = torch.arange(2) + 1 + 2 * rank
        >>> # rank 0: tensor([1, 2])   rank 1: tensor([3, 4])
        >>> dist.all_reduce(data)
        >>> # rank 0: tensor([4, 6])   rank 1: tensor([4, 6])
        >>> dist.all_reduce(data, op="mean")
        >>> # rank 0: tensor([2, 3])   rank 1: tensor([2, 3])
    """
    if _verify._enabled:
        _verify_call("all_reduce", group, data, data=_verify.describe_tensor(data), reduce_op=_op_field(op))
    rop = _STR_OPS.get(op) if op.__class__ is str else None
    if rop is None:
        rop = normalize_reduce_op(op)
    if not isinstance(data, torch.Tensor):
        _check_tensor(data, "data", "all_reduce")
    if not _is_initialized():
        return _done(async_op)
    driver = registry.resolve(group, data.device)
    plan, fast = _fast_plan(driver, "all_reduce", data.dtype, rop)
    cdev = _comm_dev(driver, data)
    if fast is not None and cdev is None and data.is_contiguous():
        if async_op:
            if driver.supports_async:
                return torch_dist.all_reduce(data, fast, group, True)
            torch_dist.all_reduce(data, fast, group)
            return CollectiveHandle()
        torch_dist.all_reduce(data, fast, group)
        return None
    if data.layout is not torch.strided:
        _not_dense(data, "data", "all_reduce")
    ws = torch_dist.get_world_size(group)
    buf, aliased = _prepare(data, plan, cdev)
    if plan.emulated:  # a backend without all_reduce: nothing can emulate it
        raise PlanError(f"all_reduce: backend '{driver.name}' planned {plan.native_op!r} for all_reduce")
    torch_op = _torch_op(plan)

    def issue(is_async: bool) -> Any:
        return torch_dist.all_reduce(buf, torch_op, group, is_async)

    def finish() -> None:
        _finish_reduction(data, buf, plan, ws, aliased)

    return _run(driver, async_op, issue, finish)


@collective(3)
def reduce(
    data: Tensor,
    dst: int = 0,
    op: ReduceOpLike = "sum",
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Reduce ``data`` across ranks into rank ``dst``'s tensor, in place.

    Same ops, casts and mean rule as [`all_reduce`][hwdist.collectives.tensor.all_reduce]. Backends without a
    native reduce get it as an all_reduce (the driver's plan says so). On
    ranks other than ``dst``, ``data`` is unspecified afterwards (torch's
    rule; hwdist leaves it unchanged when a cast was needed).
    Non-distributed: does nothing.

    Args:
        data: input everywhere; the result on ``dst``.
        dst: global rank that receives the result.
        op: the reduce op.
        group: process group.
        async_op: return a handle.

    Raises:
        ValueError: unknown ``op`` or ``dst`` out of range (on every rank).

    Examples:
        >>> data = torch.tensor([1.0 + rank])
        >>> # rank 0: tensor([1.])   rank 1: tensor([2.])
        >>> dist.reduce(data, dst=0)
        >>> # rank 0: tensor([3.])   rank 1: (unspecified)
    """
    if _verify._enabled:
        _verify_call("reduce", group, data, data=_verify.describe_tensor(data), reduce_op=_op_field(op), dst=_verify.rank_field(dst))
    rop = normalize_reduce_op(op)
    _check_tensor(data, "data", "reduce")
    if not _is_initialized():
        return _done(async_op)
    ws = torch_dist.get_world_size(group)
    dst = _check_rank(dst, "dst", "reduce", group, ws)
    driver = registry.resolve(group, data.device)
    plan = driver.plan("reduce", data.dtype, rop)
    cdev = _comm_dev(driver, data)
    buf, aliased = _prepare(data, plan, cdev)
    torch_op = _torch_op(plan)
    is_dst = torch_dist.get_rank() == dst

    def issue(is_async: bool) -> Any:
        if plan.native_op == "reduce":
            return torch_dist.reduce(buf, dst, torch_op, group, is_async)
        return torch_dist.all_reduce(buf, torch_op, group, is_async)

    def finish() -> None:
        if is_dst:
            _finish_reduction(data, buf, plan, ws, aliased)

    return _run(driver, async_op, issue, finish)


# ---------------------------------------------------------------------------
# shapes exchange (uneven gathers)
# ---------------------------------------------------------------------------
_HEADER_DIMS = 6  # dims carried in the first shape exchange; more costs a second one
_KNOWN_DTYPES = [
    getattr(torch, n)
    for n in (
        "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32"
        " float64 complex32 complex64 complex128 float8_e4m3fn float8_e5m2"
    ).split()
    if isinstance(getattr(torch, n, None), torch.dtype)
]


def _dtype_code(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF


_CODE_TO_DTYPE = {_dtype_code(d): d for d in _KNOWN_DTYPES}


def _gather_even_raw(buf: Tensor, group: Any, ws: int) -> list[Tensor]:
    outs = [torch.empty_like(buf) for _ in range(ws)]
    torch_dist.all_gather(outs, buf, group)
    return outs


def _exchange_shapes(data: Tensor, group: Any, driver: Driver, ws: int, fn: str) -> list[torch.Size]:
    """Every rank's shape of ``data``; raises on every rank if the dtypes differ."""
    shape = list(data.shape)
    head = [_dtype_code(data.dtype), len(shape)] + (shape + [0] * _HEADER_DIMS)[:_HEADER_DIMS]
    rows = _transport.gather_ints(head, group, driver)
    codes = [r[0] for r in rows]
    if len(set(codes)) > 1:
        names = ", ".join(
            f"rank {i}: {str(_CODE_TO_DTYPE.get(c, f'dtype #{c}')).replace('torch.', '')}" for i, c in enumerate(codes)
        )
        raise TypeError(f"{fn}: every rank must pass the same dtype; got {names}")
    max_ndim = max(r[1] for r in rows)
    if max_ndim > _HEADER_DIMS:  # rare: a second exchange with every dim
        rows2 = _transport.gather_ints((shape + [0] * max_ndim)[:max_ndim], group, driver)
        return [torch.Size(rows2[i][: rows[i][1]]) for i in range(ws)]
    return [torch.Size(r[2 : 2 + r[1]]) for r in rows]


# ---------------------------------------------------------------------------
# all_gather / gather
# ---------------------------------------------------------------------------
_REAL_OF_COMPLEX = {
    d: r for d, r in ((getattr(torch, "complex32", None), torch.float16), (torch.complex64, torch.float32),
                      (torch.complex128, torch.float64)) if d is not None
}


def _gather_common(
    fn: str,
    data: Tensor,
    group: Any,
    dst: Optional[int],
    same_shape: bool,
    async_op: bool,
) -> Any:
    """all_gather (dst None) or gather to ``dst``, with uneven shapes."""
    ws = torch_dist.get_world_size(group)
    if dst is not None:
        dst = _check_rank(dst, "dst", fn, group, ws)
    if ws == 1:
        return _done(async_op, [data])
    driver = registry.resolve(group, data.device)
    plan = driver.plan(fn, data.dtype)
    if plan.native_op == "gather" and data.is_complex() and not plan.view:
        # torch.distributed.gather, unlike all_gather, does not view complex tensors as real pairs
        # (gloo: "Invalid scalar type"): travel as the real pairs' (planned) dtype, a byte-exact view
        real = driver.plan(fn, _REAL_OF_COMPLEX[data.dtype])
        plan = dataclasses.replace(plan, comm_dtype=real.comm_dtype, view=True)
    cdev = _comm_dev(driver, data)
    shapes = None if same_shape else _exchange_shapes(data, group, driver, ws, fn)
    even = shapes is None or all(s == shapes[0] for s in shapes)
    keep = dst is None or torch_dist.get_rank() == dst
    buf, _ = _prepare(data, plan, cdev)
    if even:
        outs = [torch.empty_like(buf) for _ in range(ws)] if keep or plan.native_op == "all_gather" else []
        send = buf
    else:
        assert shapes is not None
        numels = [_comm_numel_shape(s, plan) for s in shapes]
        width = max(numels)
        flat = buf.reshape(-1)
        if flat.numel() < width:
            padded = flat.new_empty(width)
            padded[: flat.numel()].copy_(flat)
            flat = padded
        send = flat
        outs = [flat.new_empty(width) for _ in range(ws)] if keep or plan.native_op == "all_gather" else []
    native = plan.native_op

    def issue(is_async: bool) -> Any:
        if native == "all_gather":
            return torch_dist.all_gather(outs, send, group, is_async)
        return torch_dist.gather(send, outs if keep else None, dst, group, is_async)

    def finish() -> list[Tensor]:
        if not keep:
            return []
        if even:
            if not plan.cast and cdev is None:
                return outs
            return [_from_comm(o, plan, data.shape, data.device) for o in outs]
        assert shapes is not None
        return [
            _from_comm(o[: _comm_numel_shape(s, plan)], plan, s, data.device) for o, s in zip(outs, shapes)
        ]

    return _run(driver, async_op, issue, finish)


def _comm_numel_shape(shape: torch.Size, plan: Plan) -> int:
    n = 1
    for d in shape:
        n *= d
    if plan.view:
        return n * _itemsize(plan.dtype) // _itemsize(plan.comm_dtype)
    return n


@collective(1)
def all_gather(data: Tensor, group: Optional[Any] = None, *, same_shape: bool = False, async_op: bool = False) -> Any:
    """Gather ``data`` from every rank into a list, on every rank.

    Shapes may differ across ranks (any ndim): hwdist first exchanges the
    shapes (one small all_gather of a few int64 per rank), pads every tensor
    to the largest, gathers, and trims. That exchange is the only cost over
    torch's ``all_gather``; pass ``same_shape=True`` to skip it when every
    rank is known to pass the same shape (then the call costs exactly one
    all_gather, as in mmengine). The exchange also checks that every rank
    passes the same dtype (TypeError on every rank otherwise). Dtypes the
    backend cannot move travel as a byte view (``Tensor.view``), exactly.

    Non-distributed or a one-rank group: returns ``[data]``.

    Args:
        data: this rank's tensor.
        group: process group (default group if None).
        same_shape: promise that every rank's ``data`` has the same shape.
        async_op: return a [`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle]; ``wait()`` returns the list.

    Returns:
        ``list[Tensor]`` in rank order, in ``data``'s dtype and device.

    Examples:
        >>> data = torch.arange(rank + 1)
        >>> # rank 0: tensor([0])   rank 1: tensor([0, 1])
        >>> dist.all_gather(data)
        >>> # rank 0: [tensor([0]), tensor([0, 1])]
        >>> # rank 1: [tensor([0]), tensor([0, 1])]
    """
    if _verify._enabled:
        desc = _verify.describe_tensor(data) if same_shape else _verify.describe_dtype(data)
        _verify_call("all_gather", group, data, data=desc, same_shape=bool(same_shape))
    _check_tensor(data, "data", "all_gather")
    if not _is_initialized():
        return _done(async_op, [data])
    return _gather_common("all_gather", data, group, None, same_shape, async_op)


@collective(2)
def gather(
    data: Tensor,
    dst: int = 0,
    group: Optional[Any] = None,
    *,
    same_shape: bool = False,
    async_op: bool = False,
) -> Any:
    """Gather ``data`` from every rank into a list on rank ``dst``.

    Shapes may differ across ranks (see [`all_gather`][hwdist.collectives.tensor.all_gather] for the cost and
    ``same_shape``). Backends without a native gather (the driver's plan
    says so) run it as an all_gather, keeping the result on ``dst`` only.
    The data is always the comm-ready (moved/cast) tensor.

    Non-distributed or a one-rank group: returns ``[data]``.

    Args:
        data: this rank's tensor.
        dst: global rank that receives the list.
        group: process group.
        same_shape: skip the shape exchange.
        async_op: return a [`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle]; ``wait()`` returns the list.

    Returns:
        On ``dst``: ``list[Tensor]`` in rank order; on other ranks: ``[]``.

    Raises:
        ValueError: ``dst`` out of range (on every rank).
        TypeError: ``dst`` is not an int rank (``None`` included), before any communication.

    Examples:
        >>> data = torch.tensor([rank])
        >>> # rank 0: tensor([0])   rank 1: tensor([1])
        >>> dist.gather(data, dst=0)
        >>> # rank 0: [tensor([0]), tensor([1])]   rank 1: []
    """
    if _verify._enabled:
        desc = _verify.describe_tensor(data) if same_shape else _verify.describe_dtype(data)
        _verify_call("gather", group, data, data=desc, same_shape=bool(same_shape), dst=_verify.rank_field(dst))
    _check_tensor(data, "data", "gather")
    if not _is_initialized():
        return _done(async_op, [data])
    # before anything else: dst=None would otherwise pass for an all_gather on this rank
    dst = _check_rank(dst, "dst", "gather", group, torch_dist.get_world_size(group))
    return _gather_common("gather", data, group, dst, same_shape, async_op)


def pad_to_largest_tensor(tensor: Tensor, group: Optional[Any] = None) -> tuple[list[int], Tensor]:
    """Flatten ``tensor`` and pad it with zeros to the largest element count of any rank.

    The building block of uneven gathers (vis4d's helper, any ndim and
    dtype). Costs one small all_gather of shapes.

    Returns:
        ``(numels, padded)``: every rank's ``tensor.numel()`` in rank order,
        and this rank's flattened tensor padded to ``max(numels)``.
        Non-distributed: ``([tensor.numel()], tensor.reshape(-1))``.

    Examples:
        >>> t = torch.ones(rank + 1, dtype=torch.uint8)
        >>> # rank 0: tensor([1])   rank 1: tensor([1, 1])
        >>> dist.pad_to_largest_tensor(t)
        >>> # rank 0: ([1, 2], tensor([1, 0]))   rank 1: ([1, 2], tensor([1, 1]))
    """
    if _verify._enabled:
        _verify_call("pad_to_largest_tensor", group, tensor, tensor=_verify.describe_dtype(tensor))
    _check_tensor(tensor, "tensor", "pad_to_largest_tensor")
    flat = tensor.reshape(-1)
    if not _is_initialized() or torch_dist.get_world_size(group) == 1:
        return [flat.numel()], flat
    ws = torch_dist.get_world_size(group)
    driver = registry.resolve(group, tensor.device)
    shapes = _exchange_shapes(tensor, group, driver, ws, "pad_to_largest_tensor")
    numels = [math.prod(s) for s in shapes]
    width = max(numels)
    if flat.numel() < width:
        flat = torch.cat([flat, flat.new_zeros(width - flat.numel())])
    return numels, flat


# ---------------------------------------------------------------------------
# broadcast / scatter
# ---------------------------------------------------------------------------
@collective(2)
def broadcast(data: Tensor, src: int = 0, group: Optional[Any] = None, *, async_op: bool = False) -> Any:
    """Broadcast ``data`` from rank ``src`` to every rank, in place.

    ``data`` must have the same shape on every rank. Non-contiguous tensors
    and dtypes the backend cannot move (byte view) are handled; the caller's
    tensor keeps its dtype and device. Non-distributed: does nothing.

    Args:
        data: sent from ``src``, overwritten elsewhere.
        src: global rank to broadcast from.
        group: process group.
        async_op: return a handle whose ``wait()`` also copies back.

    Raises:
        ValueError: ``src`` out of range (on every rank).

    Examples:
        >>> data = torch.arange(2) + 1 + 2 * rank
        >>> # rank 0: tensor([1, 2])   rank 1: tensor([3, 4])
        >>> dist.broadcast(data, src=0)
        >>> # rank 0: tensor([1, 2])   rank 1: tensor([1, 2])
    """
    if _verify._enabled:
        _verify_call("broadcast", group, data, data=_verify.describe_tensor(data), src=_verify.rank_field(src))
    _check_tensor(data, "data", "broadcast")
    if not _is_initialized():
        return _done(async_op)
    ws = torch_dist.get_world_size(group)
    src = _check_rank(src, "src", "broadcast", group, ws)
    driver = registry.resolve(group, data.device)
    plan, fast = _fast_plan(driver, "broadcast", data.dtype, None)
    cdev = _comm_dev(driver, data)
    if fast is not None and cdev is None and data.is_contiguous():
        if async_op and driver.supports_async:
            return torch_dist.broadcast(data, src, group, True)
        torch_dist.broadcast(data, src, group)
        return _done(async_op)
    buf, aliased = _prepare(data, plan, cdev)
    is_src = torch_dist.get_rank() == src

    def issue(is_async: bool) -> Any:
        return torch_dist.broadcast(buf, src, group, is_async)

    def finish() -> None:
        if not aliased and not is_src:
            _restore(data, buf, plan)

    return _run(driver, async_op, issue, finish)


@collective(3)
def scatter(
    data: Tensor,
    scatter_list: Optional[Sequence[Tensor]] = None,
    src: int = 0,
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Send ``scatter_list[i]`` from rank ``src`` to rank ``i``'s ``data``, in place.

    torch's signature. Backends without a native scatter run it as one
    broadcast of the whole list (the driver's plan says so). The ``src`` rank
    validates ``scatter_list`` (one tensor per rank, each of ``data``'s shape
    and dtype); when it is wrong, ``src`` still joins the collective with a
    failure flag so that EVERY rank raises instead of waiting forever (the
    flag is one extra element per rank on the wire).

    Non-distributed: ``data`` gets ``scatter_list[0]``.

    Args:
        data: output on every rank (same shape on every rank).
        scatter_list: on ``src``, one tensor per rank of the group; ignored elsewhere.
        src: global rank that scatters.
        group: process group.
        async_op: return a handle whose ``wait()`` also copies back.

    Raises:
        ValueError: bad ``src`` (every rank); bad ``scatter_list`` on
            ``src`` (every rank, after the collective).
        TypeError: non-tensor ``data`` or ``scatter_list`` items (every rank).

    Examples:
        >>> data = torch.zeros(2)
        >>> lst = [torch.full((2,), float(i)) for i in range(2)] if rank == 0 else None
        >>> dist.scatter(data, lst, src=0)
        >>> # rank 0: tensor([0., 0.])   rank 1: tensor([1., 1.])
    """
    if _verify._enabled:
        _verify_call("scatter", group, data, data=_verify.describe_tensor(data), src=_verify.rank_field(src))
    _check_tensor(data, "data", "scatter")
    if not _is_initialized():
        items = _check_tensor_list(scatter_list, "scatter_list", "scatter", 1, data)
        with torch.no_grad():
            data.copy_(items[0])
        return _done(async_op)
    ws = torch_dist.get_world_size(group)
    src = _check_rank(src, "src", "scatter", group, ws)
    driver = registry.resolve(group, data.device)
    plan = driver.plan("scatter", data.dtype)
    cdev = _comm_dev(driver, data)
    comm_device = cdev if cdev is not None else data.device
    n = _comm_numel(data, plan)
    # status slot: as wide as one element of data, so byte views stay aligned
    h = _itemsize(plan.dtype) // _itemsize(plan.comm_dtype) if plan.view else 1
    me = _group_index(group, torch_dist.get_rank())
    is_src = torch_dist.get_rank() == src
    error: Optional[str] = None
    rows: Optional[Tensor] = None
    if is_src:
        try:
            items = _check_tensor_list(scatter_list, "scatter_list", "scatter", ws, data)
            for i, t in enumerate(items):
                if t.shape != data.shape:
                    raise ValueError(
                        f"scatter: scatter_list[{i}] has shape {tuple(t.shape)}, expected {tuple(data.shape)}"
                        " (the shape of data)"
                    )
        except (TypeError, ValueError) as exc:
            error = str(exc)
        rows = torch.zeros((ws, h + n), dtype=plan.comm_dtype, device=comm_device)
        if error is None:
            for i, t in enumerate(items):
                rows[i, h:].copy_(_as_comm_flat(t, plan, cdev) if plan.view else t.reshape(-1))
        else:
            rows[:, 0] = 1
    native = plan.native_op
    if native == "scatter":
        recv_buf = torch.empty(h + n, dtype=plan.comm_dtype, device=comm_device)
        whole = None
    else:  # emulated: one broadcast of every row
        whole = rows if rows is not None else torch.empty((ws, h + n), dtype=plan.comm_dtype, device=comm_device)
        recv_buf = whole[me]

    def issue(is_async: bool) -> Any:
        if native == "scatter":
            lst = list(rows.unbind(0)) if rows is not None else None
            return torch_dist.scatter(recv_buf, lst, src, group, is_async)
        return torch_dist.broadcast(whole, src, group, is_async)

    def finish() -> None:
        if error is not None:
            raise ValueError(error)
        if bool(recv_buf[0].item()):
            raise ValueError(f"scatter: the scatter_list given on src rank {src} was invalid (see the error on rank {src})")
        _restore(data, recv_buf[h:], plan)

    return _run(driver, async_op, issue, finish)


# ---------------------------------------------------------------------------
# reduce_scatter / all_to_all
# ---------------------------------------------------------------------------
@collective(3)
def reduce_scatter(
    output: Tensor,
    input_list: Union[Sequence[Tensor], Tensor],
    op: ReduceOpLike = "sum",
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Reduce ``input_list[i]`` across ranks into rank ``i``'s ``output``, in place.

    ``input_list`` is a list of one tensor per rank (each of ``output``'s
    shape and dtype), or one tensor holding them concatenated along dim 0
    (torch's ``reduce_scatter_tensor`` layout). Same ops, casts and mean rule
    as [`all_reduce`][hwdist.collectives.tensor.all_reduce]. Backends without reduce_scatter get it as an
    all_reduce of the whole input followed by a slice (world-size times the
    traffic; the driver's plan says when). ``input_list`` is not modified.

    Non-distributed: ``output`` gets ``input_list[0]``.

    Raises:
        ValueError: unknown ``op``, wrong number/shape/dtype of inputs
            (on every rank, before any communication).
        TypeError: non-tensor inputs (on every rank).

    Examples:
        >>> out = torch.zeros(1)
        >>> inp = [torch.tensor([1.0 + rank]), torch.tensor([10.0 * (1 + rank)])]
        >>> # rank 0: [1.], [10.]   rank 1: [2.], [20.]
        >>> dist.reduce_scatter(out, inp)
        >>> # rank 0: tensor([3.])   rank 1: tensor([30.])
    """
    if _verify._enabled:
        _verify_call(
            "reduce_scatter", group, output,
            output=_verify.describe_tensor(output), input=_describe_many(input_list), reduce_op=_op_field(op),
        )
    rop = normalize_reduce_op(op)
    _check_tensor(output, "output", "reduce_scatter")
    ws = torch_dist.get_world_size(group) if _is_initialized() else 1
    items = _split_input(input_list, output, ws, "reduce_scatter")
    if not _is_initialized():
        with torch.no_grad():
            output.copy_(items[0])
        return _done(async_op)
    driver = registry.resolve(group, output.device)
    plan = driver.plan("reduce_scatter", output.dtype, rop)
    cdev = _comm_dev(driver, output)
    comm_device = cdev if cdev is not None else output.device
    n = _comm_numel(output, plan)
    flat = torch.empty((ws, n), dtype=plan.comm_dtype, device=comm_device)
    for i, t in enumerate(items):
        flat[i].copy_(_as_comm_flat(t, plan, cdev) if plan.view else t.reshape(-1))
    torch_op = _torch_op(plan)
    me = _group_index(group, torch_dist.get_rank())
    if plan.native_op == "reduce_scatter":
        out_buf, aliased = _prepare(output, plan, cdev)
    else:
        out_buf, aliased = flat[me], False

    def issue(is_async: bool) -> Any:
        if plan.native_op == "reduce_scatter":
            return torch_dist.reduce_scatter(out_buf.reshape(-1), list(flat.unbind(0)), torch_op, group, is_async)
        return torch_dist.all_reduce(flat, torch_op, group, is_async)

    def finish() -> None:
        _finish_reduction(output, out_buf, plan, ws, aliased)

    return _run(driver, async_op, issue, finish)


def _split_input(value: Any, output: Tensor, ws: int, fn: str) -> list[Tensor]:
    if isinstance(value, torch.Tensor):
        if value.dtype != output.dtype:
            raise TypeError(f"{fn}: input has dtype {value.dtype}, expected {output.dtype} (output's dtype)")
        if value.numel() != ws * output.numel():
            raise ValueError(
                f"{fn}: input must hold world_size * output.numel() = {ws} * {output.numel()} elements,"
                f" got {value.numel()} (shape {tuple(value.shape)})"
            )
        return [c.reshape(output.shape) for c in value.reshape(ws, -1).unbind(0)]
    items = _check_tensor_list(value, "input_list", fn, ws, output)
    for i, t in enumerate(items):
        if t.shape != output.shape:
            raise ValueError(f"{fn}: input_list[{i}] has shape {tuple(t.shape)}, expected {tuple(output.shape)} (output's shape)")
    return items


@collective(2)
def all_to_all(
    output_list: Sequence[Tensor],
    input_list: Sequence[Tensor],
    group: Optional[Any] = None,
    *,
    async_op: bool = False,
) -> Any:
    """Send ``input_list[j]`` to rank ``j``; receive rank ``j``'s piece into ``output_list[j]``.

    torch's signature; pieces may have different sizes. Backends without
    all_to_all get it through one exchange of the piece sizes plus one
    all_gather of every rank's pieces (world-size times the traffic; the
    driver's plan says when); there, size mismatches raise on every rank.

    Non-distributed: ``output_list[0]`` gets ``input_list[0]``.

    Examples:
        >>> inp = [torch.tensor([10 * rank + j]) for j in range(2)]
        >>> # rank 0: [0], [1]   rank 1: [10], [11]
        >>> out = [torch.empty(1, dtype=torch.int64) for _ in range(2)]
        >>> dist.all_to_all(out, inp)
        >>> # rank 0: [0], [10]   rank 1: [1], [11]
    """
    if _verify._enabled:  # piece sizes may differ by design: dtype and count here, sizes below
        first = input_list[0] if isinstance(input_list, (list, tuple)) and input_list else input_list
        _verify_call(
            "all_to_all", group, first,
            input=_verify.describe_dtype(first),
            pieces=[len(x) if isinstance(x, (list, tuple)) else type(x).__name__ for x in (input_list, output_list)],
        )
    ws = torch_dist.get_world_size(group) if _is_initialized() else 1
    if not isinstance(input_list, (list, tuple)) or not input_list:
        raise TypeError(f"all_to_all: input_list must be a list of {ws} tensors, got {type(input_list).__name__}")
    _check_tensor(input_list[0], "input_list[0]", "all_to_all")
    ins = _check_tensor_list(input_list, "input_list", "all_to_all", ws, input_list[0])
    outs = _check_tensor_list(output_list, "output_list", "all_to_all", ws, input_list[0])
    if not _is_initialized():
        with torch.no_grad():
            outs[0].copy_(ins[0].reshape(outs[0].shape))
        return _done(async_op)
    driver = registry.resolve(group, ins[0].device)
    plan = driver.plan("all_to_all", ins[0].dtype)
    cdev = _comm_dev(driver, ins[0])
    if plan.native_op == "all_to_all":
        in_sizes = [_comm_numel(t, plan) for t in ins]
        out_sizes = [_comm_numel(t, plan) for t in outs]
        if _verify._enabled:  # the emulated path below always checks; the native one in this mode
            bad = _piece_size_errors(_transport.gather_ints(in_sizes + out_sizes, group, driver), ws)
            if bad:
                raise _verify.CollectiveMismatch(
                    "collective mismatch in 'all_to_all' across ranks (verification mode): piece sizes do not"
                    " match: " + "; ".join(bad[:4])
                )
        if len(set(in_sizes + out_sizes)) == 1:  # equal pieces: torch's list form, no copy when none is needed
            in_bufs = [_prepare(t, plan, cdev)[0] for t in ins]
            prepared = [_prepare(t, plan, cdev) for t in outs]
            out_bufs = [b for b, _ in prepared]

            def issue(is_async: bool) -> Any:
                return torch_dist.all_to_all(out_bufs, in_bufs, group, is_async)

            def finish() -> None:
                for t, (b, aliased) in zip(outs, prepared):
                    if not aliased:
                        _restore(t, b, plan)

            return _run(driver, async_op, issue, finish)
        # pieces of different sizes: one flat buffer each way with split sizes
        comm_device = cdev if cdev is not None else ins[0].device
        send_flat = torch.cat([_as_comm_flat(t, plan, cdev) for t in ins])
        recv_flat = torch.empty(sum(out_sizes), dtype=plan.comm_dtype, device=comm_device)

        def issue_s(is_async: bool) -> Any:
            return torch_dist.all_to_all_single(recv_flat, send_flat, out_sizes, in_sizes, group, is_async)

        def finish_s() -> None:
            for t, piece in zip(outs, recv_flat.split(out_sizes)):
                _restore(t, piece, plan)

        return _run(driver, async_op, issue_s, finish_s)

    # emulated: exchange piece sizes, then all_gather every rank's pieces
    me = _group_index(group, torch_dist.get_rank())
    in_sizes = [_comm_numel(t, plan) for t in ins]
    out_sizes = [_comm_numel(t, plan) for t in outs]
    table = _transport.gather_ints(in_sizes + out_sizes, group, driver)
    bad = _piece_size_errors(table, ws)
    if bad:
        raise ValueError("all_to_all: piece sizes do not match across ranks: " + "; ".join(bad[:4]))
    totals = [sum(row[:ws]) for row in table]
    width = max(totals)
    comm_device = cdev if cdev is not None else ins[0].device
    mine = torch.empty(width, dtype=plan.comm_dtype, device=comm_device)
    pos = 0
    for t in ins:
        k = _comm_numel(t, plan)
        mine[pos : pos + k].copy_(_as_comm_flat(t, plan, cdev) if plan.view else t.reshape(-1))
        pos += k
    gathered = [torch.empty_like(mine) for _ in range(ws)]

    def issue_e(is_async: bool) -> Any:
        return torch_dist.all_gather(gathered, mine, group, is_async)

    def finish_e() -> None:
        for j in range(ws):
            off = sum(table[j][:me])
            _restore(outs[j], gathered[j][off : off + table[j][me]], plan)

    return _run(driver, async_op, issue_e, finish_e)


# ---------------------------------------------------------------------------
# point to point
# ---------------------------------------------------------------------------
# Verification mode does not fingerprint send/recv: a point-to-point call has one
# partner, not the whole group, so a group-wide digest exchange would deadlock
# (see docs/reliability.md). A mismatched pair fails in the process-group timeout.
def _p2p_setup(fn: str, data: Tensor, peer: Optional[int], argname: str, group: Any) -> tuple[Driver, Plan, Tensor, bool]:
    _check_tensor(data, "data", fn)
    if not _is_initialized():
        raise RuntimeError(f"{fn} needs a process group: call hwdist.init_dist(...) first")
    if peer is not None:
        _check_rank(peer, argname, fn, group, torch_dist.get_world_size(group))
        if peer == torch_dist.get_rank():
            raise ValueError(f"{fn}: {argname} must be another rank, got this rank ({peer})")
    driver = registry.resolve(group, data.device)
    plan = driver.plan("send" if fn in ("send", "isend") else "recv", data.dtype)
    buf, aliased = _prepare(data, plan, _comm_dev(driver, data))
    return driver, plan, buf, aliased


def send(data: Tensor, dst: int, group: Optional[Any] = None, tag: int = 0) -> None:
    """Send ``data`` to rank ``dst`` (blocking), through the driver's dtype/device plan.

    Examples:
        >>> if rank == 0: dist.send(torch.tensor([7]), dst=1)
        >>> if rank == 1: t = torch.empty(1, dtype=torch.int64); dist.recv(t, src=0)  # t: tensor([7])
    """
    _, _, buf, _ = _p2p_setup("send", data, dst, "dst", group)
    torch_dist.send(buf, dst, group, tag)


def recv(data: Tensor, src: Optional[int] = None, group: Optional[Any] = None, tag: int = 0) -> int:
    """Receive into ``data`` from rank ``src`` (any rank if None); returns the sender's rank.

    Examples:
        >>> t = torch.empty(1, dtype=torch.int64)
        >>> dist.recv(t, src=0)   # rank 1: returns 0, t holds what rank 0 sent
    """
    _, plan, buf, aliased = _p2p_setup("recv", data, src, "src", group)
    sender = torch_dist.recv(buf, src, group, tag)
    if not aliased:
        _restore(data, buf, plan)
    return int(sender)


def isend(data: Tensor, dst: int, group: Optional[Any] = None, tag: int = 0) -> CollectiveHandle:
    """Start sending ``data`` to ``dst``; returns a handle (``wait()`` completes it).

    On a driver without async support the send completes before returning.
    """
    driver, _, buf, _ = _p2p_setup("isend", data, dst, "dst", group)
    if not driver.supports_async:
        torch_dist.send(buf, dst, group, tag)
        return CollectiveHandle()
    work = torch_dist.isend(buf, dst, group, tag)
    return CollectiveHandle(work, lambda: None)


def irecv(data: Tensor, src: Optional[int] = None, group: Optional[Any] = None, tag: int = 0) -> CollectiveHandle:
    """Start receiving into ``data``; the handle's ``wait()`` copies back and returns the sender rank.

    Examples:
        >>> h = dist.irecv(t, src=0); ...; sender = h.wait()
    """
    driver, plan, buf, aliased = _p2p_setup("irecv", data, src, "src", group)
    if not driver.supports_async:
        sender = torch_dist.recv(buf, src, group, tag)
        if not aliased:
            _restore(data, buf, plan)
        return CollectiveHandle(result=int(sender))
    work = torch_dist.irecv(buf, src, group, tag)

    def finish() -> int:
        if not aliased:
            _restore(data, buf, plan)
        if src is not None:
            return int(src)
        return int(work._source_rank())

    return CollectiveHandle(work, finish)


# ---------------------------------------------------------------------------
# helpers from mmengine / vis4d
# ---------------------------------------------------------------------------
def sync_random_seed(group: Optional[Any] = None) -> int:
    """A random seed drawn on the group's first rank and shared with every rank.

    Travels as an int32 on the driver's comm device. Non-distributed: a
    fresh random int in ``[0, 2**31)``.

    Examples:
        >>> dist.sync_random_seed()
        >>> # rank 0: 587791752   rank 1: 587791752
    """
    seed = int(np.random.randint(2**31))
    if not _is_initialized() or torch_dist.get_world_size(group) == 1:
        return seed
    ranks = _group_ranks(group)
    src = 0 if ranks is None else ranks[0]
    driver = registry.resolve(group, None)
    t = torch.tensor(seed if torch_dist.get_rank() == src else 0, dtype=torch.int32, device=driver.comm_device())
    broadcast(t, src=src, group=group)
    return int(t.item())


def reduce_mean(tensor: Tensor, group: Optional[Any] = None) -> Tensor:
    """The mean of ``tensor`` over the ranks, as a new tensor (the input is unchanged).

    vis4d's helper; integer tensors get the floor of the mean (see
    [`all_reduce`][hwdist.collectives.tensor.all_reduce]). Non-distributed: returns ``tensor`` itself.

    Examples:
        >>> dist.reduce_mean(torch.tensor([1.0 + rank]))
        >>> # rank 0: tensor([1.5000])   rank 1: tensor([1.5000])
    """
    _check_tensor(tensor, "tensor", "reduce_mean")
    if not _is_initialized():
        return tensor
    out = tensor.detach().clone()
    all_reduce(out, "mean", group)
    return out

