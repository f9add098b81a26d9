"""A watchdog for the mpi4py process group: no rank waits forever in an MPI call.

An MPI collective cannot be cancelled, so the only way out for a rank that
waits on a peer that left is to end the job. Installed when the first
mpi4py process group is created (the default group), it covers three cases:

* **a rank raises** an exception nobody catches: after Python prints the
  traceback, the rank prints the reason and calls ``MPI_Abort`` (what
  ``python -m mpi4py`` does), so the job ends at once instead of every other
  rank waiting in its next collective;
* **a rank exits** (``sys.exit``, the end of its script, an exception caught
  and ignored) while others still call collectives with it: on exit it posts
  a notice on the process group's store; a rank whose MPI call involving
  that rank is still in flight [`EXIT_GRACE`][hwdist.drivers._mpi_watchdog.EXIT_GRACE] seconds later prints
  the reason and calls ``MPI_Abort``;
* **a call exceeds the process-group timeout** (``init_dist(timeout=...)``,
  default 30 minutes): the waiting rank prints which call waited how long
  and calls ``MPI_Abort``.

A thread checks the calls in flight every [`POLL`][hwdist.drivers._mpi_watchdog.POLL] seconds; it reads the
store only while a call has been in flight for more than
[`EXIT_GRACE`][hwdist.drivers._mpi_watchdog.EXIT_GRACE] seconds. Cost per MPI call: two dictionary updates.
Measured figures and the limits are in docs/mpi.md.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterator, Optional

__all__ = ["install", "watching", "POLL", "EXIT_GRACE", "STORE_EVERY", "Watch"]

#: Seconds between two checks of the calls in flight.
POLL = 0.25
#: Seconds between two reads of the store (only while a call has been in flight for EXIT_GRACE).
STORE_EVERY = 1.0
#: A peer's exit notice must have been seen, with the call still in flight, this long before the job is
#: aborted.
EXIT_GRACE = 1.0
_EXITS = "hwdist_mpi/exits"  # count of exit notices (store.add)
_EXIT = "hwdist_mpi/exit/"  # notice n: "<world rank>|<reason>"


class Watch:
    """What the watchdog needs to know about one process group: its members (world ranks) and timeout."""

    __slots__ = ("members", "timeout")

    def __init__(self, members: frozenset[int], timeout: Optional[float]) -> None:
        self.members = members
        self.timeout = timeout


class _State:
    def __init__(self, store: Any, world_rank: int) -> None:
        self.store = store
        self.world_rank = world_rank
        self.lock = threading.Lock()
        self.inflight: dict[int, tuple[str, float, Watch]] = {}
        self.next_id = 0
        self.seen = 0  # exit notices read so far
        self.exited: dict[int, tuple[str, float]] = {}  # world rank -> (reason, when seen)
        self.aborting = False
        self.last_read = 0.0
        self.raised = ""  # set by the excepthook: abort at exit


_state: Optional[_State] = None


def _abort(reason: str, code: int = 1) -> None:
    """Print ``reason`` and end the whole MPI job."""
    st = _state
    if st is not None:
        if st.aborting:
            return
        st.aborting = True
    rank = st.world_rank if st is not None else "?"
    sys.stderr.write(f"hwdist: aborting the MPI job from rank {rank}: {reason}\n")
    sys.stderr.flush()
    time.sleep(0.2)  # let the launcher forward the message before MPI_Abort tears the job down
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)
    finally:  # Abort does not return; if MPI is already gone, leave anyway
        os._exit(code)


@contextlib.contextmanager
def watching(watch: Optional[Watch], what: str) -> Iterator[None]:
    """Mark an MPI call of a group as in flight for the watchdog."""
    st = _state
    if st is None or watch is None:
        yield
        return
    with st.lock:
        key = st.next_id
        st.next_id += 1
        st.inflight[key] = (what, time.monotonic(), watch)
    try:
        yield
    finally:
        with st.lock:
            st.inflight.pop(key, None)


def _read_exits(st: _State) -> None:
    count = int(st.store.add(_EXITS, 0))
    while st.seen < count:
        st.seen += 1
        raw = st.store.get(f"{_EXIT}{st.seen}").decode("utf-8", "replace")
        who, _, why = raw.partition("|")
        st.exited.setdefault(int(who), (why, time.monotonic()))


def _check(st: _State) -> None:
    now = time.monotonic()
    with st.lock:
        calls = list(st.inflight.values())
    long_ones = [c for c in calls if now - c[1] > EXIT_GRACE]
    for what, start, watch in calls:
        if watch.timeout is not None and now - start > watch.timeout:
            _abort(
                f"{what} has waited {now - start:.1f} s, more than the process-group timeout of"
                f" {watch.timeout:g} s (init_dist(timeout=...)): a rank of this group never joined it"
            )
    if not long_ones or now - st.last_read < STORE_EVERY:
        return
    st.last_read = now
    try:
        _read_exits(st)
    except Exception as exc:  # the store is gone: the rank hosting it has exited
        _abort(
            f"{long_ones[0][0]} has waited {now - long_ones[0][1]:.1f} s and the process group's store is"
            f" unreachable ({type(exc).__name__}: {exc}); the rank hosting it (rank 0) has exited"
        )
    for what, start, watch in long_ones:
        for who in sorted(watch.members & st.exited.keys()):
            why, seen = st.exited[who]
            if now - seen > EXIT_GRACE and now - start > EXIT_GRACE:
                _abort(
                    f"rank {who} {why} while rank {st.world_rank} waits for it in {what} ({now - start:.1f}"
                    " s);"
                    " every rank must make the same collective calls before it exits"
                )


def _loop() -> None:
    while True:
        time.sleep(POLL)
        st = _state
        if st is None:
            return
        try:
            _check(st)
        except Exception:  # the watchdog must never take the process down by itself
            pass


def _post_exit(reason: str) -> None:
    st = _state
    if st is None or st.aborting:
        return
    try:
        n = int(st.store.add(_EXITS, 1))
        st.store.set(f"{_EXIT}{n}", f"{st.world_rank}|{reason}")
    except Exception:
        pass  # the store's host is gone: the others notice that instead


def _at_exit() -> None:
    st = _state
    if st is not None and st.raised:
        _abort(st.raised)  # after the traceback was printed (torch's own hook buffers it until then)
    _post_exit("exited")


def _excepthook(previous: Callable[..., Any]) -> Callable[..., Any]:
    def hook(kind: type, value: BaseException, tb: Any) -> None:
        if _state is not None:
            _state.raised = (
                f"rank {_state.world_rank} raised {kind.__name__}: {value} (traceback above);"
                " the other ranks would wait for it forever"
            )
        try:
            previous(kind, value, tb)
        except Exception:
            traceback.print_exception(kind, value, tb)

    return hook


def install(store: Any, world_rank: int) -> None:
    """Start the watchdog once per process (on the first mpi4py process group)."""
    global _state
    if _state is not None:
        return
    _state = _State(store, world_rank)
    atexit.register(_at_exit)
    sys.excepthook = _excepthook(sys.excepthook)
    threading.Thread(target=_loop, name="hwdist-mpi-watchdog", daemon=True).start()
