"""The flight recorder's completion of calls through the backend, off the collective's path.

A call through the backend first looks at the calls still young (those issued in its last ``AGE``
predecessors): the ones whose Work has completed well are ended there and let go, at the cost of an
``is_completed()`` and a ``wait()`` each (which returns at once on a completed Work, and raises what
stopped a failed one: torch 2.15 deprecates ``is_success()`` and ``exception()``). Then it joins them,
``[recorder, entry, work, looks]`` appended to a deque. No lock: a look takes each call out with the
deque's atomic ``popleft`` and puts it back when it is still running, so two threads never end the same
call. A failed call, and one looked at ``AGE`` times (long or hung), go to the thread's list.

A daemon thread (started by the first call) sweeps every ``INTERVAL`` seconds every call in flight, the
old ones and the young ones alike: it ends the calls that completed after the process's last
collective, reports failures (``rec.end`` with the error runs the watchdog's report there, never in a
caller), and it is what leaves a hung call in flight for the watchdog. An entry's end time is late by
at most one call or ``INTERVAL``.

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

__all__ = ["AGE", "INTERVAL", "add", "held", "sweep"]

#: Seconds between two sweeps of every call in flight by the thread.
INTERVAL = 0.1
#: How many later calls look at a call before it is left to the thread alone (which bounds a call's
#: look to this many Works however many calls are in flight).
AGE = 8
#: Calls looked at by each call: [recorder, entry, work, calls that looked].
_young: collections.deque[list[Any]] = collections.deque()
#: The thread's alone: calls in flight after AGE looks (long or hung) and failures.
_old: collections.deque[list[Any]] = collections.deque()
_take, _put = _young.popleft, _young.append
_sweeping = threading.Lock()  # one sweep at a time (the thread's, a test's)
_started: list[threading.Thread] = []
_start_lock = threading.Lock()


def add(rec: Any, entry: Any, work: Any) -> None:
    """Track ``work``: ``rec.end(entry, error)`` once it has completed; first end the young calls that have.

    The new call is looked at from the next call on: just issued, it is rarely complete, and its Work's
    lock may be held by the backend's thread finishing it.
    """
    n = len(_young)
    while n:
        n -= 1
        try:
            item = _take()
        except IndexError:  # the thread is sweeping them
            break
        try:
            if not item[2].is_completed():
                if item[3] < AGE:
                    item[3] += 1
                    _put(item)
                else:
                    _old.append(item)
                continue
            item[2].wait()  # at once: raises what stopped the call
        except Exception:  # a failure, or a Work without these methods: the thread ends it
            _old.append(item)
            continue
        try:
            item[0].end(item[1], None)
        except Exception:
            pass
    _put([rec, entry, work, 0])
    if not _started:
        _start()


def held() -> int:
    """How many calls the recorder holds in flight (their Works with them)."""
    return len(_young) + len(_old)


def _start() -> None:
    with _start_lock:
        if not _started:
            t = threading.Thread(target=_loop, name="hwdist-backend-inflight", daemon=True)
            _started.append(t)
            t.start()


def _outcome(work: Any) -> tuple[bool, Any]:
    """(done, error) of a Work; a Work that cannot say is taken as done.

    The error is what ``wait()`` raises on the completed Work (at once: it has nothing left to wait for).
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


def sweep() -> int:
    """End every call whose Work has completed (a failure with its error); returns how many stay in flight."""
    with _sweeping:
        for calls in (_old, _young):
            for _ in range(len(calls)):
                try:
                    item = calls.popleft()
                except IndexError:  # a call took the young ones
                    break
                done, error = _outcome(item[2])
                if done:
                    _end(item, error)
                else:
                    calls.append(item)
        return held()


def _end(item: list[Any], error: Any) -> None:
    """``rec.end(entry, error)`` of a call (the thread's; a call's look does the same inline)."""
    try:
        item[0].end(item[1], error)
    except Exception:
        pass


def _loop() -> None:
    while True:
        time.sleep(INTERVAL)
        try:
            sweep()
        except Exception:
            pass
