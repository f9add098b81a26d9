"""One thread per process group at a time: a cheap guard on hwdist's collectives.

torch.distributed pairs the ranks' calls on a group by their order. Two threads
issuing collectives on one group make that order a race: the ranks can pair
different calls and return wrong values silently. The rule (torch's too) is one
thread per group at a time. [`one_thread`][hwdist.collectives._threads.one_thread] wraps a collective so that a call
from a second thread, while the first thread's call on the same group is still
in flight, raises at once instead. It costs a dictionary look-up and a
``try``/``finally`` per call (measured in docs/reliability.md).

Detection, not prevention: the check sees only calls that overlap in time on
this rank (a blocking collective keeps its group marked until it returns; an
``async_op=True`` call only while it is being issued). The default group is
tracked under ``group=None``; passing the default group object explicitly is
tracked apart from ``None``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_get_ident = threading.get_ident
#: id(group) (0 for None: the default group) -> ident of the thread whose call on it is in flight
_in_flight: dict[int, int] = {}


class ConcurrentGroupUse(RuntimeError):
    """Two threads issued collectives on one process group at the same time."""


def _refuse(fn: str, holder: int) -> None:
    raise ConcurrentGroupUse(
        f"{fn}: another thread (ident {holder}) has a collective in flight on this process group;"
        f" this thread (ident {_get_ident()}) must not issue one on the same group at the same time:"
        " the ranks pair calls by their order, so results would be silently wrong. Issue a group's"
        " collectives from one thread (as torch.distributed requires), or give each thread its own"
        " group (torch.distributed.new_group)"
    )


def one_thread(group_index: int) -> Callable[[F], F]:
    """Decorate a collective whose ``group`` argument is positional ``group_index`` (or keyword ``group``)."""

    def decorate(fn: F) -> F:
        name = fn.__name__

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            group = args[group_index] if len(args) > group_index else kwargs.get("group")
            key = 0 if group is None else id(group)
            me = _get_ident()
            holder = _in_flight.get(key)
            if holder is None:
                holder = _in_flight.setdefault(key, me)  # atomic: one thread wins a race
                if holder != me:
                    _refuse(name, holder)
                try:
                    return fn(*args, **kwargs)
                finally:
                    _in_flight.pop(key, None)
            if holder != me:
                _refuse(name, holder)
            return fn(*args, **kwargs)  # nested (a collective built on another): the outer call owns the mark

        return guarded  # type: ignore[return-value]

    return decorate
