"""How a driver's process group starts: the start-up rule, applied before any rendezvous.

[`ensure_torch_backend`][hwdist.drivers.startup.ensure_torch_backend] makes torch able to create
a driver's process group (torch's own backend, one a package registered with torch, the driver's
``process_group_factory``, or gloo for a CPU driver without one) or raises why it cannot, on
every rank alike. A factory or a package's creator that fails raises a
[`BackendError`][hwdist.errors.BackendError] naming the backend and what to do. See
``docs/writing-a-driver.md``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .. import _compat
from ..errors import BackendError
from .base import Driver

#: The device type whose drivers may omit a factory.
FALLBACK_DEVICE_TYPE = "cpu"


def gloo_process_group(store: Any, rank: int, size: int, timeout: Any) -> Any:
    """A gloo process group (the factory CPU drivers without one get)."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(store, rank, size, timeout)


def fallback_process_group_factory(device_type: str) -> Optional[Callable[..., Any]]:
    """The factory a driver without one starts with: gloo for CPU drivers, else None."""
    return gloo_process_group if device_type == FALLBACK_DEVICE_TYPE else None


def torch_reserved(name: str) -> bool:
    """Whether torch.distributed reserves ``name`` for a backend of its own (``Backend.<NAME>``)."""
    if not _compat.DIST_AVAILABLE:
        return False
    import torch.distributed as dist

    return isinstance(getattr(dist.Backend, name.upper(), None), str)


def check_torch_name(key: str, inst: Driver) -> None:
    """Refuse torch names no process group can ever be created under (``hwdist.register_backend`` calls it).

    Raises:
        BackendError: the name is torch's UNDEFINED, or torch reserves it while the driver gives a
            ``process_group_factory`` torch would never call.
    """
    if not _compat.DIST_AVAILABLE:
        return
    import torch.distributed as dist

    torch_name = str(inst.torch_name or key).lower()
    if torch_name == getattr(dist.Backend, "UNDEFINED", None):
        raise BackendError(
            f"cannot register {key!r}: its torch name {torch_name!r} is torch.distributed.Backend.UNDEFINED,"
            " which names no backend. HINT: register it under another name"
        )
    if torch_reserved(torch_name) and inst.process_group_factory is not None:
        raise BackendError(
            f"cannot register {key!r} ({type(inst).__name__}): it gives process_group_factory, but its torch"
            f" name {torch_name!r} is torch's own backend (torch.distributed.Backend.{torch_name.upper()}),"
            " so torch would never call the factory. HINT: drop torch_backend, or register the driver"
            " under a name torch does not reserve"
        )


def _torch_backend_names() -> str:
    import torch.distributed as dist

    undefined = getattr(dist.Backend, "UNDEFINED", None)
    return ", ".join(n for n in dist.Backend.backend_list if n != undefined)


def ensure_torch_backend(driver: Driver) -> None:
    """Make torch able to create ``driver``'s process group, or raise why it cannot.

    The start-up rule, for the driver's torch name (``torch_backend`` or its name):

    1. a name torch reserves for its own backend (``Backend.GLOO``, ...): torch
       creates the group; if torch says it cannot here (``is_<name>_available()``
       is False), [`BackendError`][hwdist.errors.BackendError];
    2. a name already registered with torch (an earlier call, another library): used as is;
    3. else the driver's ``process_group_factory`` is registered with torch under that name;
    4. else a driver with the fallback device type (``'cpu'``) runs over gloo under its own name;
    5. else [`BackendError`][hwdist.errors.BackendError] with a HINT.

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
    if torch_reserved(name):
        probe = getattr(dist, f"is_{name.lower()}_available", None)
        if callable(probe) and not probe():
            raise BackendError(
                f"backend {driver.name!r}: torch reserves {name!r} for its own backend, and this torch cannot"
                f" create it (torch.distributed.is_{name.lower()}_available() is False). {hint}"
                f" under a name torch does not reserve"
            )
        _guard_torch_creator(name)
        return
    vendor = driver.vendor_module
    if not _compat.torch_knows_backend(name) and vendor:
        import importlib

        importlib.import_module(vendor)  # vendor extensions register their backend with torch on import
    if _compat.load_torch_backend(name):
        _guard_torch_creator(name)
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
    devices = [driver.device_type]
    extended = _compat.EXTENDED_BACKEND_API
    _compat.register_torch_backend(name, _torch_creator(name, factory, devices, extended), devices, extended)


def _accepts_options(factory: Callable[..., Any]) -> bool:
    """Whether a ``process_group_factory`` takes torch's backend options (an ``options`` parameter or
    ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "options" or p.kind is p.VAR_KEYWORD for p in params)


def _creation_failed(
    backend: str, rank: Any, what: str, exc: BaseException, devices: Optional[list[str]] = None
) -> BackendError:
    """The error every rank raises when a backend's creator fails (before any communication)."""
    devices = devices or _compat.torch_backend_devices(backend)
    config = ",".join(f"{d}:{backend}" for d in devices) or backend
    return BackendError(
        f"backend {backend!r} could not create its process group on rank {rank}: {what} raised"
        f" {type(exc).__name__}: {exc}. The group's backends: {config!r}"
        f" (device(s) {', '.join(devices) or '?'})."
        f" Fix: check that the backend's package works on this machine (create a group with torch alone),"
        f" then `hwdist check --backend {backend}` tests it on local ranks"
    )


def _torch_creator(
    backend: str, factory: Callable[..., Any], devices: list[str], extended: bool
) -> Callable[..., Any]:
    """The creator hwdist registers with torch for a driver's ``process_group_factory``.

    With torch's extended API (every supported torch) torch calls it with its
    ``_DistributedBackendOptions`` (store, group rank and size, timeout, group id, the group's global
    ranks) and the group's options, as it calls its own backends; the factory is called as
    ``factory(store, rank, size, timeout)``, plus ``options=<those options>`` when it takes an
    ``options`` parameter (or ``**kwargs``). torch gives the default group's ranks as ``[]``; hwdist
    fills them in. A factory that raises raises [`BackendError`][hwdist.errors.BackendError] naming
    the backend, its devices and what to do, on every rank where it fails.
    """
    wants_options = _accepts_options(factory)
    where = f"{getattr(factory, '__qualname__', type(factory).__name__)} (its process_group_factory)"

    if not extended:

        def create(store: Any, rank: int, size: int, timeout: Any) -> Any:
            try:
                return factory(store, rank, size, timeout)
            except Exception as exc:
                raise _creation_failed(backend, rank, where, exc, devices) from exc

        return create

    def create_extended(options: Any, group_options: Any = None) -> Any:
        if not list(options.global_ranks_in_group):
            options.global_ranks_in_group = list(range(options.group_size))  # the default group
        extra = {"options": options} if wants_options else {}
        try:
            return factory(options.store, options.group_rank, options.group_size, options.timeout, **extra)
        except Exception as exc:
            raise _creation_failed(backend, options.group_rank, where, exc, devices) from exc

    return create_extended


def _guard_torch_creator(backend: str) -> None:
    """Make the creator a package registered with torch for ``backend`` raise a clear error naming the
    backend when it fails (once; torch's own backends and hwdist's factories are left as they are)."""
    creator = _compat.torch_backend_creator(backend)
    if creator is None or getattr(creator, "_hwdist_guarded", False):
        return
    where = f"its creator {getattr(creator, '__module__', '?')}.{getattr(creator, '__qualname__', '?')}"

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return creator(*args, **kwargs)
        except Exception as exc:
            first = args[0] if args else None
            rank = getattr(first, "group_rank", args[1] if len(args) > 1 else "?")
            raise _creation_failed(backend, rank, where, exc) from exc

    guarded._hwdist_guarded = True  # type: ignore[attr-defined]
    _compat.replace_torch_backend_creator(backend, guarded)


def parse_backend_config(spec: str) -> dict[str, str]:
    """torch's ``'DEVICE:BACKEND[,DEVICE:BACKEND...]'`` as ``{device type: backend name}``, in its order.

    Raises:
        BackendError: ``spec`` is not of that form (says what is wrong).
    """
    mapping: dict[str, str] = {}
    for part in str(spec).lower().split(","):
        dev, sep, name = (x.strip() for x in part.partition(":"))
        if not sep or not dev or not name or ":" in name:
            raise BackendError(
                f"cannot parse backend string {spec!r}: {part.strip()!r} is not 'DEVICE:BACKEND'"
            )
        if dev in mapping:
            raise BackendError(f"cannot parse backend string {spec!r}: device {dev!r} is named twice")
        mapping[dev] = name
    return mapping
