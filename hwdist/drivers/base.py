"""The driver interface: what a communication backend knows about itself.

A driver is small and declarative. Its capability declarations (class
attributes) become one frozen [`Capabilities`][hwdist.drivers.base.Capabilities]
object ([`Driver.caps`][hwdist.drivers.base.Driver.caps]); the pure planner
[`plan`][hwdist.drivers.base.plan] turns it into a [`Plan`][hwdist.drivers.base.Plan]
for one call (pass through, lossless cast, byte view, emulation, or a clear
error). Collectives never look at a backend name: they ask the driver for a plan.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar, Optional

import torch

from .. import _compat
from ..errors import BackendError, PlanError
from ._planner import (
    ALL_OPS,
    EMULATIONS,
    MOVE_OPS,
    REDUCE_OP_NAMES,
    REDUCE_OPS,
    Capabilities,
    Plan,
    Post,
    checked_plan,
    dtype_name,
    plan,
)

__all__ = [
    "Driver",
    "Capabilities",
    "Plan",
    "PlanError",
    "Post",
    "plan",
    "byte_carrier",
    "MOVE_OPS",
    "REDUCE_OPS",
    "ALL_OPS",
    "REDUCE_OP_NAMES",
    "EMULATIONS",
]


#: The package of hwdist's own drivers, whose plans come from the planner and need no check.
_OWN = __name__.rpartition(".")[0] + "."


class Driver(abc.ABC):
    """Base class of every driver: subclass it, set ``device_type`` and declare the capability table.

    Abstract member (a subclass must give it): ``device_type``. Everything else
    has a default; registration ([`hwdist.register_backend`][hwdist.registry.register_backend])
    accepts only instances and subclasses of this class. The members, by what
    they are about:

    * identity: ``name``, ``device_type``, ``priority``, ``description``,
      ``torch_backend`` (read as ``torch_name``), ``aliases``, ``vendor_module``;
    * presence: ``unavailable_reason()`` (``is_available()`` derives from it),
      ``device_count()``, ``is_initialized()``;
    * placement: ``set_device(local_rank)``, ``current_device()``,
      ``comm_device()``, ``device_id(local_rank)``, ``compute_device_type()``, ``synchronize()``;
    * start-up: ``process_group_factory``, ``required_launcher``, ``ranks_per_device``;
    * capabilities: the declarations below, gathered into the frozen ``caps``,
      and ``plan(op, dtype, reduce_op)``;
    * for ``hwdist env``: ``details()``, ``env_vars``.
    """

    #: Backend name users pass to init_dist / init_process_group (set by registration).
    name: str = ""
    #: Detection order: higher is tried first; negative means "only when named".
    priority: ClassVar[int] = 0
    #: One line for ``hwdist env``.
    description: ClassVar[str] = ""
    #: Name torch knows the backend by, if it differs from ``name``.
    torch_backend: Optional[str] = None
    #: Vendor Python package that must import for the backend to work.
    vendor_module: ClassVar[Optional[str]] = None
    #: Other names torch may report for this backend (``get_backend``).
    aliases: tuple[str, ...] = ()
    #: Environment variables that tune this backend, shown by ``hwdist env``: names, or prefixes ending in
    #: '*'.
    env_vars: ClassVar[tuple[str, ...]] = ()
    #: The launcher every rank must come from (``'mpi'``: one mpiexec job), or None if any will do.
    required_launcher: ClassVar[Optional[str]] = None
    #: How many ranks of one job may share one device (None: any number).
    ranks_per_device: ClassVar[Optional[int]] = None
    #: Creator passed to ``torch.distributed.Backend.register_backend`` for
    #: backends torch does not know; signature (store, rank, size, timeout).
    process_group_factory: Optional[Callable[..., Any]] = None

    # ---- capability declarations (gathered into ``caps``; see Capabilities) ----
    # Defaults are Capabilities' own: one place states them.
    #: Collective ops implemented natively (others are emulated or refused).
    native_ops: frozenset[str] = Capabilities.native_ops
    #: Ops whose flat one-tensor form (torch's ``all_gather_into_tensor``, ``reduce_scatter_tensor``) the
    #: backend implements; hwdist's own flat calls use the list form where it is missing.
    flat_ops: frozenset[str] = Capabilities.flat_ops
    #: Reduce ops implemented natively ('avg' is the native mean).
    reduce_ops: frozenset[str] = Capabilities.reduce_ops
    #: dtypes the library can move at all (None: every dtype).
    dtypes: Optional[frozenset[torch.dtype]] = Capabilities.dtypes
    #: dtypes the library can reduce (None: the same as ``dtypes``).
    reduce_dtypes: Optional[frozenset[torch.dtype]] = Capabilities.reduce_dtypes
    #: dtypes for which the native 'avg' is correct.
    avg_dtypes: frozenset[torch.dtype] = Capabilities.avg_dtypes
    #: Whether torch's own object collectives work on this backend.
    native_object_collectives: bool = Capabilities.native_object_collectives
    #: Whether ``async_op=True`` is supported.
    supports_async: bool = Capabilities.supports_async
    #: ``(reduce op, dtype)`` pairs the library accepts but computes wrongly: planned around, never issued.
    inexact_reductions: frozenset[tuple[str, torch.dtype]] = Capabilities.inexact

    #: Ops whose torch ``Work`` never says it has completed (``is_completed()`` stays False after
    #: ``wait()``). Not a capability: nothing is planned around it. The hwdist torch backend hands
    #: such a Work back inside one that reports completion once waited, so that its flight recorder
    #: can let the call (and the Work's buffers) go.
    silent_works: frozenset[str] = frozenset()

    _caps: Optional[Capabilities] = None

    def __init__(self) -> None:
        self._plans: dict[tuple[str, torch.dtype, Optional[str]], Plan] = {}

    @property
    @abc.abstractmethod
    def device_type(self) -> str:
        """torch device type the backend communicates on ('cuda', 'cpu', ...); a subclass sets it."""

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

    def vendor_note(self) -> Optional[str]:
        """A line on who really makes this driver's device when it is not who the name says (a ``cuda``
        device that is not NVIDIA's), for ``hwdist env`` and ``detect()``; None when nothing to say."""
        return None

    def synchronize(self) -> None:
        """Wait until the work queued on this process's device has finished (a no-op on the CPU)."""
        return None

    def compute_device_type(self) -> str:
        """The device type a process on this backend computes on (``get_device()``); ``device_type``."""
        return self.device_type

    # ---- placement --------------------------------------------------------
    def set_device(self, local_rank: int) -> None:
        """Bind this process to the device for ``local_rank``."""
        return None

    def current_device(self) -> torch.device:
        """The device this process is bound to."""
        return torch.device(self.device_type)

    def comm_device(self) -> torch.device:
        """The device tensors must be on to be communicated."""
        return self.current_device()

    def device_id(self, local_rank: int) -> Optional[torch.device]:
        """The ``device_id`` to pass to init_process_group, if any."""
        return None

    @property
    def torch_name(self) -> str:
        """The backend name handed to torch.distributed."""
        return self.torch_backend or self.name

    # ---- capabilities and planning ----------------------------------------
    @property
    def caps(self) -> Capabilities:
        """The frozen capability table, built once from the declarations (rebuilt if the name changes)."""
        caps = self._caps
        if caps is None or caps.backend != self.name:
            caps = self._caps = Capabilities(
                backend=self.name,
                native_ops=self._native_ops(),
                flat_ops=self._flat_ops(),
                reduce_ops=frozenset(self.reduce_ops),
                dtypes=None if self.dtypes is None else frozenset(self.dtypes),
                reduce_dtypes=None if self.reduce_dtypes is None else frozenset(self.reduce_dtypes),
                avg_dtypes=frozenset(self.avg_dtypes),
                native_object_collectives=bool(self.native_object_collectives),
                supports_async=bool(self.supports_async),
                inexact=frozenset(self.inexact_reductions),
            )
        return caps

    def _over_gloo(self) -> bool:
        """Whether the driver's groups are torch's gloo (``torch_backend``, or a CPU driver, no factory)."""
        return self.torch_name == "gloo" or (self.process_group_factory is None and self.device_type == "cpu")

    def _native_ops(self) -> frozenset[str]:
        """``native_ops``, less the list all_to_all where the driver runs over a gloo that has none
        (torch < 2.12): such a driver keeps the default declaration, which its gloo group cannot honour
        there. Its all_to_all then goes as ``all_to_all_single`` (see ``_flat_ops``)."""
        native = frozenset(self.native_ops)
        if "all_to_all" in native and self._over_gloo() and not _compat.GLOO_HAS_ALL_TO_ALL_LIST:
            native -= {"all_to_all"}
        return native

    def _flat_ops(self) -> frozenset[str]:
        """``flat_ops`` as a driver over torch's gloo can honour them: less the flat all_gather where
        that gloo has none (torch 2.1); with ``all_to_all_single`` (every torch) where the driver
        declares all_to_all but gloo has no list form (torch < 2.12)."""
        flat = frozenset(self.flat_ops)
        if not self._over_gloo():
            return flat
        if not _compat.GLOO_HAS_ALL_GATHER_INTO_TENSOR:
            flat -= {"all_gather"}
        if "all_to_all" in self.native_ops and not _compat.GLOO_HAS_ALL_TO_ALL_LIST:
            flat |= {"all_to_all"}
        return flat

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass outside hwdist's own drivers that defines ``plan`` gets it checked."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("plan")
        if callable(own) and not getattr(own, "checked", False) and not cls.__module__.startswith(_OWN):
            cls.plan = checked_plan(own)  # type: ignore[method-assign]

    def plan(self, op: str, dtype: torch.dtype, reduce_op: Optional[str] = None) -> Plan:
        """The plan for ``op`` on ``dtype`` (and ``reduce_op``): the planner over ``caps``.

        One dict lookup once a combination has been planned. A driver may
        override it; it must then return a [`Plan`][hwdist.drivers.base.Plan]
        for that op and dtype or raise [`PlanError`][hwdist.drivers.base.PlanError].
        """
        try:
            return self._plans[op, dtype, reduce_op]
        except (KeyError, AttributeError):
            return self._first_plan(op, dtype, reduce_op)

    def _first_plan(self, op: str, dtype: torch.dtype, reduce_op: Optional[str]) -> Plan:
        found = plan(self.caps, op, dtype, reduce_op)  # raises PlanError or ValueError: never cached
        if "_plans" not in self.__dict__:  # a subclass __init__ that did not call ours
            self._plans = {}
        self._plans[op, dtype, reduce_op] = found
        return found

    def capabilities(self) -> dict[str, Any]:
        """The capability table as plain data (for ``hwdist env`` and docs)."""
        return self.caps.as_dict()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} device_type={self.device_type!r}>"


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
            found = driver.plan(op, cand)
        except PlanError as exc:
            first = first or exc
            continue
        if not found.cast:
            return cand
    names = ", ".join(dtype_name(d) for d in BYTE_CARRIERS)
    why = f" ({first})" if first is not None else ""
    raise PlanError(
        f"backend '{driver.name}' cannot carry bytes for '{op}' (object collectives need it): it moves none"
        f" of {names} as it is{why}. HINT: add one integer dtype (e.g. torch.int32) to the driver's dtypes"
    )


def check_driver(name: str, driver: Any) -> Driver:
    """``driver`` (an instance, or a class constructed with no arguments) if it is a
    [`Driver`][hwdist.drivers.base.Driver] with a usable priority and device type: what
    ``hwdist.register_backend`` accepts.

    Raises:
        BackendError: naming the backend, what is wrong and how to write it.
    """
    if isinstance(driver, type) and issubclass(driver, Driver):
        missing = sorted(getattr(driver, "__abstractmethods__", ()))
        if missing:
            raise BackendError(
                f"driver class {driver.__name__} for backend {name!r} does not set {', '.join(missing)};"
                f' e.g. device_type = "cpu"'
            )
        try:
            driver = driver()
        except TypeError as exc:
            raise BackendError(
                f"driver class {driver.__name__} for backend {name!r} must be constructible"
                f" with no arguments: {exc}"
            ) from exc
    if not isinstance(driver, Driver):
        what = driver.__name__ if isinstance(driver, type) else f"{type(driver).__name__} instance"
        raise BackendError(
            f"driver for backend {name!r} must be a hwdist.Driver subclass or instance, got {what}."
            f' HINT: class MyDriver(hwdist.Driver): device_type = "cpu"'
        )
    prio = driver.priority
    if isinstance(prio, bool) or not isinstance(prio, (int, float)) or prio != prio:
        raise BackendError(f"driver for backend {name!r}: priority must be a number, got {prio!r}")
    if not isinstance(driver.device_type, str) or not driver.device_type:
        raise BackendError(
            f"driver for backend {name!r}: device_type must be a non-empty str, got {driver.device_type!r}"
        )
    return driver
