"""What ``async_op=True`` always returns: [`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle]."""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["CollectiveHandle"]


class CollectiveHandle:
    """What every hwdist collective returns with ``async_op=True``, on every backend and plan.

    ``wait()`` finishes the communication *and* the copy back into the
    caller's tensors (dtype, device, the mean's division), and returns what
    the synchronous call returns: None for in-place collectives, the list of
    tensors for gathers, the sender's rank for ``irecv``. It is safe to call
    more than once (later calls return the same result). ``is_completed()``
    tells whether the communication has finished without blocking.

    On a backend without async support (the driver says so) the collective
    has already completed when the handle is returned.

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
