"""Failure notices for hwdist's object collectives: a rank that leaves one in the middle tells the others.

A rank whose communication fails inside an object collective (a peer died),
or that is interrupted between two of its steps, writes a notice on the
group's store before it raises (`Board.post`). The other ranks wait for
each step in slices (`wait`): 50 ms first, then twice as long each time
up to 0.5 s, and read the store between two slices; a notice ends the wait
with `NoticeSeen`. A step that completes quickly never reads the store.

Point-to-point steps are waited on in a helper thread: gloo closes the pair of
a p2p wait that times out, so a p2p work cannot be waited on in slices.
Where the bytes travel on an accelerator, waits only order streams and are
not sliced. Behaviour and limits: docs/objects.md, docs/reliability.md.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable

from .. import _compat

__all__ = ["Board", "NoticeSeen", "wait", "KEY", "FIRST", "MOST"]

#: The store key of a group's notice: ``"<group rank>|<reason>"``.
KEY = "hwdist/object-collective-failure"
#: A slow step first looks for a notice after this many seconds, then twice as long each time...
FIRST = 0.05
#: ... up to this interval.
MOST = 0.5


class NoticeSeen(Exception):
    """Another rank posted a notice while this rank waited."""

    def __init__(self, rank: str, reason: str, waited: float) -> None:
        super().__init__(f"rank {rank}: {reason}")
        self.rank, self.reason, self.waited = rank, reason, waited


class Board:
    """The notices of one process group (its store; none where torch does not expose it)."""

    def __init__(self, group: Any) -> None:
        self._group = group
        self._store: Any = None  # resolved on first use; False: no store

    def _get(self) -> Any:
        if self._store is None:
            self._store = _compat.group_store(self._group) or False
        return self._store

    def post(self, rank: int, reason: str) -> None:
        """Tell the group's other ranks that group rank ``rank`` left an object collective."""
        store = self._get()
        if store is False:
            return
        try:
            store.set(KEY, f"{rank}|{reason[:2000]}")
        except Exception:
            pass  # the store is gone too: the others see the broken connections instead

    def check(self, waited: float) -> None:
        """Raise `NoticeSeen` if some rank posted a notice."""
        store = self._get()
        if store is False:
            return
        try:
            if not store.check([KEY]):
                return
            who, _, why = store.get(KEY).decode("utf-8", "replace").partition("|")
        except Exception:
            return
        raise NoticeSeen(who, why, waited)


def wait(work: Any, p2p: bool, sliced: bool, check: Callable[[float], None]) -> None:
    """Wait for ``work``; between slices of a slow wait call ``check(seconds waited)``."""
    if work is None:
        return
    if not sliced:
        work.wait()
        return
    start = time.monotonic()
    step = FIRST
    if p2p:
        done = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                work.wait()
            except BaseException as exc:  # noqa: BLE001 (handed to the caller)
                failure.append(exc)
            done.set()

        threading.Thread(target=run, name="hwdist-p2p-wait", daemon=True).start()
        while not done.wait(step):
            check(time.monotonic() - start)
            step = min(2 * step, MOST)
        if failure:
            raise failure[0]
        return
    while True:
        try:
            work.wait(timeout=datetime.timedelta(seconds=step))
            return
        except TypeError:  # a Python Work whose wait() takes no timeout: wait without slices
            work.wait()
            return
        except RuntimeError:
            if work.is_completed():  # it failed (not the slice's timeout): raise its own error
                work.wait()
                return
        check(time.monotonic() - start)
        step = min(2 * step, MOST)
