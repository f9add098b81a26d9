"""The one dispatch point: backend names and process groups -> drivers.

Built-in drivers are registered when this module is imported (a dict insert,
no vendor import). Third-party drivers come from the ``hwdist.drivers``
entry-point group, loaded the first time a name is looked up that is not yet
registered, or the first time the list of backends is asked for.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, TypeVar, Union, overload

import torch

from . import _compat
from ._plugins import load_plugins
from .drivers import BUILTIN_DRIVERS, LEGACY_BACKENDS
from .drivers.base import Driver

__all__ = [
    "register_backend",
    "unregister_backend",
    "get_driver",
    "resolve",
    "list_backends",
    "available_backends",
    "BackendError",
    "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "hwdist.drivers"

#: Members a driver must have (checked at registration).
REQUIRED_MEMBERS = (
    "name",
    "device_type",
    "priority",
    "is_available",
    "unavailable_reason",
    "device_count",
    "set_device",
    "current_device",
    "comm_device",
    "plan",
)


_lock = threading.RLock()
_drivers: dict[str, Driver] = {}
_aliases: dict[str, str] = {}
_entry_points_loaded = False
# (id(group), device type) -> (group, driver); the group is kept so its id is not reused.
_group_cache: dict[tuple[int, Optional[str]], tuple[Any, Driver]] = {}

D = TypeVar("D", bound=Union[Driver, type])


class BackendError(ValueError):
    """An unknown, duplicate, malformed or unavailable backend."""


def _names() -> str:
    return ", ".join(_drivers)


def _hint(name: str) -> str:
    return f"HINT: hwdist.register_backend({name!r}, ...)"


def _check_driver(name: str, driver: Any) -> Driver:
    if isinstance(driver, type):
        try:
            driver = driver()
        except TypeError as exc:
            raise BackendError(
                f"driver class {driver.__name__} for backend {name!r} must be constructible"
                f" with no arguments: {exc}"
            ) from exc
    missing = [m for m in REQUIRED_MEMBERS if not hasattr(driver, m)]
    if missing:
        raise BackendError(
            f"driver for backend {name!r} ({type(driver).__name__}) is missing required"
            f" members: {', '.join(missing)}; expected a hwdist.Driver subclass"
        )
    if not isinstance(driver.device_type, str) or not driver.device_type:
        raise BackendError(
            f"driver for backend {name!r}: device_type must be a non-empty str,"
            f" got {driver.device_type!r}"
        )
    return driver


def _register(name: str, driver: Any, override: bool) -> Driver:
    if not isinstance(name, str) or not name or name != name.strip():
        raise BackendError(f"backend name must be a non-empty str without spaces, got {name!r}")
    key = name.lower()
    if key in LEGACY_BACKENDS:
        raise BackendError(f"cannot register {name!r}: {LEGACY_BACKENDS[key]}")
    inst = _check_driver(key, driver)
    if not getattr(inst, "name", None):
        inst.name = key  # type: ignore[misc]
    elif inst.name.lower() != key:
        # One driver class registered under a second name gets its own instance name.
        inst.name = key  # type: ignore[misc]
    with _lock:
        if key in _drivers and not override:
            raise BackendError(
                f"backend {key!r} is already registered ({_drivers[key]!r});"
                f" pass override=True to replace it. Registered: {_names()}"
            )
        _drivers[key] = inst
        for alias in getattr(inst, "aliases", ()) or ():
            _aliases[alias.lower()] = key
        torch_name = getattr(inst, "torch_name", key)
        if isinstance(torch_name, str) and torch_name.lower() != key:
            _aliases[torch_name.lower()] = key
        _group_cache.clear()
    return inst


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
    if driver is None:

        def decorate(cls: D) -> D:
            _register(name, cls, override)
            return cls

        return decorate
    return _register(name, driver, override)


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
        _group_cache.clear()
    return drv


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    load_plugins(ENTRY_POINT_GROUP, "driver", _drivers.__contains__, lambda n, obj: _register(n, obj, override=False))


def list_backends() -> list[str]:
    """Names of every registered backend, in detection order (highest priority first)."""
    _load_entry_points()
    with _lock:
        drivers = list(_drivers.values())
    return [d.name for d in sorted(drivers, key=lambda d: -d.priority)]


def available_backends() -> list[str]:
    """Registered backends that can run in this process, in detection order."""
    return [n for n in list_backends() if _drivers[n].is_available()]


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

    Cached per group and device type; the cache is cleared when backends are
    (un)registered or a process group is destroyed through hwdist.
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
            "no process group: call hwdist.init_dist(...) (or torch.distributed"
            ".init_process_group) first"
        )
    backend = str(dist.get_backend(group))
    drv = _lookup(backend, dtype)
    _group_cache[(id(group), dtype)] = (group, drv)
    return drv


def canonical_name(backend: str) -> str:
    """The registered name for a name torch reports (e.g. an alias), else ``backend`` unchanged."""
    return _aliases.get(backend.lower(), backend)


def clear_cache() -> None:
    """Forget group -> driver resolutions (call after destroying groups)."""
    _group_cache.clear()


def ensure_torch_backend(driver: Driver) -> None:
    """Make torch know ``driver``'s backend, registering its factory if needed.

    Called by ``init_dist`` in every process before the process group is
    created, so custom backends work in every rank.
    """
    name = driver.torch_name
    if _compat.torch_knows_backend(name):
        return
    factory = getattr(driver, "process_group_factory", None)
    if factory is None:
        return  # a name torch will resolve itself (or reject with its own error)
    _compat.register_torch_backend(name, factory, [driver.device_type])


for _cls in BUILTIN_DRIVERS:
    _register(_cls.name, _cls, override=False)
del _cls
