"""The one dispatch point: backend names and process groups -> drivers.

Built-in drivers are registered when this module is imported (a dict insert,
no vendor import). Third-party drivers come from the ``hwdist.drivers``
entry-point group, loaded the first time a name is looked up that is not yet
registered, or the first time the list of backends is asked for.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional, TypeVar, Union, overload

import torch

from . import _compat
from ._plugins import load_plugins, register_or_decorate
from .drivers import BUILTIN_DRIVERS, LEGACY_BACKENDS
from .drivers._startup import fallback_process_group_factory
from .drivers.base import ALL_OPS, REDUCE_OP_NAMES, REDUCE_OPS, Driver, Plan, PlanError, Post

__all__ = [
    "register_backend",
    "unregister_backend",
    "get_driver",
    "resolve",
    "list_backends",
    "available_backends",
    "BackendError",
    "ENTRY_POINT_GROUP",
    "record_group",
]

ENTRY_POINT_GROUP = "hwdist.drivers"

_lock = threading.RLock()
_drivers: dict[str, Driver] = {}
_aliases: dict[str, str] = {}
_entry_points_loaded = False
# (id(group), device type) -> (group, driver); the group is kept so its id is not reused.
_group_cache: dict[tuple[int, Optional[str]], tuple[Any, Driver]] = {}
#: Bumped whenever the group -> driver resolutions are forgotten (a backend (un)registered, a group
#: recorded, ``clear_cache``): a cache of ``resolve``'s answers elsewhere (the collective engine's
#: default-group view) is valid while the generation it was filled under is current.
generation = 0
# Process group -> the driver hwdist created it with (weak: a destroyed, dropped group leaves).
_group_drivers: "weakref.WeakKeyDictionary[Any, Driver]" = weakref.WeakKeyDictionary()

D = TypeVar("D", bound=Union[Driver, type])


from .errors import BackendError  # noqa: E402


def _names() -> str:
    return ", ".join(_drivers)


def _hint(name: str) -> str:
    return f"HINT: hwdist.register_backend({name!r}, ...)"


def _check_driver(name: str, driver: Any) -> Driver:
    """``driver`` (an instance, or a class constructed with no arguments) if it is a
    [`Driver`][hwdist.drivers.base.Driver].
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
    if not isinstance(driver.device_type, str) or not driver.device_type:
        raise BackendError(
            f"driver for backend {name!r}: device_type must be a non-empty str, got {driver.device_type!r}"
        )
    return driver


def _torch_reserved(name: str) -> bool:
    """Whether torch.distributed reserves ``name`` for a backend of its own (``Backend.<NAME>``)."""
    if not _compat.DIST_AVAILABLE:
        return False
    import torch.distributed as dist

    return isinstance(getattr(dist.Backend, name.upper(), None), str)


def _check_torch_name(key: str, inst: Driver) -> None:
    """Refuse torch names no process group can ever be created under (raised at registration)."""
    if not _compat.DIST_AVAILABLE:
        return
    import torch.distributed as dist

    torch_name = str(inst.torch_name or key).lower()
    if torch_name == getattr(dist.Backend, "UNDEFINED", None):
        raise BackendError(
            f"cannot register {key!r}: its torch name {torch_name!r} is torch.distributed.Backend.UNDEFINED,"
            " which names no backend. HINT: register it under another name"
        )
    if _torch_reserved(torch_name) and inst.process_group_factory is not None:
        raise BackendError(
            f"cannot register {key!r} ({type(inst).__name__}): it gives process_group_factory, but its torch"
            f" name {torch_name!r} is torch's own backend (torch.distributed.Backend.{torch_name.upper()}),"
            " so torch would never call the factory. HINT: drop torch_backend, or register the driver"
            " under a name torch does not reserve"
        )


def _register(name: str, driver: Any, override: bool) -> Driver:
    if not isinstance(name, str) or not name or name != name.strip():
        raise BackendError(f"backend name must be a non-empty str without spaces, got {name!r}")
    key = name.lower()
    if key in LEGACY_BACKENDS:
        raise BackendError(f"cannot register {name!r}: {LEGACY_BACKENDS[key]}")
    inst = _check_driver(key, driver)
    # The registered name wins; one driver class registered under a second name gets its own instance name.
    inst.name = key
    _check_torch_name(key, inst)
    _guard_plan(inst)
    with _lock:
        if key in _drivers and not override:
            same = "" if name == key else f" as {key!r} (backend names are case-insensitive)"
            raise BackendError(
                f"backend {name!r} is already registered{same} ({_drivers[key]!r});"
                f" pass override=True to replace it. Registered: {_names()}"
            )
        _drivers[key] = inst
        for alias in inst.aliases or ():
            _aliases[alias.lower()] = key
        torch_name = inst.torch_name
        if isinstance(torch_name, str) and torch_name.lower() != key:
            # A shared torch name (torch_backend = "gloo") is no alias: groups hwdist creates
            # record their driver, and a name torch reports resolves to the driver of that name.
            _aliases.setdefault(torch_name.lower(), key)
        _forget()
    return inst


# The same overloads and decorator-or-call form as register_launcher, on purpose: one registration style.
@overload
def register_backend(name: str, driver: None = None, *, override: bool = False) -> Callable[[D], D]: ...
@overload
def register_backend(name: str, driver: Any, *, override: bool = False) -> Driver: ...
def register_backend(name: str, driver: Any = None, *, override: bool = False) -> Any:
    """Register a driver for backend ``name``; also usable as a class decorator.

    Args:
        name: the backend name users pass to ``init_dist`` (case-insensitive).
        driver: a [`hwdist.Driver`][hwdist.drivers.base.Driver] instance or subclass. Omit it to use
            ``register_backend`` as a decorator on a driver class.
        override: replace an existing registration instead of raising.

    Returns:
        The registered driver instance, or (decorator form) the class itself.

    Raises:
        BackendError: duplicate name without ``override``, malformed driver.

    Examples:
        >>> @hwdist.register_backend("mybackend")
        ... class MyDriver(hwdist.Driver):
        ...     device_type = "cpu"
    """
    return register_or_decorate(_register, name, driver, override)


def unregister_backend(name: str) -> Driver:
    """Remove backend ``name`` and return its driver.

    Raises:
        BackendError: if ``name`` is not registered.
    """
    key = name.lower()
    with _lock:
        if key not in _drivers:
            raise BackendError(f"unknown backend {name!r}; registered: {_names()}")
        drv = _drivers.pop(key)
        for alias in [a for a, k in _aliases.items() if k == key]:
            del _aliases[alias]
        _forget()
    return drv


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    load_plugins(
        ENTRY_POINT_GROUP, "driver", _drivers.__contains__, lambda n, obj: _register(n, obj, override=False)
    )


def list_backends() -> list[str]:
    """Names of every registered backend, in detection order (highest priority first)."""
    _load_entry_points()
    with _lock:
        drivers = list(_drivers.values())
    return [d.name for d in sorted(drivers, key=lambda d: -d.priority)]


def available_backends() -> list[str]:
    """Registered backends that can run in this process, in detection order."""
    return [n for n in list_backends() if _drivers[n].is_available()]


def require_available(driver: Driver, subject: str) -> None:
    """Raise BackendError ``"<subject> not available here: <why>. Available: ..."`` if ``driver`` cannot run.

    ``subject`` is the start of the message, e.g. ``"backend 'nccl' is"``.
    """
    why = driver.unavailable_reason()
    if why is not None:
        raise BackendError(
            f"{subject} not available here: {why}. Available: {', '.join(available_backends())}"
        )


def registered(name: str) -> Optional[Driver]:
    """The driver registered under ``name`` (case-insensitive), or None; loads no entry point, raises nothing.
    """
    return _drivers.get(name.lower())


def drivers() -> list[Driver]:
    """Every registered driver, in detection order."""
    return [_drivers[n] for n in list_backends()]


def get_driver(name_or_group: Any = None, device: Union[str, torch.device, None] = None) -> Driver:
    """The driver for a backend name, a process group, or the default group.

    Args:
        name_or_group: a backend name (``nccl``, ``cpu:gloo,cuda:nccl``,
            a custom name), a ``ProcessGroup``, or None for the default group.
        device: for mixed backend strings, the device type the data is on.

    Raises:
        BackendError: unknown name (the message lists the registered ones).
    """
    if name_or_group is None or not isinstance(name_or_group, str):
        return resolve(name_or_group, device)
    return _lookup(name_or_group, device)


def _lookup(backend: str, device: Union[str, torch.device, None] = None) -> Driver:
    key = backend.strip().lower()
    if ":" in key or "," in key:
        return _lookup(_pick_from_mixed(key, device), None)
    drv = _drivers.get(key)
    if drv is None:
        alias = _aliases.get(key)
        if alias is not None:
            return _drivers[alias]
        if key in LEGACY_BACKENDS:
            raise BackendError(f"backend {backend!r}: {LEGACY_BACKENDS[key]}")
        _load_entry_points()
        drv = _drivers.get(key) or _drivers.get(_aliases.get(key, ""), None)
        if drv is None:
            raise BackendError(f"unknown backend {backend!r}; registered: {_names()}. {_hint(key)}")
    return drv


def _pick_from_mixed(spec: str, device: Union[str, torch.device, None]) -> str:
    """Pick one backend out of ``'cpu:gloo,cuda:nccl'`` for a device type."""
    mapping: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" not in part:
            return part
        dev, _, name = part.partition(":")
        mapping[dev.strip()] = name.strip()
    if not mapping:
        raise BackendError(f"cannot parse backend string {spec!r}; expected 'DEVICE:BACKEND,DEVICE:BACKEND'")
    if device is not None:
        dtype = device if isinstance(device, str) else device.type
        dtype = dtype.split(":")[0]
        if dtype in mapping:
            return mapping[dtype]
    # No device given (barriers, object collectives): prefer the accelerator entry,
    # as torch does for its own object collectives.
    for dev, name in mapping.items():
        if dev != "cpu":
            drv = _drivers.get(name) or _drivers.get(_aliases.get(name, ""), None)
            if drv is not None and drv.is_available():
                return name
    return mapping.get("cpu", next(iter(mapping.values())))


def resolve(group: Any = None, device: Union[str, torch.device, None] = None) -> Driver:
    """The driver of process group ``group`` (default group if None).

    A group hwdist created (``init_dist``, ``init_backend``, the local groups,
    [`hwdist.new_group`][hwdist.launch.core.new_group]) resolves to the driver it was created with, even
    when several drivers share one torch backend (``torch_backend = "gloo"``).
    Any other group resolves by the backend name torch reports for it.
    Cached per group and device type; the cache is cleared when backends are
    (un)registered or a process group is destroyed through hwdist.

    Examples:
        >>> hwdist.init_dist("pytorch", backend="mycl")
        >>> hwdist.resolve().name
        # rank 0: 'mycl'   rank 1: 'mycl'
    """
    dtype = None if device is None else (device if isinstance(device, str) else device.type)
    if group is None and _compat.DIST_AVAILABLE:
        group = _compat.default_group()
    hit = _group_cache.get((id(group), dtype))
    if hit is not None and hit[0] is group:
        return hit[1]
    import torch.distributed as dist

    if group is None or not dist.is_initialized():
        raise RuntimeError(
            "no process group: call hwdist.init_dist(...) (or torch.distributed.init_process_group) first"
        )
    drv = _recorded(group)
    if drv is None:
        drv = _lookup(str(dist.get_backend(group)), dtype)
    _group_cache[(id(group), dtype)] = (group, drv)
    return drv


def _recorded(group: Any) -> Optional[Driver]:
    try:
        return _group_drivers.get(group)
    except TypeError:  # not weak-referenceable: not a group hwdist created
        return None


def record_group(group: Any, driver: Driver) -> None:
    """Remember that hwdist created ``group`` with ``driver`` (``resolve`` then returns it).

    Called by hwdist wherever it creates a process group; the entry goes when
    the group object does.
    """
    if group is None:
        return
    try:
        _group_drivers[group] = driver
    except TypeError:  # e.g. torch's NON_GROUP_MEMBER sentinel on ranks outside a new group
        return
    _forget()


def group_backend_name(group: Any = None) -> str:
    """What ``hwdist.get_backend`` reports: the driver's name for a group hwdist created,
    else the name torch reports (an alias mapped to its driver's name, e.g. the mpi4py group)."""
    import torch.distributed as dist

    if group is None:
        group = _compat.default_group()
    drv = _recorded(group)
    if drv is not None:
        return drv.name
    return canonical_name(str(dist.get_backend(group)))


def canonical_name(backend: str) -> str:
    """The registered name for a name torch reports (e.g. an alias), else ``backend`` unchanged.

    A registered driver's own name wins over another driver's alias, so a plain
    ``gloo`` group is ``'gloo'`` even when a driver with ``torch_backend = "gloo"`` is registered.
    """
    key = backend.lower()
    if key in _drivers:
        return key
    return _aliases.get(key, backend)


def clear_cache() -> None:
    """Forget group -> driver resolutions (call after destroying groups)."""
    _forget()


def _forget() -> None:
    global generation
    _group_cache.clear()
    generation += 1


def _torch_backend_names() -> str:
    import torch.distributed as dist

    undefined = getattr(dist.Backend, "UNDEFINED", None)
    return ", ".join(n for n in dist.Backend.backend_list if n != undefined)


def ensure_torch_backend(driver: Driver) -> None:
    """Make torch able to create ``driver``'s process group, or raise why it cannot.

    The start-up rule, for the driver's torch name (``torch_backend`` or its name):

    1. a name torch reserves for its own backend (``Backend.GLOO``, ...): torch
       creates the group; if torch says it cannot here (``is_<name>_available()``
       is False), [`BackendError`][hwdist.registry.BackendError];
    2. a name already registered with torch (an earlier call, another library): used as is;
    3. else the driver's ``process_group_factory`` is registered with torch under that name;
    4. else a driver with the fallback device type (``'cpu'``) runs over gloo under its own name;
    5. else [`BackendError`][hwdist.registry.BackendError] with a HINT.

    Called by ``init_dist`` (before any rendezvous) and ``init_backend`` in every
    process, so every rank raises the same error before any rank waits.
    """
    if not _compat.DIST_AVAILABLE:
        raise BackendError(f"backend {driver.name!r}: this torch has no torch.distributed")
    import torch.distributed as dist

    name = driver.torch_name
    hint = (
        f'HINT: set torch_backend = "<an existing backend>" (torch has: {_torch_backend_names()})'
        " or give process_group_factory"
    )
    if _torch_reserved(name):
        probe = getattr(dist, f"is_{name.lower()}_available", None)
        if callable(probe) and not probe():
            raise BackendError(
                f"backend {driver.name!r}: torch reserves {name!r} for its own backend, and this torch cannot"
                f" create it (torch.distributed.is_{name.lower()}_available() is False). {hint}"
                f" under a name torch does not reserve"
            )
        return
    vendor = driver.vendor_module
    if not _compat.torch_knows_backend(name) and vendor:
        import importlib

        importlib.import_module(vendor)  # vendor extensions register their backend with torch on import
    if _compat.torch_knows_backend(name):
        return
    factory = driver.process_group_factory
    if factory is None:
        factory = fallback_process_group_factory(driver.device_type)
    if factory is None:
        raise BackendError(
            f"backend {driver.name!r} cannot start: torch.distributed has no backend {name!r} and the"
            f" driver ({type(driver).__name__}, device_type {driver.device_type!r}) gives no"
            f" process_group_factory. {hint}"
        )
    _compat.register_torch_backend(name, factory, [driver.device_type])


# --------------------------------------------------------------------------- plan guard
class _CheckedPlan:
    """A driver's own ``plan`` method, checked: the driver is named when it breaks its contract.

    ``plan`` must return a [`Plan`][hwdist.drivers.base.Plan] for the op and dtype asked, or raise
    [`PlanError`][hwdist.drivers.base.PlanError] (no plan) or ValueError (an unknown op or reduce-op name).
    Anything else raises [`BackendError`][hwdist.registry.BackendError] naming the driver; collectives
    ask for their plan before communicating, so every rank raises it there. Only drivers that override
    [`Driver.plan`][hwdist.drivers.base.Driver.plan] get it: the planner's own plans need no check.
    """

    __slots__ = ("_driver", "_raw", "_ok")

    def __init__(self, driver: Driver, raw: Any = None) -> None:
        self._driver = driver
        self._raw = raw
        self._ok: dict[tuple[Any, Any, Any], Plan] = {}

    def __call__(self, op: str, dtype: torch.dtype, reduce_op: Optional[str] = None) -> Plan:
        drv = self._driver
        try:
            if self._raw is not None:
                plan = self._raw(op, dtype, reduce_op)
            else:
                plan = type(drv).plan(drv, op, dtype, reduce_op)
        except (PlanError, ValueError):
            raise
        except Exception as exc:
            raise BackendError(
                f"driver {drv.name!r} ({type(drv).__name__}): plan({op!r}, {dtype}, {reduce_op!r}) raised"
                f" {type(exc).__name__}: {exc}; a driver's plan must return a hwdist.Plan or raise PlanError"
            ) from exc
        key = (op, dtype, reduce_op)
        if self._ok.get(key) is not plan:
            why = _malformed(plan, op, dtype)
            if why:
                raise BackendError(
                    f"driver {drv.name!r} ({type(drv).__name__}): plan({op!r}, {dtype}, {reduce_op!r})"
                    " returned"
                    f" a malformed plan: {why}"
                )
            self._ok[key] = plan
        return plan

    def __reduce__(self) -> Any:
        return (_CheckedPlan, (self._driver,))


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


def _guard_plan(driver: Driver) -> None:
    """Wrap the planning method of a driver that overrides ``Driver.plan`` in a
    [`_CheckedPlan`][hwdist.registry._CheckedPlan] (once).
    """
    own = getattr(driver, "__dict__", None)
    if own is None or type(driver).plan is Driver.plan:
        return  # the planner's plans (or a driver with __slots__ and no __dict__: left as it is)
    if isinstance(own.get("plan"), _CheckedPlan):
        return
    own["plan"] = _CheckedPlan(driver, own.get("plan"))


for _cls in BUILTIN_DRIVERS:
    _register(_cls.name, _cls, override=False)
del _cls
