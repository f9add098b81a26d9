"""The flight recorder's completion of calls through the backend, off the collective's path.

A call through the backend appends ``(recorder, entry, work)`` here; a daemon thread (started by the
first such call) completes each entry once its Work has, every ``INTERVAL`` seconds. A completion
callback on every Work would run on the backend's thread and take the GIL per call (about 50 us on a
2-core machine, docs/benchmarks.md); this costs one append per call, and the entry's end time is late
by at most ``INTERVAL``. A Work that never completes stays in flight: the watchdog sees it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["INTERVAL", "add", "sweep"]

#: Seconds between two sweeps of the calls in flight.
INTERVAL = 0.1
_lock = threading.Lock()
_items: list[tuple[Any, Any, Any]] = []
_thread: list[threading.Thread] = []


def add(rec: Any, entry: Any, work: Any) -> None:
    """Track ``work``: ``rec.end(entry, error)`` once it has completed."""
    with _lock:
        _items.append((rec, entry, work))
        if not _thread:
            t = threading.Thread(target=_loop, name="hwdist-backend-inflight", daemon=True)
            _thread.append(t)
            t.start()


def _outcome(work: Any) -> tuple[bool, Any]:
    """(done, error) of a Work; a Work that cannot say is taken as done."""
    try:
        if not work.is_completed():
            return False, None
        if work.is_success():
            return True, None
        return True, work.exception() or RuntimeError("the collective failed")
    except Exception as exc:  # a Work without these methods
        return True, exc if not isinstance(exc, (AttributeError, NotImplementedError)) else None


def sweep() -> int:
    """Complete the entries whose Work has completed; returns how many stay in flight."""
    with _lock:
        items = list(_items)
        _items.clear()
    keep = []
    for rec, entry, work in items:
        done, error = _outcome(work)
        if not done:
            keep.append((rec, entry, work))
            continue
        try:
            rec.end(entry, error)
        except Exception:
            pass
    with _lock:
        _items[:0] = keep
        return len(_items)


def _loop() -> None:
    while True:
        time.sleep(INTERVAL)
        try:
            sweep()
        except Exception:
            pass
