"""Loading plug-ins (drivers, launchers) from entry-point groups, once and safely."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Callable, Optional


def entry_points(group: str) -> list[Any]:
    """The installed entry points of ``group``."""
    from importlib import metadata

    try:
        return list(metadata.entry_points(group=group))
    except TypeError:  # Python<3.10 API. Drop when Python>=3.10 is the floor.
        return list(metadata.entry_points().get(group, []))  # type: ignore[attr-defined]


#: entry-point group -> lower-case name -> why that plug-in could not be loaded or registered
_failed: dict[str, dict[str, str]] = {}


def failure(group: str, name: str) -> Optional[str]:
    """Why the plug-in ``name`` of ``group`` failed to load or register (None: it did not fail)."""
    return _failed.get(group, {}).get(name.lower())


def load_plugins(
    group: str, what: str, known: Callable[[str], bool], register: Callable[[str, Any], Any]
) -> None:
    """Register every entry point of ``group`` not yet ``known``; a broken one only warns.

    A plug-in that raises anything at import or at registration (including ``SystemExit`` and
    ``KeyboardInterrupt``), or whose object is refused by ``register``, gives one warning naming it
    and the error, and the others are still loaded; what it prints goes to stderr, never to stdout
    (which may carry ``--json`` output). The failure is kept for [`failure`][hwdist._plugins.failure].

    Args:
        group: entry-point group (e.g. ``hwdist.drivers``).
        what: what a plug-in is, for the warning ('driver', 'launcher').
        known: whether a (lower-case) name is already registered.
        register: ``register(name, loaded_object)``.
    """
    try:
        eps = entry_points(group)
    except Exception as exc:  # broken package metadata
        warnings.warn(f"hwdist: could not list the {group!r} entry points: {exc!r}", stacklevel=3)
        return
    for ep in eps:
        if known(ep.name.lower()):
            continue
        stage = "load"
        try:
            with contextlib.redirect_stdout(sys.stderr):
                obj = ep.load()
                if known(ep.name.lower()):
                    continue
                stage = "register"
                register(ep.name, obj)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # a broken plug-in must not break hwdist
            why = f"{type(exc).__name__}: {exc}"
            _failed.setdefault(group, {})[ep.name.lower()] = why
            warnings.warn(
                f"hwdist: could not {stage} {what} entry point {ep.name!r} ({ep.value!r} in group {group!r}):"
                f" {why}; it is skipped",
                stacklevel=3,
            )


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
