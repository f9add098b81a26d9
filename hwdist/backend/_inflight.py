"""The flight recorder's completion of calls through the backend, off the collective's path.

A call through the backend appends ``(recorder, entry, work)`` to an inbox (a deque: one atomic
append, no lock); a daemon thread (started by the first such call) moves the inbox to its own list
every ``INTERVAL`` seconds and completes each entry once its Work has. The entry's end time is late
by at most ``INTERVAL``. A Work that never completes stays in flight: the watchdog sees it.

Why not a completion callback on each Work (``work.get_future().add_done_callback``, torch 2.15 has
it): the callback runs on the wrapped backend's own thread once the collective is done, and needs
the GIL there. While the training thread holds the GIL (it runs Python nearly all the time), the
backend's thread waits for it (up to the interpreter's switch interval, 5 ms), and the next
collective queued on that backend waits behind it. The sweeper takes the GIL ten times a second,
whatever the number of calls. (An earlier measurement on a 2-core host put a per-Work callback at
about 50 us a call; the sweeper's share is in docs/benchmarks.md, "The hwdist torch backend".)
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

__all__ = ["INTERVAL", "add", "sweep"]

#: Seconds between two sweeps of the calls in flight.
INTERVAL = 0.1
_inbox: collections.deque[tuple[Any, Any, Any]] = collections.deque()
_pending: list[tuple[Any, Any, Any]] = []  # the sweeper's own: calls still in flight at the last sweep
_sweeping = threading.Lock()  # one sweep at a time (the thread's, a test's)
_started: list[threading.Thread] = []
_start_lock = threading.Lock()


def add(rec: Any, entry: Any, work: Any) -> None:
    """Track ``work``: ``rec.end(entry, error)`` once it has completed."""
    _inbox.append((rec, entry, work))
    if not _started:
        _start()


def _start() -> None:
    with _start_lock:
        if not _started:
            t = threading.Thread(target=_loop, name="hwdist-backend-inflight", daemon=True)
            _started.append(t)
            t.start()


def _outcome(work: Any) -> tuple[bool, Any]:
    """(done, error) of a Work; a Work that cannot say is taken as done.

    The error is asked of ``exception()`` (None once it succeeded): torch's ``is_success`` is deprecated
    and warns in every process that calls it.
    """
    try:
        if not work.is_completed():
            return False, None
        error = work.exception()
        return True, error if error is None or isinstance(error, BaseException) else RuntimeError(str(error))
    except Exception as exc:  # a Work without these methods
        return True, exc if not isinstance(exc, (AttributeError, NotImplementedError)) else None


def sweep() -> int:
    """Complete the entries whose Work has completed; returns how many stay in flight."""
    with _sweeping:
        items = _pending[:]
        pop = _inbox.popleft
        try:
            while True:
                items.append(pop())
        except IndexError:
            pass
        keep = []
        for item in items:
            done, error = _outcome(item[2])
            if not done:
                keep.append(item)
                continue
            try:
                item[0].end(item[1], error)
            except Exception:
                pass
        _pending[:] = keep
        return len(keep) + len(_inbox)


def _loop() -> None:
    while True:
        time.sleep(INTERVAL)
        try:
            sweep()
        except Exception:
            pass
