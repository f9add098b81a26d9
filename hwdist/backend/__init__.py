"""hwdist as a torch.distributed backend: every collective of DDP, FSDP2 and DTensor through a driver's plan.

One switch: ``hwdist.init_dist(backend="hwdist")`` (or ``"hwdist:<backend>"`` to name what it wraps), or
``hwdist.backend.register(...)`` then ``torch.distributed.init_process_group("cpu:hwdist")``. torch then
creates, per device type, a [`HwdistBackend`][hwdist.backend.wrapper.HwdistBackend] that wraps the backend
of the driver hwdist picks for that device (gloo, nccl, a vendor's, the emulated accelerator's, a custom
driver's) and asks that driver's plan for each call: a pass-through goes straight to the wrapped backend
and returns its Work; a cast, an emulation or host staging is applied around it; no plan raises
[`PlanError`][hwdist.errors.PlanError] on every rank before any data moves. Every call enters hwdist's
flight recorder and is watched by its hang watchdog.

Needs torch >= 2.15 (Python backends); on older torch ``register`` and ``init_dist`` raise a
[`BackendError`][hwdist.errors.BackendError] naming the version. Importing this module registers nothing:
registration happens on ``register()`` or on ``init_dist``'s first use of the name. Guide:
docs/ddp-fsdp.md.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from .. import _compat, registry
from ..errors import BackendError

__all__ = ["NAME", "register", "registered_wraps", "supported", "unsupported_reason", "wrapped_name"]

from ._table import DEVICES, WRAPS, NAME, LOCK, registered_wraps


def unsupported_reason() -> Optional[str]:
    """Why this torch cannot run hwdist as a backend (the version it needs), or None when it can."""
    if _compat.PYTHON_BACKENDS:
        return None
    need = ".".join(map(str, _compat.PYTHON_BACKENDS_TORCH))
    return (
        f"the {NAME!r} backend needs torch >= {need} (torch.distributed backends written in Python);"
        f" this is torch {torch.__version__}. HINT: pip install 'torch>={need}', or name the vendor"
        f" backend itself (one of {', '.join(registry.list_backends())}): hwdist's own collectives plan"
        " on any torch"
    )


def supported() -> bool:
    """Whether this torch can run hwdist as a backend (torch >= 2.15)."""
    return unsupported_reason() is None


def wrapped_name(backend: Any) -> Optional[str]:
    """What the backend spelling ``backend`` wraps: ``''`` for ``'hwdist'`` (the driver hwdist detects),
    ``'emu'`` for ``'hwdist:emu'``; None when ``backend`` is not the wrapper's spelling.

    Examples:
        >>> wrapped_name("hwdist:gloo"), wrapped_name("hwdist"), wrapped_name("gloo")
        ('gloo', '', None)
    """
    if not isinstance(backend, str):
        return None
    head, sep, tail = backend.strip().partition(":")
    if head.strip().lower() != NAME:
        return None
    return tail.strip() if sep else ""


def _driver(wraps: Optional[str]) -> Any:
    """The driver to wrap: named, or detection's choice; never the wrapper itself."""
    if not wraps:
        from ..detection import detect

        wraps = detect().backend
    if wrapped_name(wraps) is not None:
        raise BackendError(
            f"wraps must name the backend hwdist wraps (one of {', '.join(registry.list_backends())}), got"
            f" {wraps!r}: hwdist cannot wrap itself. HINT: hwdist.backend.register(wraps=<a registered"
            " backend>), or wraps=None for the one hwdist detects"
        )
    driver = registry.get_driver(wraps)  # BackendError listing the registered backends
    registry.require_available(driver, f"backend {driver.name!r} (wrapped by {NAME!r}) is")
    return driver


def register(wraps: Union[None, str, list[str], tuple[str, ...]] = None) -> str:
    """Register the ``hwdist`` backend with torch, wrapping ``wraps``; returns the backend string to use.

    Idempotent; a later call with another backend for the same device type changes what groups created
    from then on wrap. Every rank must call it (or ``init_dist``) before creating a group.

    Args:
        wraps: the hwdist backend name(s) to wrap, one per device type (``'emu'``, ``'gloo'``,
            ``['gloo', 'nccl']``); None wraps the backend hwdist detects.

    Returns:
        torch's backend string for the wrapped device types (``'cpu:hwdist'``): pass it to
        ``torch.distributed.init_process_group``.

    Raises:
        hwdist.BackendError: torch < 2.15 (names the version needed); ``wraps`` names no registered
            backend, one that cannot run here, or two for one device type.

    Examples:
        >>> spec = hwdist.backend.register(wraps="gloo")   # 'cpu:hwdist'
        >>> torch.distributed.init_process_group(spec, rank=rank, world_size=2)
    """
    why = unsupported_reason()
    if why is not None:
        raise BackendError(why)
    names = [wraps] if wraps is None or isinstance(wraps, str) else list(wraps)
    if not names:
        raise BackendError(
            "wraps must name at least one backend, got an empty list."
            f" HINT: one of {', '.join(registry.list_backends())}, or None for the one hwdist detects"
        )
    chosen: dict[str, Any] = {}
    for name in names:
        driver = _driver(name)
        other = chosen.get(driver.device_type)
        if other is not None and other.name != driver.name:
            raise BackendError(
                f"wraps names two backends for device type {driver.device_type!r}: {other.name!r} and"
                f" {driver.name!r}. HINT: one backend per device type"
            )
        chosen[driver.device_type] = driver
    from ..drivers.startup import ensure_torch_backend

    for driver in chosen.values():
        ensure_torch_backend(driver)  # torch can create the wrapped backend: raises before any rendezvous
    with LOCK:
        for device, driver in chosen.items():
            WRAPS[device] = driver.name
        registry.record_wrapper(NAME, WRAPS)
        new = [d for d in chosen if d not in DEVICES]
        if new:
            from .wrapper import create

            DEVICES.extend(new)
            _compat.register_torch_backend(NAME, create, list(DEVICES), extended_api=True)
    return ",".join(f"{device}:{NAME}" for device in chosen)


def prepare(backend: str) -> tuple[Any, str]:
    """For ``init_dist``/``init_backend``: register the wrapper for ``backend`` (``'hwdist'`` or
    ``'hwdist:<name>'``); returns the wrapped driver and torch's backend string.

    Raises:
        hwdist.BackendError: as [`register`][hwdist.backend.register], before any rendezvous.
    """
    wraps = wrapped_name(backend)
    if wraps is None:
        raise BackendError(f"backend must be {NAME!r} or '{NAME}:<backend>', got {backend!r}")
    why = unsupported_reason()
    if why is not None:
        raise BackendError(f"backend {backend!r}: {why}")
    spec = register(wraps or None)
    return _driver(wraps or None), spec


def __getattr__(name: str) -> Any:
    if name == "HwdistBackend":  # torch >= 2.15 only: its base class exists there
        from .wrapper import HwdistBackend

        return HwdistBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
