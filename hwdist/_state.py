"""Per-process-group state: one object per group, cleared by ``destroy``.

Caches that depend on a process group (the verification sequence number,
``all_reduce_dict``'s layouts, the flight recorder's sequence numbers, ...) live
in the group's [`GroupState`][hwdist._state.GroupState], not in module-level
dictionaries keyed by ``id(group)``: a group object is weakly referenced where
torch allows it, and the whole table is dropped by
[`clear`][hwdist._state.clear] (called by ``hwdist.destroy`` and on re-init), so
no entry outlives its group and an ``id`` reused by a new group never finds an
old entry.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["GroupState", "of", "clear"]


@dataclass(eq=False)
class GroupState:
    """The state hwdist keeps for one process group, every field declared here.

    The field types that belong to other parts of the package are written as ``Any`` so that
    this module imports nothing of hwdist (it sits below every part that uses it); each field
    names its owner and type.

    Attributes:
        verify_seq: verification mode's ``(generation, last call number)`` for this group
            (``collectives/verify.py``); None before the first verified call.
        all_reduce_dict: ``all_reduce_dict``'s layouts built on this rank, a local cache
            (``collectives/params.py``, ``_DictState``); None before the first call.
        flight: the flight recorder's ``GroupInfo`` (name, ranks, sequence numbers) for this
            group (``flight/recorder.py``); None until the first recorded call.
        torch_hooks: the ``GroupHooks`` through which the recorder sees torch's own
            collectives on this group (``flight/torch_hooks.py``, torch >= 2.14); None when
            not attached.
    """

    verify_seq: Optional[tuple[int, int]] = None
    all_reduce_dict: Any = None
    flight: Any = None
    torch_hooks: Any = None


class _DefaultGroup:
    """The key of the default group (group=None): weak-referenceable, unlike a bare ``object()``."""


_DEFAULT = _DefaultGroup()
_weak: "weakref.WeakKeyDictionary[Any, GroupState]" = weakref.WeakKeyDictionary()
# Groups that cannot be weakly referenced: the object is kept alive with its state, so its id is never reused.
_strong: dict[int, tuple[Any, GroupState]] = {}


def _world() -> Any:
    """torch's default group object, or None (torch.distributed absent or not initialised)."""
    try:
        import torch.distributed as torch_dist

        return torch_dist.GroupMember.WORLD if torch_dist.is_available() else None
    except (ImportError, AttributeError):
        return None


def of(group: Any) -> GroupState:
    """The state of ``group`` (None: the default group), created on first use.

    The default group's state is keyed by torch's group object itself, however a caller names it
    (None or the object): a default group that torch destroyed and made anew, even behind hwdist's
    back, starts with a fresh state.
    """
    key = group if group is not None else (_world() or _DEFAULT)
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


#: Bumped by [`clear`][hwdist._state.clear]: a cache of a group's state (the flight recorder's default
#: group info) is valid while the generation it was taken in lasts.
generation = 0


def clear() -> None:
    """Forget the state of every group (``destroy``, re-initialisation)."""
    global generation
    _weak.clear()
    _strong.clear()
    generation += 1
