"""The one entry every public collective goes through: the one-thread guard, the observers, the hook.

Every public collective is decorated with [`collective`][hwdist.collectives.call_entry.collective], which
builds one wrapper per function, once at import:

1. **One thread per process group at a time.** torch.distributed pairs the ranks' calls on a group by
   their order, so a call from a second thread while another thread's call on the same group is in
   flight raises [`ConcurrentGroupUse`][hwdist.errors.ConcurrentGroupUse] at once (detection, not
   prevention). The default group is tracked under ``group=None``.
2. **Observers** ([`add_observer`][hwdist.collectives.call_entry.add_observer]) see the outermost
   public call of each thread: ``begin(op, group, args, kwargs)``, then ``end(token, error)``. One
   that raises is removed with a warning. The flight recorder has a slot of its own
   ([`set_recorder`][hwdist.collectives.call_entry.set_recorder]), called first; its ``end`` may return
   an exception for the call to raise instead (the hang doctor's
   [`HangDetected`][hwdist.flight.watchdog.HangDetected]).
3. **The verification hook** ([`set_hook`][hwdist.collectives.call_entry.set_hook], filled by
   ``collectives.verify`` while the mode is on) gets each call's ``(group, sample tensor, fields)`` from
   the decorator's ``describe`` before the call's own argument checks run.

Costs: docs/reliability.md and docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from typing import Any, Callable, Optional, Protocol, TypeVar

from .. import _compat
from ..errors import ConcurrentGroupUse

F = TypeVar("F", bound=Callable[..., Any])

_get_ident = threading.get_ident
#: id(group) (0 for None: the default group) -> ident of the thread whose call on it is in flight. Mutated
#: in place, never rebound: ``IN_FLIGHT`` is the same dict, which the torch backend reads on every call
#: (empty: no hwdist collective runs, without a function call)
_in_flight: dict[int, int] = {}
IN_FLIGHT = _in_flight
_local = threading.local()


class Observer(Protocol):
    """What [`add_observer`][hwdist.collectives.call_entry.add_observer] accepts."""

    def begin(self, op: str, group: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Called before the outermost public call runs; returns a token handed to ``end``."""

    def end(self, token: Any, error: Optional[BaseException]) -> Optional[BaseException]:
        """Called after the call returned (``error`` None) or raised; returns None (the recorder slot's
        observer may return an exception for a failed call to raise instead)."""


#: The registered observers, in registration order (a tuple: replaced, never mutated, so reads need no lock).
_observers: tuple[Observer, ...] = ()
#: The flight recorder's slot: an observer called first, without the generic loop (its 2 us budget).
_recorder: Optional[Observer] = None


#: The verification hook's slot: called as ``hook(op, group, sample, fields)`` before a described call runs.
_hook: Optional[Callable[[str, Any, Any, dict[str, Any]], None]] = None


def set_hook(hook: Optional[Callable[[str, Any, Any, dict[str, Any]], None]]) -> None:
    """Put ``hook`` in the verification hook's slot (None empties it)."""
    global _hook
    _hook = hook


def hook() -> Optional[Callable[[str, Any, Any, dict[str, Any]], None]]:
    """The verification hook in its slot (None when it is empty: verification mode is off)."""
    return _hook


def set_recorder(recorder: Optional[Observer]) -> Optional[Observer]:
    """Put ``recorder`` in the recorder slot (None empties it); returns the previous one.

    The slot's observer is called like any other (``begin``/``end``, outermost calls only), before the
    registered observers; it must never raise.
    """
    global _recorder
    old, _recorder = _recorder, recorder
    return old


def recorder() -> Optional[Observer]:
    """The observer in the recorder slot (None when it is empty)."""
    return _recorder


def in_call() -> bool:
    """Whether this thread is inside a public hwdist collective now, on any group (cheap when none is:
    the torch backend asks it on every call)."""
    return bool(_in_flight) and (_get_ident() in _in_flight.values() or bool(getattr(_local, "depth", 0)))


def add_observer(observer: Observer) -> None:
    """Register ``observer`` for every outermost public collective call (idempotent)."""
    global _observers
    if observer not in _observers:
        _observers = _observers + (observer,)


def remove_observer(observer: Observer) -> None:
    """Unregister ``observer`` (no error when it is not registered)."""
    global _observers
    _observers = tuple(o for o in _observers if o is not observer)


def _refuse(fn: str, holder: int) -> None:
    raise ConcurrentGroupUse(
        f"{fn}: another thread (ident {holder}) has a collective in flight on this process group;"
        f" this thread (ident {_get_ident()}) must not issue one on the same group at the same time:"
        " the ranks pair calls by their order, so results would be silently wrong. Issue a group's"
        " collectives from one thread (as torch.distributed requires), or give each thread its own"
        " group (torch.distributed.new_group)"
    )


_GROUP_TYPES, _NON_MEMBER = _compat.GROUP_TYPES, _compat.NON_GROUP_MEMBER


def _not_a_group(fn: str, group: Any) -> None:
    if group is _NON_MEMBER:  # torch's own sentinel: the call decides what a non-member does
        return
    text = repr(group)
    raise TypeError(
        f"{fn}: group must be a torch.distributed.ProcessGroup or None (the default group), got"
        f" {type(group).__name__}: {text[:60] + '...' if len(text) > 60 else text}"
    )


def _destroyed(fn: str, group: Any) -> None:
    raise ValueError(
        f"{fn}: group was destroyed: torch.distributed no longer knows this process group ({group!r};"
        " torch.distributed.destroy_process_group(group), destroy_process_group() or hwdist.destroy() ended"
        " it), so no collective can run on it. Fix: pass a live group (make one with hwdist.new_group or"
        " torch.distributed.new_group after the destroy), or None for the default group"
    )


def _observed(
    name: str, fn: Callable[..., Any], group: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run ``fn`` under the observers, unless an outer public call of this thread already is."""
    if getattr(_local, "depth", 0):
        return fn(*args, **kwargs)
    rec = _recorder
    token = rec.begin(name, group, args, kwargs) if rec is not None else None  # never raises
    tokens = []
    for obs in _observers:
        try:
            tokens.append((obs, obs.begin(name, group, args, kwargs)))
        except Exception as exc:  # an observer never breaks a collective
            _drop(obs, exc)
    _local.depth = 1
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _local.depth = 0
        instead = rec.end(token, exc) if rec is not None else None
        _end(tokens, exc)
        if instead is not None:
            raise instead from exc
        raise
    _local.depth = 0
    if rec is not None:
        rec.end(token, None)
    if tokens:
        _end(tokens, None)
    return result


def _end(tokens: list[tuple[Observer, Any]], error: Optional[BaseException]) -> None:
    for obs, token in tokens:
        try:
            obs.end(token, error)
        except Exception as exc:
            _drop(obs, exc)


def _drop(obs: Observer, exc: Exception) -> None:
    remove_observer(obs)
    warnings.warn(
        f"hwdist: call observer {obs!r} raised {exc!r}; it was removed", RuntimeWarning, stacklevel=3
    )


#: Verification's hook, registered by ``verify`` at import: what ``verify=True`` calls while the mode is off.
_verifier: Optional[Callable[[str, Any, Any, dict[str, Any]], None]] = None


def set_verifier(hook: Callable[[str, Any, Any, dict[str, Any]], None]) -> None:
    """Register verification's hook, for calls that ask for it with ``verify=True`` while the mode is off."""
    global _verifier
    _verifier = hook


def active_hook() -> Optional[Callable[[str, Any, Any, dict[str, Any]], None]]:
    """The hook that verifies the call in flight on this thread, or None when it is not verified."""
    if getattr(_local, "unverified", False):
        return None
    return (_hook or _verifier) if getattr(_local, "forced", False) else _hook


def verifying() -> bool:
    """Whether the call in flight on this thread is verified: the mode is on (its hook is set) and the call
    did not pass ``verify=False``, or the call passed ``verify=True``."""
    if getattr(_local, "forced", False):
        return True
    return _hook is not None and not getattr(_local, "unverified", False)


def _with_flag(flag: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` with this thread's ``flag`` set for the call and what it calls (``verify=False`` sets
    ``unverified``, ``verify=True`` sets ``forced``)."""
    before = getattr(_local, flag, False)
    setattr(_local, flag, True)
    try:
        return fn(*args, **kwargs)
    finally:
        setattr(_local, flag, before)


def _hooked(op: str, fn: F, describe: Callable[..., tuple[Any, Any, Optional[dict[str, Any]]]]) -> F:
    """``fn`` preceded by the hook, handed ``describe(*args, **kwargs)`` (the path while the mode is on)."""

    def hooked(*args: Any, **kwargs: Any) -> Any:
        hook = active_hook()
        if hook is not None:
            try:
                group, sample, fields = describe(*args, **kwargs)
            except TypeError:  # the arguments do not bind: the call itself raises the right error
                return fn(*args, **kwargs)
            if fields is not None:  # None: the op verifies the call in its own header round
                hook(op, group, sample, fields)
        return fn(*args, **kwargs)

    return hooked  # type: ignore[return-value]


def collective(
    group_index: int,
    name: Optional[str] = None,
    describe: Optional[Callable[..., tuple[Any, Any, Optional[dict[str, Any]]]]] = None,
) -> Callable[[F], F]:
    """Decorate a public collective whose ``group`` is positional ``group_index`` (or keyword ``group``).

    Args:
        group_index: position of the ``group`` parameter.
        name: the op name observers see (default: the function's name).
        describe: for the verification hook: takes the collective's own arguments and returns the call's
            ``(group, sample tensor or None, fields)``; it runs only while a hook is set. None: the hook is
            not called (the function hands it the call itself, as ``all_reduce_params``).

    Every decorated collective accepts ``verify=`` (a keyword its own signature need not have): False:
    the call, and what it calls, skips verification; True: it is verified even while the mode is off;
    None: as the mode says.
    """

    def decorate(fn: F) -> F:
        op = name or fn.__name__
        checked = fn if describe is None else _hooked(op, fn, describe)
        takes_verify = "verify" in inspect.signature(fn).parameters

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if kwargs and "verify" in kwargs:
                verify = kwargs["verify"] if takes_verify else kwargs.pop("verify")
                if verify is False and not getattr(_local, "unverified", False):
                    return _with_flag("unverified", guarded, args, kwargs)
                if verify is True and _hook is None and not getattr(_local, "forced", False):
                    return _with_flag("forced", guarded, args, kwargs)
            body = fn if _hook is None and not getattr(_local, "forced", False) else checked
            group = args[group_index] if len(args) > group_index else kwargs.get("group")
            if group is None:
                key = 0
            else:
                key = id(group)
                if not isinstance(group, _GROUP_TYPES):
                    _not_a_group(op, group)
                elif _compat.group_destroyed(group):
                    _destroyed(op, group)
            me = _get_ident()
            holder = _in_flight.get(key)
            if holder is None:
                holder = _in_flight.setdefault(key, me)  # atomic: one thread wins a race
                if holder != me:
                    _refuse(op, holder)
                try:
                    if _observers:
                        return _observed(op, body, group, args, kwargs)
                    rec = _recorder
                    if rec is None:
                        return body(*args, **kwargs)
                    token = rec.begin(op, group, args, kwargs)  # the recorder alone: inline, no depth mark
                    try:
                        result = body(*args, **kwargs)
                    except BaseException as exc:
                        instead = rec.end(token, exc)
                        if instead is not None:  # the hang doctor's raise action: HangDetected
                            raise instead from exc
                        raise
                    rec.end(token, None)
                    return result
                finally:
                    _in_flight.pop(key, None)
            if holder != me:
                _refuse(op, holder)
            # nested (a collective built on another): the outer call owns the mark
            return body(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    return decorate


# ---------------------------------------------------------------------------
# what async_op=True returns
# ---------------------------------------------------------------------------
class CollectiveHandle:
    """What every hwdist collective returns with ``async_op=True``, on every backend and plan.

    ``wait()`` finishes the communication *and* the copy back into the caller's tensors (dtype, device, the
    mean's division), and returns what the synchronous call returns: None for in-place collectives, the list
    of tensors for gathers, the sender's rank for ``irecv``. It is safe to call more than once (later calls
    return the same result). ``is_completed()`` tells whether the communication has finished without blocking.

    On a backend without async support (the driver says so) the collective has already completed when the
    handle is returned.

    Examples:
        >>> h = dist.all_reduce(t, "mean", async_op=True)
        >>> ...                      # overlap other work
        >>> h.wait()                 # t now holds the mean, in t's own dtype
    """

    __slots__ = ("_work", "_finish", "_state", "_done", "_result")

    def __init__(
        self,
        work: Any = None,
        finish: Optional[Callable[[Any], Any]] = None,
        state: Any = None,
        result: Any = None,
    ) -> None:
        self._work = work
        self._finish = finish
        self._state = state
        self._done = work is None and finish is None
        self._result = result

    def wait(self, timeout: Any = None) -> Any:
        """Block until the collective and its copy back are complete; return the collective's result.

        Args:
            timeout: passed to torch's ``Work.wait`` (a ``datetime.timedelta``), if given.
        """
        if not self._done:
            if self._work is not None:
                if timeout is None:
                    self._work.wait()
                else:
                    self._work.wait(timeout)
            if self._finish is not None:
                self._result = self._finish(self._state)
            self._done = True
            self._work = self._finish = self._state = None
        return self._result

    def is_completed(self) -> bool:
        """Whether the communication has finished (``wait()`` still does the copy back)."""
        return self._done or self._work is None or bool(self._work.is_completed())

    def __repr__(self) -> str:
        return f"<CollectiveHandle done={self._done}>"
