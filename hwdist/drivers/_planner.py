"""The planner: a pure function from a backend's capabilities to the plan of one call.

[`plan`][hwdist.drivers.base.plan] takes a frozen [`Capabilities`][hwdist.drivers.base.Capabilities]
(what a backend's library supports: data, no behaviour) and one call's op, dtype and
reduce op, and returns a [`Plan`][hwdist.drivers.base.Plan] (pass through, lossless
cast, byte view, emulation) or raises [`PlanError`][hwdist.drivers.base.PlanError].
It reads nothing else, so its answer is cached once per argument tuple. The rules
are listed in docs/architecture.md ("Planning rules").
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from ..errors import BackendError, PlanError

__all__ = [
    "Capabilities",
    "Plan",
    "Post",
    "plan",
    "dtype_name",
    "MOVE_OPS",
    "REDUCE_OPS",
    "ALL_OPS",
    "REDUCE_OP_NAMES",
    "EMULATIONS",
    "FLOATING",
]

#: Ops that only move data: any dtype can travel as a byte view.
MOVE_OPS = frozenset({"all_gather", "gather", "broadcast", "scatter", "all_to_all", "send", "recv"})
#: Ops that combine data with a reduce op.
REDUCE_OPS = frozenset({"all_reduce", "reduce", "reduce_scatter"})
ALL_OPS = MOVE_OPS | REDUCE_OPS | frozenset({"barrier"})

#: Reduce op names hwdist accepts ("mean" is hwdist's name for AVG).
REDUCE_OP_NAMES = ("sum", "mean", "product", "min", "max", "band", "bor", "bxor")

#: How an op the backend lacks is emulated with one it has.
EMULATIONS: Mapping[str, str] = {
    "gather": "all_gather",
    "reduce": "all_reduce",
    "reduce_scatter": "all_reduce",
    "scatter": "broadcast",
    "all_to_all": "all_gather",
}

#: The floating dtypes (the default ``avg_dtypes``: where a native AVG is correct).
FLOATING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_COMPLEX_AS_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
# Lossless widenings tried, in order, when a dtype cannot be reduced natively.
_WIDEN: Mapping[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.float16: (torch.float32, torch.float64),
    torch.bfloat16: (torch.float32, torch.float64),
    torch.float32: (torch.float64,),
    torch.int8: (torch.int32, torch.int64),
    torch.uint8: (torch.int32, torch.int64),
    torch.int16: (torch.int32, torch.int64),
    torch.int32: (torch.int64,),
    torch.bool: (torch.uint8, torch.int32, torch.int64),
}
# Byte-view candidates for data movement, preferred first.
_VIEW_DTYPES = (torch.uint8, torch.int8, torch.int32, torch.float32)
# On bool, every reduce op maps to an integer one on 0/1 values.
_BOOL_OPS = {
    "sum": "max",
    "bor": "max",
    "max": "max",
    "product": "min",
    "band": "min",
    "min": "min",
    "bxor": "bxor",
}


class Post(enum.Enum):
    """What happens after the communication, before the copy back."""

    NONE = "none"
    DIVIDE = "divide"  # mean emulated as SUM then / group size


@dataclass(frozen=True)
class Plan:
    """How one collective call runs on a backend.

    Attributes:
        op: the op asked for.
        native_op: the op actually issued (differs when emulated).
        dtype: the caller's dtype.
        comm_dtype: dtype the data travels in.
        view: True if ``comm_dtype`` is a reinterpretation of the bytes
            (``Tensor.view``) rather than a value cast.
        reduce_op: reduce op name issued to torch, or None for move ops.
        post: work after communication (e.g. divide by group size).
    """

    op: str
    native_op: str
    dtype: torch.dtype
    comm_dtype: torch.dtype
    view: bool = False
    reduce_op: Optional[str] = None
    post: Post = Post.NONE

    @property
    def emulated(self) -> bool:
        """Whether the op is emulated with another one."""
        return self.native_op != self.op

    @property
    def cast(self) -> bool:
        """Whether the data changes dtype (by value or by view) to travel."""
        return self.comm_dtype != self.dtype

    @property
    def passthrough(self) -> bool:
        """Whether torch is called exactly as the caller asked."""
        return not self.cast and not self.emulated and self.post is Post.NONE


@dataclass(frozen=True)
class Capabilities:
    """What one backend's library supports: the data the planner reads (frozen, hashable).

    Attributes:
        backend: the backend's name (for error messages).
        native_ops: collective ops implemented natively (others are emulated or refused).
        flat_ops: ops whose flat one-tensor form (``all_gather_into_tensor``, ``reduce_scatter_tensor``,
            ``all_to_all_single``) the backend implements.
        reduce_ops: reduce ops implemented natively (``'avg'`` is the native mean).
        dtypes: dtypes the library can move at all (None: every dtype).
        reduce_dtypes: dtypes the library can reduce (None: the same as ``dtypes``).
        avg_dtypes: dtypes for which the native ``'avg'`` is correct.
        native_object_collectives: whether torch's own object collectives work on the backend.
        supports_async: whether ``async_op=True`` is supported.
        inexact: ``(reduce op, dtype)`` pairs the library accepts but computes wrongly (oneCCL's integer
            MIN/MAX come back as SUM): the planner routes each through an exact widening or refuses it.
    """

    backend: str
    native_ops: frozenset[str] = ALL_OPS
    flat_ops: frozenset[str] = frozenset({"all_gather", "reduce_scatter"})
    reduce_ops: frozenset[str] = frozenset({"sum", "product", "min", "max", "band", "bor", "bxor"})
    dtypes: Optional[frozenset[torch.dtype]] = None
    reduce_dtypes: Optional[frozenset[torch.dtype]] = None
    avg_dtypes: frozenset[torch.dtype] = FLOATING
    native_object_collectives: bool = True
    supports_async: bool = True
    inexact: frozenset[tuple[str, torch.dtype]] = frozenset()

    def can_move(self, dtype: torch.dtype) -> bool:
        """Whether the library moves ``dtype`` as it is."""
        return self.dtypes is None or dtype in self.dtypes

    def can_reduce(self, dtype: torch.dtype) -> bool:
        """Whether the library reduces ``dtype`` as it is."""
        allowed = self.reduce_dtypes if self.reduce_dtypes is not None else self.dtypes
        return allowed is None or dtype in allowed

    def as_dict(self) -> dict[str, Any]:
        """The table as plain data (for ``hwdist env --json`` and the docs)."""
        return {
            "native_ops": sorted(self.native_ops),
            "reduce_ops": sorted(self.reduce_ops),
            "flat_ops": sorted(self.flat_ops),
            "dtypes": None if self.dtypes is None else sorted(dtype_name(d) for d in self.dtypes),
            "reduce_dtypes": None
            if self.reduce_dtypes is None
            else sorted(dtype_name(d) for d in self.reduce_dtypes),
            "native_object_collectives": self.native_object_collectives,
            "supports_async": self.supports_async,
            "inexact": sorted(f"{op}:{dtype_name(d)}" for op, d in self.inexact),
        }

    def exact(self, rop: str, dtype: torch.dtype) -> bool:
        """Whether the library's ``rop`` on ``dtype`` is not known to be wrong."""
        return (rop, dtype) not in self.inexact


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``'float32'``."""
    return str(dtype).replace("torch.", "")


@functools.lru_cache(maxsize=None)
def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@functools.lru_cache(maxsize=4096)
def plan(caps: Capabilities, op: str, dtype: torch.dtype, reduce_op: Optional[str] = None) -> Plan:
    """The plan for ``op`` on ``dtype`` (and ``reduce_op``) on a backend with ``caps``; pure and cached.

    Args:
        caps: the backend's capabilities.
        op: one of ``ALL_OPS``.
        dtype: the caller's dtype.
        reduce_op: for reductions, one of ``REDUCE_OP_NAMES`` (None: ``'sum'``).

    Returns:
        The [`Plan`][hwdist.drivers.base.Plan].

    Raises:
        PlanError: no correct plan exists (names the backend, op, dtype and why).
        ValueError: ``op`` or ``reduce_op`` is not a name hwdist knows.

    Examples:
        >>> plan(Capabilities("mycl", dtypes=frozenset({torch.float32})), "all_reduce", torch.float16, "sum")
        Plan(op='all_reduce', native_op='all_reduce', dtype=torch.float16, comm_dtype=torch.float32, ...)
    """
    if op not in ALL_OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(sorted(ALL_OPS))}")
    native = _native_op(caps, op)
    if op in MOVE_OPS or op == "barrier":
        if caps.can_move(dtype):
            return Plan(op, native, dtype, dtype)
        return Plan(op, native, dtype, _view_dtype(caps, dtype), view=True)
    return _reduce_plan(caps, op, native, dtype, reduce_op or "sum")


def _native_op(caps: Capabilities, op: str) -> str:
    if op in caps.native_ops:
        return op
    alt = EMULATIONS.get(op)
    if alt is not None and alt in caps.native_ops:
        return alt
    raise PlanError(
        f"backend '{caps.backend}' has no '{op}' and no emulation for it"
        f" (native ops: {', '.join(sorted(caps.native_ops))})"
    )


def _view_dtype(caps: Capabilities, dtype: torch.dtype) -> torch.dtype:
    size = _itemsize(dtype)
    for cand in _VIEW_DTYPES:
        if caps.can_move(cand) and size % _itemsize(cand) == 0:
            return cand
    raise PlanError(
        f"backend '{caps.backend}' cannot move {dtype_name(dtype)}: no supported dtype to carry its bytes"
    )


def _reduce_plan(caps: Capabilities, op: str, native: str, dtype: torch.dtype, rop: str) -> Plan:
    where = f"{op}(op='{rop}') on {dtype_name(dtype)} with backend '{caps.backend}'"
    if rop not in REDUCE_OP_NAMES:
        raise ValueError(f"unknown reduce op {rop!r}; expected one of {', '.join(REDUCE_OP_NAMES)}")
    comm = dtype
    view = False
    if dtype in _COMPLEX_AS_REAL:
        if rop not in ("sum", "mean"):
            raise PlanError(f"{where}: only 'sum' and 'mean' are defined on complex tensors")
        if not caps.can_reduce(dtype):
            comm, view = _COMPLEX_AS_REAL[dtype], True
    if dtype == torch.bool:
        if rop not in _BOOL_OPS:
            raise PlanError(f"{where}: '{rop}' is not defined on bool; use 'max' (any) or 'min' (all)")
        # Always: a library's SUM on bool can leave non-canonical bytes (gloo: True == 2).
        rop = _BOOL_OPS[rop]
    if (comm.is_floating_point or comm.is_complex) and rop in ("band", "bor", "bxor"):
        raise PlanError(f"{where}: bitwise ops need an integer or bool tensor")
    if not caps.can_reduce(comm):
        comm = _widen(caps, comm, where, rop)
    post = Post.NONE
    if rop == "mean":
        if "avg" in caps.reduce_ops and comm in caps.avg_dtypes:
            rop = "avg"
        else:
            rop, post = "sum", Post.DIVIDE
            if not (comm.is_floating_point or comm.is_complex):
                comm = _widest_int(caps, comm, dtype)
    if rop not in caps.reduce_ops and rop != "avg":
        raise PlanError(f"{where}: reduce op not supported (supported: {', '.join(sorted(caps.reduce_ops))})")
    if not caps.exact(rop, comm):
        comm = _exact_route(caps, comm, rop, where)
    return Plan(op, native, dtype, comm, view=view, reduce_op=rop, post=post)


def _widest_int(caps: Capabilities, comm: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    # An integer mean sums first: n small ints can overflow their dtype although
    # the mean fits, so sum in a wider type: the widest integer the backend reduces, else
    # float64 for integers of 4 bytes or fewer (exact for sums below 2**53: 2**21 ranks of
    # int32). int64 has no wider type: the engine sums it exactly as quotients and remainders
    # (hwdist/collectives/wire.py, ``split_mean``).
    # (``comm``: the integer the plan reduces so far, ``dtype`` or a lossless widening of it)
    for wide in (torch.int64, torch.int32):
        if _itemsize(wide) <= _itemsize(comm):
            break
        if caps.can_reduce(wide):
            return wide
    if _itemsize(comm) <= _itemsize(dtype) <= 4 and caps.can_reduce(torch.float64):
        return torch.float64
    return comm


# Where MIN and MAX are exact: every value of the integer is a value of the float (|v| <= 2**24 in
# float32, 2**53 in float64), and the order of exact values is the order of the integers.
_ORDER_EXACT: Mapping[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.bool: (torch.float32, torch.float64),
    torch.uint8: (torch.float32, torch.float64),
    torch.int8: (torch.float32, torch.float64),
    torch.int16: (torch.float32, torch.float64),
    torch.int32: (torch.float64,),
}


def _exact_route(caps: Capabilities, comm: torch.dtype, rop: str, where: str) -> torch.dtype:
    """A dtype ``comm`` widens to losslessly where the library's ``rop`` is right (``caps.inexact``
    names the pairs it gets wrong): a wider integer, or for MIN/MAX a float holding every value."""
    cands = list(_WIDEN.get(comm, ()))
    if rop in ("min", "max"):
        cands += _ORDER_EXACT.get(comm, ())
    for cand in cands:
        if caps.can_reduce(cand) and caps.exact(rop, cand):
            return cand
    raise PlanError(
        f"{where}: the backend's library computes '{rop}' on {dtype_name(comm)} wrongly (declared"
        " inexact) and no lossless route exists on it. HINT: all_gather the tensors and reduce them"
        " locally; if `hwdist check --conformance` shows this library right, register the driver file"
        " it writes"
    )


def _widen(caps: Capabilities, dtype: torch.dtype, where: str, rop: str = "sum") -> torch.dtype:
    cands = list(_WIDEN.get(dtype, ()))
    if rop in ("min", "max"):  # a float holding every value keeps their order: exact for MIN/MAX
        cands += [c for c in _ORDER_EXACT.get(dtype, ()) if c not in cands]
    for cand in cands:
        if caps.can_reduce(cand):
            return cand
    raise PlanError(
        f"{where}: the backend cannot reduce {dtype_name(dtype)} and no lossless cast exists"
        " (hwdist never casts lossily, e.g. int64 -> int32)"
    )


# ---- a driver's own plan method, checked ----------------------------------------------------------

#: (op, dtype, reduce_op) -> the last plan found well-formed for it: a driver that returns the same
#: plan object again (its cache) is not checked again. A plan's validity depends only on the key.
_valid: dict[tuple[Any, ...], Plan] = {}


def _malformed(plan: Any, op: str, dtype: torch.dtype) -> str:
    """Why ``plan`` is not a valid answer to ``plan(op, dtype, ...)``, or ''."""
    if not isinstance(plan, Plan):
        return f"expected a hwdist.Plan, got {type(plan).__name__}: {plan!r}"
    if plan.op != op or plan.dtype != dtype:
        return f"it is for {plan.op!r} on {plan.dtype}, not {op!r} on {dtype}"
    if plan.native_op not in ALL_OPS:
        return f"native_op {plan.native_op!r} is not an op ({', '.join(sorted(ALL_OPS))})"
    if not isinstance(plan.comm_dtype, torch.dtype):
        return f"comm_dtype must be a torch.dtype, got {plan.comm_dtype!r}"
    if not isinstance(plan.post, Post):
        return f"post must be a hwdist Post, got {plan.post!r}"
    if plan.native_op in REDUCE_OPS and plan.reduce_op not in (*REDUCE_OP_NAMES, "avg"):
        return f"reduce_op {plan.reduce_op!r} is not a reduce op ({', '.join(REDUCE_OP_NAMES)}, avg)"
    if plan.view:
        size = torch.empty((), dtype=dtype).element_size()
        comm = torch.empty((), dtype=plan.comm_dtype).element_size()
        if size % comm:
            return f"a {dtype} element ({size} bytes) cannot be viewed as {plan.comm_dtype} ({comm} bytes)"
    return ""


def checked_plan(raw: Any) -> Any:
    """A driver class's own ``plan`` method, checked: the driver is named when it breaks its contract.

    ``plan`` must return a [`Plan`][hwdist.drivers.base.Plan] for the op and dtype asked, or raise
    [`PlanError`][hwdist.errors.PlanError] (no plan) or ValueError (an unknown op or reduce-op name).
    Anything else raises [`BackendError`][hwdist.errors.BackendError] naming the driver; collectives
    ask for their plan before communicating, so every rank raises it there. ``Driver.__init_subclass__``
    applies it to every class outside hwdist's own drivers that defines ``plan``: the check is part of
    the class, so it holds for drivers with ``__slots__`` and for instances made after registration.
    """

    @functools.wraps(raw)
    def plan(self: Any, op: str, dtype: torch.dtype, reduce_op: Optional[str] = None) -> Plan:
        try:
            found = raw(self, op, dtype, reduce_op)
        except (PlanError, ValueError):
            raise
        except Exception as exc:
            raise BackendError(
                f"driver {self.name!r} ({type(self).__name__}): plan({op!r}, {dtype}, {reduce_op!r}) raised"
                f" {type(exc).__name__}: {exc}; a driver's plan must return a hwdist.Plan or raise PlanError"
            ) from exc
        key = (op, dtype, reduce_op)
        if _valid.get(key) is not found:
            why = _malformed(found, op, dtype)
            if why:
                raise BackendError(
                    f"driver {self.name!r} ({type(self).__name__}): plan({op!r}, {dtype}, {reduce_op!r})"
                    f" returned a malformed plan: {why}"
                )
            _valid[key] = found
        return found

    plan.checked = True  # type: ignore[attr-defined]
    return plan
