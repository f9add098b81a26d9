"""Per-process-group state: one object per group, cleared by ``destroy``.

Caches that depend on a process group (the verification sequence number, the
size predictions of the collectives, the flight recorder's sequence numbers, ...) live
in the group's [`GroupState`][hwdist._state.GroupState], not in module-level
dictionaries keyed by ``id(group)``: a group object is weakly referenced where
torch allows it, and the whole table is dropped by
[`clear`][hwdist._state.clear] (called by ``hwdist.destroy`` and on re-init), so
no entry outlives its group and an ``id`` reused by a new group never finds an
old entry.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["GroupState", "of", "clear"]


class GroupState:
    """The state hwdist keeps for one process group: a namespace, one attribute per user module.

    Modules store what they need under their own attribute name
    (``state.of(group).verify_seq``) and read it with ``getattr(..., default)``.
    """

    def __repr__(self) -> str:
        return f"GroupState({', '.join(sorted(vars(self)))})"


class _DefaultGroup:
    """The key of the default group (group=None): weak-referenceable, unlike a bare ``object()``."""


_DEFAULT = _DefaultGroup()
_weak: "weakref.WeakKeyDictionary[Any, GroupState]" = weakref.WeakKeyDictionary()
# Groups that cannot be weakly referenced: the object is kept alive with its state, so its id is never reused.
_strong: dict[int, tuple[Any, GroupState]] = {}


def of(group: Any) -> GroupState:
    """The state of ``group`` (None: the default group), created on first use."""
    key = _DEFAULT if group is None else group
    try:
        st = _weak.get(key)
        if st is None:
            st = _weak[key] = GroupState()
        return st
    except TypeError:  # not weak-referenceable
        hit = _strong.get(id(key))
        if hit is None:
            hit = _strong[id(key)] = (key, GroupState())
        return hit[1]


def clear() -> None:
    """Forget the state of every group (``destroy``, re-initialisation)."""
    _weak.clear()
    _strong.clear()
