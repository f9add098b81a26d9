"""The Work the wrapper returns when a plan does something around the wrapped backend's call.

A [`FutureWork`][hwdist.backend._work.FutureWork] completes when its future does: after the wrapped
call's work completed and the plan's finish (copy back, divide, local reduction) ran, or with the
exception that stopped either. A failure never leaves a Work that does not complete.
Only imported on torch >= 2.15 (``hwdist._compat.PYTHON_BACKENDS``).
"""

from __future__ import annotations

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


def then(works: Sequence[Any], finish: Callable[[], None], result: Any) -> FutureWork:
    """A Work that completes once every work in ``works`` has and ``finish()`` ran; its value is ``result``.

    ``finish`` runs on the thread that completes the last work (the wrapped backend's), or here when they
    are all done already. An exception from a work or from ``finish`` completes the Work with it.
    """
    futs = [_future_of(w) for w in works if w is not None]
    out = Future()

    def after(got: Any) -> None:
        try:
            for f in got.value() if len(futs) > 1 else [got]:
                f.value()  # the wrapped call's own exception, if any
            finish()
        except Exception as exc:  # the caller's wait raises it, with its own type
            out.set_exception(exc)
        else:
            out.set_result(result)

    if not futs:
        after(done(None).get_future())
        return FutureWork(out)
    joined = futs[0] if len(futs) == 1 else torch.futures.collect_all(futs)
    joined.add_done_callback(after)
    return FutureWork(out)
