"""The Work the wrapper returns when a plan does something around the wrapped backend's call.

A [`ThenWork`][hwdist.backend._work.ThenWork] completes once the wrapped call's works have and the
plan's finish (copy back, divide, local reduction) ran, or with the exception that stopped either;
[`FutureWork`][hwdist.backend._work.FutureWork] wraps a future that is already settled. A failure never
leaves a Work that does not complete.
Only imported on torch >= 2.15 (``hwdist._compat.PYTHON_BACKENDS``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

import torch

from .. import _compat

_Backend, _Work = _compat.python_backend_types()
Future: Any = torch.futures.Future


class FutureWork(_Work):  # type: ignore[misc, valid-type]
    """A Work over a ``torch.futures.Future`` whose value is the caller's tensors."""

    def __init__(self, fut: Any) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: Any = None) -> bool:
        """Block until the result is in the caller's tensors; raise what stopped it."""
        self._fut.wait()
        return True

    def get_future(self) -> Any:
        """The future (DDP chains its bucket's finish on it)."""
        return self._fut

    def is_completed(self) -> bool:
        """Whether the result is in the caller's tensors (or the call failed)."""
        return bool(self._fut.done())

    def is_success(self) -> bool:
        """Whether it completed without an exception."""
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:
            return False
        return True

    def exception(self) -> Optional[BaseException]:
        """The exception that stopped the call, or None."""
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except Exception as exc:
            return exc
        return None


def done(result: Any) -> FutureWork:
    """A completed Work whose value is ``result``."""
    fut = Future()
    fut.set_result(result)
    return FutureWork(fut)


def failed(exc: BaseException) -> FutureWork:
    """A Work completed with ``exc``."""
    fut = Future()
    fut.set_exception(exc)
    return FutureWork(fut)


def _future_of(work: Any) -> Any:
    """``work``'s future; a completed one after waiting where the work has none (then it is finished)."""
    try:
        return work.get_future()
    except Exception:
        work.wait()
        fut = Future()
        fut.set_result(None)
        return fut


class ThenWork(_Work):  # type: ignore[misc, valid-type]
    """A Work that completes once the wrapped calls' works have and the plan's finish ran.

    The finish (copy back, the mean's division, a local reduction) runs once, on the first thread that
    sees every wrapped work complete: the caller's ``wait()`` (FSDP2's reduce_scatter, any synchronous
    call), an ``is_completed()`` poll, or the wrapped backend's thread when someone asked for the future
    (DDP chains its bucket's finish on it). No Python callback is queued on the wrapped backend's thread
    unless the future is asked for: such a callback waits there for the GIL while the training thread
    holds it, and every later collective of that backend waits behind it. An exception from a work or
    from the finish completes this Work with it.
    """

    def __init__(self, works: list[Any], finish: Optional[Callable[[], None]], result: Any) -> None:
        super().__init__()
        self._works: Optional[list[Any]] = works
        self._finish: Optional[Callable[[], None]] = finish
        self._result = result
        self._lock = threading.RLock()
        self._state = 0  # 0: running, 1: done, 2: failed
        self._finishing = False
        self._error: Optional[BaseException] = None
        self._fut: Any = None

    def _complete(self, futs: Optional[list[Any]] = None, waited: bool = False, error: Any = None) -> None:
        """Run the finish once every work has completed. What the works ended with is read from their
        futures (``futs``, all done: on the wrapped backend's thread a work's own wait may block on the
        thread that completes it), or was seen by the caller's wait (``waited``, ``error``): a work is
        waited on once (a process group written in Python may do its communication in ``wait``)."""
        with self._lock:  # re-entrant: a wrapped work's wait may run this Work's future callback here
            if self._state or self._finishing:
                return
            self._finishing = True
            works, finish = self._works or [], self._finish
            try:
                if error is not None:
                    raise error
                if not waited:
                    for f in futs if futs is not None else [_future_of(w) for w in works]:
                        f.value()  # the wrapped call's own exception, if any
                if finish is not None:
                    finish()
            except Exception as exc:  # the caller's wait raises it, with its own type
                self._error, self._state = exc, 2
            else:
                self._state = 1
            self._works = self._finish = None
            fut = self._fut
        if fut is not None and not fut.done():
            self._settle(fut)

    def _settle(self, fut: Any) -> None:
        if self._state == 2:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result)

    def wait(self, timeout: Any = None) -> bool:
        """Block until the result is in the caller's tensors; raise what stopped it."""
        if not self._state:
            error = None
            try:
                for w in self._works or []:
                    w.wait()
            except Exception as exc:  # _complete records it
                error = exc
            self._complete(waited=True, error=error)
        if self._state == 2:
            raise self._error  # type: ignore[misc]
        return True

    def is_completed(self) -> bool:
        """Whether the result is in the caller's tensors (or the call failed); finishes it when the
        wrapped works are all complete."""
        if self._state:
            return True
        works = self._works
        if works is not None and not all(w.is_completed() for w in works):
            return False
        self._complete()
        return True

    def is_success(self) -> bool:
        """Whether it completed without an exception."""
        return self.is_completed() and self._state == 1

    def exception(self) -> Optional[BaseException]:
        """The exception that stopped the call, or None."""
        return self._error if self.is_completed() else None

    def get_future(self) -> Any:
        """A future completed with the result once the finish ran (on the wrapped backend's thread)."""
        with self._lock:
            fut = self._fut
            if fut is not None:
                return fut
            fut = self._fut = Future()
            works = self._works
            state = self._state
        if state:
            if not fut.done():
                self._settle(fut)
            return fut
        futs = [_future_of(w) for w in works or []]
        joined = futs[0] if len(futs) == 1 else torch.futures.collect_all(futs) if futs else None
        if joined is None:
            self._complete()
        else:
            joined.add_done_callback(lambda _: self._complete(futs))
        return fut


def then(works: Sequence[Any], finish: Optional[Callable[[], None]], result: Any) -> ThenWork:
    """A Work that completes once every work in ``works`` has and ``finish()`` ran; its value is ``result``
    (see [`ThenWork`][hwdist.backend._work.ThenWork]: the finish runs on whichever thread first sees the
    works complete; None: nothing to run). An exception from a work or from ``finish`` completes the Work
    with it."""
    return ThenWork([w for w in works if w is not None], finish, result)
