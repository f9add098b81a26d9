"""The flight recorder's completion of calls through the backend, off the collective's path.

A call through the backend appends ``(recorder, entry, work)`` to an inbox (a deque: one atomic
append, no lock). Each later call then looks at the calls still young (those issued in its last
``AGE`` predecessors): the ones whose Work has completed are ended there and let go, at the cost of one
``is_completed()`` each. A daemon thread (started by the first call) does the same every ``INTERVAL``
seconds for every call still in flight, the old ones and the young ones alike: it ends the calls that
completed after the process's last collective, and it is what leaves a hung call in flight for the
watchdog. An entry's end time is late by at most one call or ``INTERVAL``.

Why the next call looks, not only the thread: the recorder holds each Work until it ends it, and the
Work holds the buffers the backend keeps for it (gloo's all_gather output, FSDP2's unsharded
parameters). Held for the thread's 100 ms, they could not be reused: measured on gloo, 2 ranks, a
1 MiB ``all_gather_into_tensor`` took 19.5 page faults a call through the wrapper (the allocator handed
out fresh memory) against 0.1 on plain gloo. Ended on the next call, the Work goes when the caller
lets it go (0.25 faults a call).

Why not a completion callback on each Work (``work.get_future().add_done_callback``, torch 2.15 has
it): the callback runs on the wrapped backend's own thread once the collective is done, and needs
the GIL there. While the training thread holds the GIL (it runs Python nearly all the time), the
backend's thread waits for it (up to the interpreter's switch interval, 5 ms), and the next
collective queued on that backend waits behind it. (An earlier measurement on a 2-core host put a
per-Work callback at about 50 us a call; the recorder's share is in docs/benchmarks.md, "The hwdist
torch backend".)
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

__all__ = ["AGE", "INTERVAL", "add", "sweep"]

#: Seconds between two sweeps of every call in flight by the thread.
INTERVAL = 0.1
#: How many later calls look at a call before it is left to the thread alone (which bounds a call's
#: look to this many Works however many calls are in flight).
AGE = 8
_inbox: collections.deque[tuple[Any, Any, Any]] = collections.deque()
_young: list[list[Any]] = []  # [recorder, entry, work, calls that looked]: looked at by each call
_old: list[list[Any]] = []  # in flight after AGE calls (a long or hung call, a failure): the thread's
_lock = threading.Lock()  # one look at a time (a call's, the thread's, a test's)
_started: list[threading.Thread] = []
_start_lock = threading.Lock()


def add(rec: Any, entry: Any, work: Any) -> None:
    """Track ``work``: ``rec.end(entry, error)`` once it has completed; end the young calls that have."""
    _inbox.append((rec, entry, work))
    if not _started:
        _start()
    if _lock.acquire(False):  # else the thread is sweeping, and the next call looks instead
        try:
            _look()
        finally:
            _lock.release()


def _start() -> None:
    with _start_lock:
        if not _started:
            t = threading.Thread(target=_loop, name="hwdist-backend-inflight", daemon=True)
            _started.append(t)
            t.start()


def _outcome(work: Any) -> tuple[bool, Any]:
    """(done, error) of a Work; a Work that cannot say is taken as done.

    The error is what ``wait()`` raises on the completed Work (at once: it has nothing left to wait for).
    torch 2.15 deprecates ``is_success()`` and ``exception()``, and each prints a warning in every process
    that calls it.
    """
    try:
        if not work.is_completed():
            return False, None
        work.wait()
        return True, None
    except (AttributeError, NotImplementedError):  # a Work without these methods
        return True, None
    except Exception as exc:
        return True, exc


def _end(item: list[Any], error: Any) -> None:
    try:
        item[0].end(item[1], error)
    except Exception:
        pass


def _take_inbox() -> None:
    pop = _inbox.popleft
    try:
        while True:
            _young.append([*pop(), 0])
    except IndexError:
        pass


def _look() -> None:
    """A call's look (the lock held): end the young calls that completed well; a failed one, and one
    looked at ``AGE`` times, go to the thread (a failure's report runs there, never in a caller)."""
    _take_inbox()
    keep = []
    for item in _young:
        done, error = _outcome(item[2])
        if done and error is None:
            _end(item, None)
        elif done or item[3] >= AGE:
            _old.append(item)
        else:
            item[3] += 1
            keep.append(item)
    _young[:] = keep


def sweep() -> int:
    """Complete every entry whose Work has completed; returns how many stay in flight."""
    with _lock:
        _take_inbox()
        for calls in (_old, _young):
            keep = []
            for item in calls:
                done, error = _outcome(item[2])
                if done:
                    _end(item, error)
                else:
                    keep.append(item)
            calls[:] = keep
        return len(_old) + len(_young) + len(_inbox)


def _loop() -> None:
    while True:
        time.sleep(INTERVAL)
        try:
            sweep()
        except Exception:
            pass
