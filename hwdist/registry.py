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

from . import _compat, _state
from ._plugins import load_plugins, register_or_decorate
from .drivers import BUILTIN_DRIVERS, LEGACY_BACKENDS
from .drivers.startup import check_torch_name, parse_backend_config
from .drivers.base import Driver, check_driver

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
    "record_wrapper",
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

#: torch backend name of a backend that wraps another per device type (hwdist's own torch backend) ->
#: device type -> the hwdist backend it wraps there: a group on it resolves to the wrapped driver.
_wrappers: dict[str, dict[str, str]] = {}

D = TypeVar("D", bound=Union[Driver, type])


from .errors import BackendError  # noqa: E402


def _names() -> str:
    return ", ".join(_drivers)


def close_name(name: str) -> Optional[str]:
    """The registered name (or alias) ``name`` is most likely a misspelling of, if any."""
    import difflib

    close = difflib.get_close_matches(name.lower(), [*_drivers, *_aliases], n=1, cutoff=0.75)
    return close[0] if close else None


def _did_you_mean(name: str) -> str:
    close = close_name(name)
    return f"did you mean {close!r}? " if close else ""


def _hint(name: str) -> str:
    from ._plugins import failure

    why = failure(ENTRY_POINT_GROUP, name)
    if why is not None:  # an installed plug-in of that name did not load: say why, first
        return f"The installed driver plug-in {name!r} failed to load: {why}. HINT: fix or reinstall it"
    if close_name(name) is not None:  # a typo, not a new backend
        return "HINT: check the spelling"
    return f"HINT: hwdist.register_backend({name!r}, ...)"


def _register(name: str, driver: Any, override: bool) -> Driver:
    if not isinstance(name, str) or not name or name != name.strip():
        raise BackendError(f"backend name must be a non-empty str without spaces, got {name!r}")
    key = name.lower()
    if key in LEGACY_BACKENDS:
        raise BackendError(f"cannot register {name!r}: {LEGACY_BACKENDS[key]}")
    inst = check_driver(key, driver)
    # The registered name wins; one driver class registered under a second name gets its own instance name.
    inst.name = key
    check_torch_name(key, inst)
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
            a custom name, a backend torch knows and hwdist does not), a ``ProcessGroup``,
            or None for the default group.
        device: the device type the data is on: picks the entry of a mixed backend string, and the
            driver of a name several devices share (``hccl`` on ``npu`` and on ``hpu``).

    Raises:
        BackendError: unknown name (the message lists the registered ones).
    """
    if name_or_group is None or not isinstance(name_or_group, str):
        return resolve(name_or_group, device)
    return _lookup(name_or_group, device)


def _device_type(device: Union[str, torch.device, None]) -> Optional[str]:
    """``'cuda'`` for ``torch.device('cuda', 1)``, ``'cuda:1'`` or ``'cuda'``; None for None."""
    if device is None:
        return None
    text = device if isinstance(device, str) else device.type
    return text.split(":")[0].strip().lower()


def _lookup(backend: str, device: Union[str, torch.device, None] = None) -> Driver:
    key = backend.strip().lower()
    dtype = _device_type(device)
    if ":" in key or "," in key:
        return _driver_for(*_pick_from_mixed(key, dtype))
    if dtype is not None:
        pair = _for_pair(dtype, key)
        if pair is not None:
            return pair
    return _by_name(key, backend)


def _no_tensor_device(mapping: dict[str, str], order: list[str]) -> str:
    """The device a call without a tensor uses (object collectives, barrier, hwdist's own traffic).

    torch's own rule (``distributed_c10d._get_object_coll_device``, torch 2.1 through 2.15): the only
    backend when the group has one; the CPU's when the group has a CPU backend (an object is in CPU
    memory: no copy to a device); otherwise the first device torch lists for the group.
    """
    if len(mapping) == 1:
        return next(iter(mapping))
    if "cpu" in mapping:
        return "cpu"
    for dev in order:
        if dev in mapping:
            return dev
    return next(iter(mapping))


def _choose(
    mapping: dict[str, str], dtype: Optional[str], config: str, who: str, order: list[str]
) -> tuple[str, str]:
    """(device type, backend name) of the group's backend for data on ``dtype`` (None: no tensor).

    A device the map names uses its backend. A CPU tensor on a group without a CPU backend uses the
    backend of a call without a tensor: hwdist moves it to that backend's device and back (as it always
    has, e.g. a CPU tensor on an NCCL group), and so does a tensor on the device that backend's driver
    computes on (gloo on Apple silicon computes on ``mps``). Any other device is refused.
    """
    if dtype is not None and dtype in mapping:
        return dtype, mapping[dtype]
    dev = _no_tensor_device(mapping, order)
    if dtype is None or dtype == "cpu":
        return dev, mapping[dev]
    if _driver_for(dev, mapping[dev]).compute_device_type() == dtype:
        return dev, mapping[dev]
    served = ", ".join(mapping)
    raise BackendError(
        f"a tensor on device {dtype!r}, but {who} has no backend for {dtype!r}: its"
        f" device-to-backend map is {config!r} (torch.distributed.get_backend_config). Fix: move the"
        f" tensor to a device the group serves ({served}; e.g. tensor.to({next(iter(mapping))!r})), or"
        f" create the group with a backend for {dtype!r} (e.g. init_process_group(backend="
        f"'{config},{dtype}:<backend>'))"
    )


def _describe(group: Any) -> str:
    """'the default process group' or 'the process group of ranks [0, 2]'."""
    if group is None or group is _compat.default_group():
        return "the default process group"
    try:
        import torch.distributed as dist

        return f"the process group of ranks {list(dist.get_process_group_ranks(group))}"
    except Exception:  # a group torch does not list: say what it is
        return f"process group {group!r}"


def _for_pair(device: str, backend: str) -> Optional[Driver]:
    """The registered driver of torch backend ``backend`` on ``device``, or None.

    A backend name is no key where several devices share it (``hccl`` is Ascend's on ``npu`` and
    Intel Gaudi's on ``hpu``): a driver is found by its device type and torch name. The driver
    registered under the name itself wins among drivers of the same pair (a plain gloo group is gloo's,
    not that of a driver with ``torch_backend = "gloo"``).
    """
    named = _drivers.get(backend)
    if named is not None and named.device_type == device:
        return named
    for drv in list(_drivers.values()):
        if drv.device_type == device and str(drv.torch_name).lower() == backend:
            return drv
    return None


def _by_name(key: str, spelled: str, device: Optional[str] = None) -> Driver:
    """The driver registered (or aliased, or found by entry point) as ``key``; else a generic driver for
    a backend torch knows (on ``device``, None: the first device torch lists for it); else
    ``BackendError``."""
    drv = _drivers.get(key)
    if drv is None:
        alias = _aliases.get(key)
        if alias is not None:
            return _drivers[alias]
        if key in LEGACY_BACKENDS:
            raise BackendError(f"backend {spelled!r}: {LEGACY_BACKENDS[key]}")
        _load_entry_points()
        drv = _drivers.get(key) or _drivers.get(_aliases.get(key, ""), None)
        if drv is None:
            generic = _torch_only(key, device)
            if generic is not None:
                return generic
            raise BackendError(
                f"unknown backend {spelled!r}; {_did_you_mean(key)}registered: {_names()}. {_hint(key)}"
            )
        return drv
    return drv if device is not None else _shared_name(drv, key)


def _shared_name(drv: Driver, key: str) -> Driver:
    """``drv``, or the one available driver of another device that torch knows by the same name
    (``init_dist(backend="hccl")`` on an Intel Gaudi machine is Gaudi's HCCL, not Ascend's)."""
    others = [
        d for d in _drivers.values()
        if d is not drv and d.device_type != drv.device_type and str(d.torch_name).lower() == key
    ]
    if not others or drv.is_available():
        return drv
    usable = [d for d in others if d.is_available()]
    return usable[0] if len(usable) == 1 else drv


def _driver_for(device: str, backend: str) -> Driver:
    """The driver of torch backend ``backend`` on ``device``: a registered driver of that device and
    torch name, else the driver of the name, else a generic driver built from torch's registry."""
    drv = _for_pair(device, backend)
    if drv is None and backend not in _drivers and backend not in _aliases:
        _load_entry_points()  # a plug-in may bring the driver
        drv = _for_pair(device, backend)
    return drv if drv is not None else _by_name(backend, backend, device)


_generic: dict[tuple[str, str], Driver] = {}


def _torch_only(backend: str, device: Optional[str]) -> Optional[Driver]:
    """The generic driver of a backend torch knows (after torch >= 2.14 loads its entry point) and hwdist
    does not, on ``device`` (None: the first device torch lists for it); None if torch does not know it.
    """
    import torch.distributed as dist

    if backend == getattr(dist.Backend, "UNDEFINED", "undefined"):
        return None
    try:
        known = _compat.load_torch_backend(backend)
    except Exception as exc:  # torch's entry point for the name failed to load
        raise BackendError(
            f"backend {backend!r}: torch found an entry point for it (group 'torch.distributed.backends')"
            f" that failed to load: {exc}. HINT: reinstall the package that provides it"
        ) from exc
    if not known:
        return None
    devices = _compat.torch_backend_devices(backend) or ["cpu"]
    dev = device or devices[0]
    with _lock:
        drv = _generic.get((dev, backend))
        if drv is None:
            from .drivers.generic import generic_driver

            creator = _compat.torch_backend_creator(backend)
            module = getattr(creator, "__module__", None)
            drv = _generic[(dev, backend)] = generic_driver(backend, dev, module)
    return drv


def is_generic(driver: Any) -> bool:
    """Whether ``driver`` is a generic driver (a backend torch knows and hwdist has no driver for)."""
    from .drivers.generic import GenericTable

    return isinstance(driver, GenericTable)


def _pick_from_mixed(spec: str, device: Union[str, torch.device, None]) -> tuple[str, str]:
    """(device type, backend name) of the entry of ``'cpu:gloo,cuda:nccl'`` for data on ``device``.

    The entry for the device type when there is one. No device given (barriers, object collectives,
    hwdist's own traffic): torch's own rule for its object collectives
    (``distributed_c10d._get_object_coll_device``, torch 2.1 through 2.15): the only entry, else the
    ``cpu`` entry (the object is in CPU memory: no copy to a device), else the first; not the
    accelerator's (``_no_tensor_device``).
    """
    mapping = parse_backend_config(spec)
    return _choose(mapping, _device_type(device), spec, f"backend string {spec!r}", [])


def torch_map(group: Any) -> tuple[dict[str, str], str]:
    """What torch knows of ``group``'s backends: ``({device type: backend name}, the text it came from)``.

    Read from ``get_backend_config(group)``; where torch has none for the group, from its device types
    (``ProcessGroup._device_types``) and ``get_backend(group)``'s name.

    Raises:
        BackendError: torch's string cannot be read (names the string and what to do).
        ValueError: this rank is not a member of ``group`` (torch's own error).
    """
    import torch.distributed as dist

    config = _compat.group_backend_config(group)
    if config is None or not config.strip():
        name = str(dist.get_backend(group)).lower()  # raises for a group this rank is not in
        if ":" in name or "," in name:
            config = name
        else:
            types = _compat.group_device_types(group) or _compat.torch_backend_devices(name) or ["cpu"]
            return {t: name for t in types}, name
    return parse_backend_config(config), config


def resolve(group: Any = None, device: Union[str, torch.device, None] = None) -> Driver:
    """The driver of process group ``group`` (default group if None) for data on ``device``.

    The resolution rule:

    1. what torch knows of the group: its device-to-backend map (``get_backend_config``, e.g.
       ``'cpu:gloo,cuda:nccl'``; the group's device types and ``get_backend`` where torch has no
       config) gives the backend for the tensor's device type. A call without a tensor (object
       collectives, barrier, hwdist's own traffic) takes torch's rule for its object collectives: the
       CPU backend when the group has one. A CPU tensor on a group without a CPU backend goes to that
       backend's device and back; a tensor on a device the group has no backend for is refused. A
       backend that wraps another per device type (hwdist's torch backend,
       [`record_wrapper`][hwdist.registry.record_wrapper]) stands for the backend it wraps;
    2. then hwdist's record of the groups it created (``init_dist``, ``init_backend``, the local
       groups, [`hwdist.new_group`][hwdist.launch.core.new_group]): the driver it created the group
       with wins for its backend, even when drivers share a torch backend (``torch_backend = "gloo"``);
    3. else the registered driver of that device type and backend name (``hccl`` on ``npu`` is
       Ascend's, on ``hpu`` Intel Gaudi's), else of the name, else a generic driver built from torch's
       registry for a backend torch knows and hwdist does not.

    Cached per group and device type; the cache is cleared when backends are (un)registered or a
    process group is destroyed through hwdist.

    Raises:
        BackendError: torch's map of the group cannot be read, the tensor's device has no backend in the
            group, or the backend's device is missing here (the message names the map, device, fix).
        RuntimeError: no process group.

    Examples:
        >>> hwdist.init_dist("pytorch", backend="mycl")
        >>> hwdist.resolve().name
        # rank 0: 'mycl'   rank 1: 'mycl'
    """
    dtype = _device_type(device)
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
    drv = _resolve_group(group, dtype)
    _group_cache[(id(group), dtype)] = (group, drv)
    from . import _exit  # a group hwdist uses is torn down at exit, one torch created too

    _exit.install(forget_groups)
    return drv


def _resolve_group(group: Any, dtype: Optional[str]) -> Driver:
    recorded = _recorded(group)
    try:
        mapping, config = torch_map(group)
    except BackendError as exc:
        if recorded is not None:
            return recorded  # hwdist created the group: its record says which driver it is
        what = (
            f"data on device {dtype!r}" if dtype else "a call without a tensor (object collectives, barrier)"
        )
        raise BackendError(
            f"cannot tell which backend {_describe(group)} uses for {what}: {exc}. torch's"
            " device-to-backend map of a group (torch.distributed.get_backend_config) must read"
            " 'DEVICE:BACKEND[,DEVICE:BACKEND...]'. Fix: create the group with a backend string torch"
            " accepts (one backend name, or DEVICE:BACKEND pairs), or through hwdist"
            " (hwdist.new_group(backend=...)), which records its driver"
        ) from None
    dev, name = _choose(mapping, dtype, config, _describe(group), _compat.group_device_types(group))
    name = _wrappers.get(name, {}).get(dev, name)  # through a wrapper: the plans are the wrapped driver's
    if recorded is not None and name in (str(recorded.torch_name).lower(), recorded.name):
        return recorded
    drv = _driver_for(dev, name)
    # data from elsewhere (a CPU tensor, a call without one) goes to this device: refused if it is missing
    why = None if dev == dtype else drv.unavailable_reason()
    if why is None:
        return drv
    what = f"a tensor on {dtype!r}" if dtype else "a call without a tensor"
    raise BackendError(
        f"{_describe(group)} cannot be used here: {what} goes to its backend {name!r} on device {dev!r}"
        f" (device-to-backend map {config!r}, torch.distributed.get_backend_config), and {why}. Fix: run"
        f" where {dev!r} devices are visible, or create the group with a backend for a device this machine"
        f" has (e.g. init_process_group(backend='{config},cpu:<backend>'))"
    )


def record_wrapper(torch_name: str, wraps: dict[str, str]) -> None:
    """Record that torch backend ``torch_name`` wraps, per device type, the hwdist backends ``wraps``
    (``{'cpu': 'gloo'}``): ``resolve`` gives a group on it the wrapped driver, so that hwdist's own
    collectives plan as on the wrapped backend and reach it through the wrapper as pass-throughs."""
    with _lock:
        _wrappers[torch_name] = dict(wraps)
        _forget()


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
    """What ``hwdist.get_backend`` reports: the driver's name for a group hwdist created, else the name
    torch reports (an alias mapped to its driver's name, e.g. the mpi4py group); for a group torch made
    without naming a backend (``get_backend`` says ``'undefined'``), the name of its one backend, or its
    device-to-backend string when it has several."""
    import torch.distributed as dist

    if group is None:
        group = _compat.default_group()
    drv = _recorded(group)
    if drv is not None:
        return drv.name
    name = str(dist.get_backend(group))
    if name.lower() != getattr(dist.Backend, "UNDEFINED", "undefined"):
        return canonical_name(name) if ":" not in name else name
    try:
        mapping, config = torch_map(group)
    except BackendError:
        return name
    names = set(mapping.values())
    return canonical_name(names.pop()) if len(names) == 1 else config


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


#: Called by every ``_forget``: caches elsewhere that hold process groups drop them (``on_forget``).
_forget_hooks: list[Callable[[], None]] = []


def on_forget(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever the group -> driver resolutions are forgotten (a cache that keeps groups)."""
    if hook not in _forget_hooks:
        _forget_hooks.append(hook)


def _forget() -> None:
    global generation
    _group_cache.clear()
    generation += 1
    for hook in _forget_hooks:
        hook()


def forget_groups() -> None:
    """Drop every reference hwdist keeps to process groups: resolutions, per-group state, views.

    What ``hwdist.destroy`` does before destroying the groups, and the exit hook before it tears the
    default group down (a group still referenced would be destroyed by the interpreter's finalisation
    instead, the teardown order that aborts gloo now and then).
    """
    _state.clear()
    _forget()


for _cls in BUILTIN_DRIVERS:
    _register(_cls.name, _cls, override=False)
del _cls
