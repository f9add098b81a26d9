"""The driver interface: what a communication backend knows about itself.

A driver is small and declarative. Its capability table (class attributes)
says which collective ops, reduce ops and dtypes the backend's library really
supports; [`Driver.plan`][hwdist.drivers.base.Driver.plan] turns that table into a [`Plan`][hwdist.drivers.base.Plan] for one
call (pass through, lossless cast, byte view, emulation, or a clear error).
Collectives never look at a backend name: they ask the driver for a plan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional

import torch

__all__ = [
    "Driver",
    "Plan",
    "PlanError",
    "MOVE_OPS",
    "REDUCE_OPS",
    "ALL_OPS",
    "REDUCE_OP_NAMES",
    "EMULATIONS",
]

#: Ops that only move data: any dtype can travel as a byte view.
MOVE_OPS = frozenset(
    {"all_gather", "gather", "broadcast", "scatter", "all_to_all", "send", "recv"}
)
#: Ops that combine data with a reduce op.
REDUCE_OPS = frozenset({"all_reduce", "reduce", "reduce_scatter"})
ALL_OPS = MOVE_OPS | REDUCE_OPS | frozenset({"barrier"})

#: Reduce op names hwdist accepts ("mean" is hwdist's name for AVG).
REDUCE_OP_NAMES = (
    "sum",
    "mean",
    "product",
    "min",
    "max",
    "band",
    "bor",
    "bxor",
    "premul_sum",
)

#: How an op the backend lacks is emulated with one it has.
EMULATIONS: Mapping[str, str] = {
    "gather": "all_gather",
    "reduce": "all_reduce",
    "reduce_scatter": "all_reduce",
    "scatter": "broadcast",
    "all_to_all": "all_gather",
}

_FLOATING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
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


from ..errors import PlanError  # noqa: E402


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


class Driver:
    """Base class for device drivers; subclass and set the class attributes.

    Required members (checked at registration): ``name``, ``device_type``,
    ``is_available``, ``device_count``, ``set_device``, ``current_device``,
    ``comm_device``, ``plan``.
    """

    #: Backend name users pass to init_dist / init_process_group.
    name: ClassVar[str] = ""
    #: torch device type the backend communicates on ('cuda', 'cpu', ...).
    device_type: ClassVar[str] = "cpu"
    #: Detection order: higher is tried first.
    priority: ClassVar[int] = 0
    #: One line for ``hwdist env``.
    description: ClassVar[str] = ""
    #: Name torch knows the backend by, if it differs from ``name``.
    torch_backend: ClassVar[Optional[str]] = None
    #: Vendor Python package that must import for the backend to work.
    vendor_module: ClassVar[Optional[str]] = None
    #: Other names torch may report for this backend (``get_backend``).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Environment variables that tune this backend, shown by ``hwdist env``: names, or prefixes ending in '*'.
    env_vars: ClassVar[tuple[str, ...]] = ()
    #: The launcher every rank must come from (``'mpi'``: one mpiexec job), or None if any will do.
    required_launcher: ClassVar[Optional[str]] = None

    # ---- capability table -------------------------------------------------
    #: Collective ops implemented natively (others are emulated or refused).
    native_ops: ClassVar[frozenset[str]] = ALL_OPS
    #: Ops whose flat one-tensor form (torch's ``all_gather_into_tensor``, ``reduce_scatter_tensor``) the
    #: backend implements; hwdist's own flat calls use the list form where it is missing.
    flat_ops: ClassVar[frozenset[str]] = frozenset({"all_gather", "reduce_scatter"})
    #: Reduce ops implemented natively ('avg' is the native mean).
    reduce_ops: ClassVar[frozenset[str]] = frozenset(
        {"sum", "product", "min", "max", "band", "bor", "bxor"}
    )
    #: dtypes the library can move at all (None: every dtype).
    dtypes: ClassVar[Optional[frozenset[torch.dtype]]] = None
    #: dtypes the library can reduce (None: the same as ``dtypes``).
    reduce_dtypes: ClassVar[Optional[frozenset[torch.dtype]]] = None
    #: dtypes for which the native 'avg' is correct.
    avg_dtypes: ClassVar[frozenset[torch.dtype]] = _FLOATING
    #: Whether torch's own object collectives work on this backend.
    native_object_collectives: ClassVar[bool] = True
    #: How many ranks of one job may share one device (None: any number).
    ranks_per_device: ClassVar[Optional[int]] = None
    #: Whether ``async_op=True`` is supported.
    supports_async: ClassVar[bool] = True
    #: Tensors of at least this many bytes are reduced in place, not packed into a flat buffer (0: pack all).
    pack_max_bytes: ClassVar[int] = 0
    #: hwdist's own small flat reductions (``all_reduce_dict``) whose gathered size (bytes x ranks) is at most
    #: this go as one all_gather plus a local reduction, where that is faster than the backend's all_reduce
    #: (0: always all_reduce). Public ``all_reduce`` calls always issue torch's all_reduce.
    reduce_by_gather_max_bytes: ClassVar[int] = 0

    def __init__(self) -> None:
        self._plans: dict[tuple[str, torch.dtype, Optional[str]], Plan] = {}

    # ---- presence ---------------------------------------------------------
    def is_available(self) -> bool:
        """Whether this backend can run in this process."""
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        return None

    def device_count(self) -> int:
        """Number of devices of ``device_type`` visible to this process."""
        return 1

    def is_initialized(self) -> bool:
        """Whether this process has initialised the device runtime (forking it is then unsafe)."""
        return False

    def details(self) -> dict[str, Any]:
        """Extra runtime facts for ``hwdist env`` (versions, launchers); {} if none."""
        return {}

    def synchronize(self) -> None:
        """Wait until the work queued on this process's device has finished (a no-op on the CPU)."""

    # ---- placement --------------------------------------------------------
    def set_device(self, local_rank: int) -> None:
        """Bind this process to the device for ``local_rank``."""

    def current_device(self) -> torch.device:
        """The device this process is bound to."""
        return torch.device(self.device_type)

    def comm_device(self) -> torch.device:
        """The device tensors must be on to be communicated."""
        return self.current_device()

    def device_id(self, local_rank: int) -> Optional[torch.device]:
        """The ``device_id`` to pass to init_process_group, if any."""
        return None

    # ---- process group ----------------------------------------------------
    #: Creator passed to ``torch.distributed.Backend.register_backend`` for
    #: backends torch does not know; signature (store, rank, size, timeout).
    process_group_factory: ClassVar[Optional[Callable[..., Any]]] = None

    @property
    def torch_name(self) -> str:
        """The backend name handed to torch.distributed."""
        return self.torch_backend or self.name

    # ---- capability planning ----------------------------------------------
    def plan(self, op: str, dtype: torch.dtype, reduce_op: Optional[str] = None) -> Plan:
        """The plan for ``op`` on ``dtype`` (and ``reduce_op``); cached."""
        key = (op, dtype, reduce_op)
        found = self._plans.get(key)
        if found is None:
            found = self._plans[key] = self._make_plan(op, dtype, reduce_op)
        return found

    def _can_move(self, dtype: torch.dtype) -> bool:
        return self.dtypes is None or dtype in self.dtypes

    def _can_reduce(self, dtype: torch.dtype) -> bool:
        allowed = self.reduce_dtypes if self.reduce_dtypes is not None else self.dtypes
        return allowed is None or dtype in allowed

    def _native_op(self, op: str) -> str:
        if op in self.native_ops:
            return op
        alt = EMULATIONS.get(op)
        if alt is not None and alt in self.native_ops:
            return alt
        raise PlanError(
            f"backend '{self.name}' has no '{op}' and no emulation for it"
            f" (native ops: {', '.join(sorted(self.native_ops))})"
        )

    def _view_dtype(self, dtype: torch.dtype) -> torch.dtype:
        size = _itemsize(dtype)
        for cand in _VIEW_DTYPES:
            if self._can_move(cand) and size % _itemsize(cand) == 0:
                return cand
        raise PlanError(
            f"backend '{self.name}' cannot move {_dtname(dtype)}: no supported dtype"
            " to carry its bytes"
        )

    def _make_plan(self, op: str, dtype: torch.dtype, reduce_op: Optional[str]) -> Plan:
        if op not in ALL_OPS:
            raise ValueError(f"unknown op {op!r}; expected one of {', '.join(sorted(ALL_OPS))}")
        native = self._native_op(op)
        if op in MOVE_OPS or (op == "barrier"):
            if self._can_move(dtype):
                return Plan(op, native, dtype, dtype)
            return Plan(op, native, dtype, self._view_dtype(dtype), view=True)
        return self._reduce_plan(op, native, dtype, reduce_op or "sum")

    def _reduce_plan(self, op: str, native: str, dtype: torch.dtype, rop: str) -> Plan:
        where = f"{op}(op='{rop}') on {_dtname(dtype)} with backend '{self.name}'"
        if rop not in REDUCE_OP_NAMES:
            raise ValueError(
                f"unknown reduce op {rop!r}; expected one of {', '.join(REDUCE_OP_NAMES)}"
            )
        comm = dtype
        view = False
        if dtype in _COMPLEX_AS_REAL:
            if rop not in ("sum", "mean"):
                raise PlanError(f"{where}: only 'sum' and 'mean' are defined on complex tensors")
            if not self._can_reduce(dtype):
                comm, view = _COMPLEX_AS_REAL[dtype], True
        if dtype == torch.bool:
            if rop not in _BOOL_OPS:
                raise PlanError(f"{where}: '{rop}' is not defined on bool; use 'max' (any) or 'min' (all)")
            # Always: a library's SUM on bool can leave non-canonical bytes (gloo: True == 2).
            rop = _BOOL_OPS[rop]
        if comm.is_floating_point or comm.is_complex:
            if rop in ("band", "bor", "bxor"):
                raise PlanError(f"{where}: bitwise ops need an integer or bool tensor")
        if not self._can_reduce(comm):
            comm = self._widen(comm, where)
        post = Post.NONE
        if rop == "mean":
            if "avg" in self.reduce_ops and comm in self.avg_dtypes:
                rop = "avg"
            else:
                rop, post = "sum", Post.DIVIDE
                if not (comm.is_floating_point or comm.is_complex):
                    comm = self._widest_int(comm)
        if rop == "premul_sum" and rop not in self.reduce_ops:
            raise PlanError(f"{where}: the backend has no premul_sum and no exact emulation")
        if rop not in self.reduce_ops and rop != "avg":
            raise PlanError(
                f"{where}: reduce op not supported (supported: {', '.join(sorted(self.reduce_ops))})"
            )
        return Plan(op, native, dtype, comm, view=view, reduce_op=rop, post=post)

    def _widest_int(self, dtype: torch.dtype) -> torch.dtype:
        # An integer mean sums first: n small ints can overflow their dtype although
        # the mean fits, so sum in the widest integer the backend reduces.
        for wide in (torch.int64, torch.int32):
            if _itemsize(wide) <= _itemsize(dtype):
                break
            if self._can_reduce(wide):
                return wide
        return dtype

    def _widen(self, dtype: torch.dtype, where: str) -> torch.dtype:
        for cand in _WIDEN.get(dtype, ()):
            if self._can_reduce(cand):
                return cand
        raise PlanError(
            f"{where}: the backend cannot reduce {_dtname(dtype)} and no lossless cast exists"
            " (hwdist never casts lossily, e.g. int64 -> int32)"
        )

    def capabilities(self) -> dict[str, Any]:
        """The capability table as plain data (for ``hwdist env`` and docs)."""
        return {
            "native_ops": sorted(self.native_ops),
            "reduce_ops": sorted(self.reduce_ops),
            "flat_ops": sorted(self.flat_ops),
            "dtypes": None if self.dtypes is None else sorted(_dtname(d) for d in self.dtypes),
            "reduce_dtypes": None
            if self.reduce_dtypes is None
            else sorted(_dtname(d) for d in self.reduce_dtypes),
            "native_object_collectives": self.native_object_collectives,
            "supports_async": self.supports_async,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} device_type={self.device_type!r}>"


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _dtname(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


#: Integer dtypes hwdist's own bytes (object collectives) may travel in, smallest first.
BYTE_CARRIERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def byte_carrier(driver: Any, op: str) -> torch.dtype:
    """The smallest integer dtype ``driver`` moves as it is for ``op``: hwdist's bytes travel in it.

    The bytes are padded to a multiple of its size (the receiver knows the true
    length), so any driver that can move one integer dtype carries objects.

    Raises:
        PlanError: the driver moves no integer dtype for ``op`` (names what it needs).
    """
    first: Optional[PlanError] = None
    for cand in BYTE_CARRIERS:
        try:
            plan = driver.plan(op, cand)
        except PlanError as exc:
            first = first or exc
            continue
        if not plan.cast:
            return cand
    names = ", ".join(_dtname(d) for d in BYTE_CARRIERS)
    why = f" ({first})" if first is not None else ""
    raise PlanError(
        f"backend '{driver.name}' cannot carry bytes for '{op}' (object collectives need it): it moves none"
        f" of {names} as it is{why}. HINT: add one integer dtype (e.g. torch.int32) to the driver's dtypes"
    )
