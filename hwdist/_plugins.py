"""Loading plug-ins (drivers, launchers) from entry-point groups, once and safely."""

from __future__ import annotations

import warnings
from typing import Any, Callable


def entry_points(group: str) -> list[Any]:
    """The installed entry points of ``group``."""
    from importlib import metadata

    try:
        return list(metadata.entry_points(group=group))
    except TypeError:  # Python<3.10 API. Drop when Python>=3.10 is the floor.
        return list(metadata.entry_points().get(group, []))  # type: ignore[attr-defined]


def load_plugins(
    group: str, what: str, known: Callable[[str], bool], register: Callable[[str, Any], Any]
) -> None:
    """Register every entry point of ``group`` not yet ``known``; a broken one only warns.

    Args:
        group: entry-point group (e.g. ``hwdist.drivers``).
        what: what a plug-in is, for the warning ('driver', 'launcher').
        known: whether a (lower-case) name is already registered.
        register: ``register(name, loaded_object)``.
    """
    for ep in entry_points(group):
        if known(ep.name.lower()):
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plug-in must not break hwdist
            warnings.warn(f"hwdist: could not load {what} entry point {ep.name!r}: {exc}", stacklevel=3)
            continue
        if not known(ep.name.lower()):
            register(ep.name, obj)


def register_or_decorate(
    register: Callable[[str, Any, bool], Any], name: str, obj: Any, override: bool
) -> Any:
    """``register(name, obj, override)``, or with ``obj`` None a class decorator that registers the class.

    The one registration style of ``register_backend`` and ``register_launcher``.
    """
    if obj is None:

        def decorate(cls: Any) -> Any:
            register(name, cls, override)
            return cls

        return decorate
    return register(name, obj, override)
