"""The hang watchdog: a daemon thread that notices an overdue collective and gathers every rank's record.

Protocol on the default group's store (the launcher's ``TCPStore``/``FileStore``,
never the backend being diagnosed):

1. Every ``tick`` seconds the thread checks this rank's collectives in flight.
   One older than the deadline (or one that failed in the backend) opens an
   *episode*: ``compare_set(EPISODE, n, n + 1)``, so ranks that notice at once
   agree on the number.
2. Every rank polls ``EPISODE``; on a new number it publishes its record (recent
   entries, main-thread stack) under ``RECORD/<episode>/<rank>`` and waits up to
   ``gather`` seconds for the other ranks' records.
3. Each rank prints the report to stderr, writes its dump file, and takes the
   action: ``report`` (nothing more), ``raise`` or ``abort`` (docs/debugging-hangs.md).

The store being gone, a dump directory that cannot be written or a bad setting
give one warning; the thread never raises into user code.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from typing import Any, Optional

import torch

from .. import _compat
from .. import settings as _settings
from ..errors import HwdistError
from . import files as _files
from . import recorder as _rec
from . import report as _report
from . import torch_fr as _fr
from . import torch_hooks as _hooks

__all__ = ["Watchdog", "EPISODE", "RECORD", "HANG_EXIT_CODE", "HangDetected", "warn"]

EPISODE = "hwdist/flight/episode"
RECORD = "hwdist/flight/record"
#: Exit status of a rank ended by the ``abort`` action (or by ``raise`` when its main thread cannot be woken).
HANG_EXIT_CODE = 75
_HWDIST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_LIB_DIRS = tuple(
    p + os.sep
    for p in {
        os.path.dirname(os.path.abspath(torch.__file__)),
        sysconfig.get_paths().get("stdlib", "/nonexistent"),
        _HWDIST_DIR.rstrip(os.sep),
    }
)


#: Seconds from a rank's report to its exit when its main thread cannot take ``HangDetected`` (blocked in a
#: backend or another C call that the group's abort does not release): every rank of the job has then
#: exited within 10 s of its report (the rest of the 10 s: the interpreter's own exit).
EXIT_WITHIN = 8.0
_raised = threading.Event()  # set when HangDetected is made in the main thread (it is being raised there)


class HangDetected(HwdistError, RuntimeError):
    """Raised in every rank's main thread by the ``raise`` action (default); the message is the diagnosis."""

    last_message = "a collective did not complete before HWDIST_HANG_TIMEOUT (see the report on stderr)"

    def __init__(self, *args: Any) -> None:
        super().__init__(*(args or (HangDetected.last_message,)))
        if threading.current_thread() is threading.main_thread():
            _raised.set()




warn, _warned = _rec.warn, _rec.WARNED  # one RuntimeWarning per key per process (callers use watchdog.warn)


def main_stack() -> tuple[list[str], str]:
    """The main thread's frames (``file:line in func``, innermost last) and its innermost user frame."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None:
        return [], ""
    summary = traceback.extract_stack(frame)
    frames = [f"{_rec.short_path(f.filename)}:{f.lineno} in {f.name}" for f in summary]
    where = ""
    for f in reversed(summary):
        if not os.path.abspath(f.filename).startswith(_LIB_DIRS):
            where = f"{f.name}() at {_rec.short_path(f.filename)}:{f.lineno}"
            break
    return frames, where


def record(recorder: _rec.Recorder, reason: str, last: int = 64) -> dict[str, Any]:
    """This rank's record: identity, main-thread stack and the last ``last`` entries."""
    import torch.distributed as torch_dist

    rank, ws = 0, 1
    if torch_dist.is_initialized():
        rank, ws = torch_dist.get_rank(), torch_dist.get_world_size()
    stack, where = main_stack()
    entries = recorder.entries()
    main = threading.main_thread().ident
    frame = sys._current_frames().get(main or 0)
    torch_entries, seen = _fr.read(last)
    seen = sorted(set(seen) | set(_hooks.attached_groups()))
    return {
        "rank": rank,
        "world_size": ws,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
        "reason": reason,
        "where": where,
        "torch": torch.__version__.split("+")[0],
        "stack": stack,
        "entries": [_rec.entry_dict(e) for e in entries[-last:]] + torch_entries,
        #: the groups whose torch.distributed calls (DDP's, FSDP's) this rank sees: torch's recorder or hooks
        "torch_seen": seen,
        #: whether the main thread is inside a hwdist collective now
        "in_hwdist": any(e[_rec.STATE] == _rec.ISSUED and e[_rec.THREAD] == main for e in entries),
        #: whether the main thread's innermost frame is torch's (where a collective of its own can wait)
        "in_torch": frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_TORCH_DIR),
    }


def dump(recorder: _rec.Recorder, path: Optional[str], reason: str) -> str:
    """Write this rank's record as JSON lines (a header, then one line per entry); returns the file.

    ``path`` is a directory (the file is ``flight-rank<R>.jsonl`` in it) or a ``.jsonl`` file name (with
    several ranks, ``<stem>-rank<R>.jsonl`` beside it; an existing file is never overwritten: the record
    goes to ``<name>.1.jsonl``, ...); None means ``HWDIST_FLIGHT_DIR``, always a directory, or the
    private default (hwdist.flight.files).
    """
    rec = record(recorder, reason, last=recorder.size)
    name = f"flight-rank{rec['rank']}.jsonl"
    if path is None:
        folder = flight_dir()
        if folder is None:
            folder, why = _files.default_dir()
            if why is not None:
                warn("dump-dir", why)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        target = os.path.join(folder, name)
    elif os.path.isdir(path) or not path.endswith(".jsonl"):
        os.makedirs(path, mode=0o700, exist_ok=True)
        target = os.path.join(path, name)
    else:
        # a file name: one file per rank (run7-rank1.jsonl) when there are several, never over an existing one
        stem = path[: -len(".jsonl")]
        target = _unused(f"{stem}-rank{rec['rank']}.jsonl" if rec["world_size"] > 1 else path)
        folder = os.path.dirname(target)
        if folder:
            os.makedirs(folder, mode=0o700, exist_ok=True)
    entries = rec.pop("entries")
    _files.write_lines(target, [json.dumps(rec)] + [json.dumps(e) for e in entries])
    return target


def _unused(path: str) -> str:
    """``path``, or where it exists already ``<stem>.1.jsonl``, ``<stem>.2.jsonl``, ... (the first free)."""
    if not os.path.lexists(path):
        return path
    stem = path[: -len(".jsonl")]
    n = 1
    while os.path.lexists(f"{stem}.{n}.jsonl"):
        n += 1
    new = f"{stem}.{n}.jsonl"
    warn(f"dump-exists:{path}", f"{path!r} exists and is left as it is; the flight record goes to {new!r}")
    return new


def flight_dir() -> Optional[str]:
    """``HWDIST_FLIGHT_DIR`` (always a directory: a ``.jsonl`` name is warned about), or None when unset."""
    value = _settings.text("HWDIST_FLIGHT_DIR")
    if not value:
        return None
    if value.endswith(".jsonl") and not os.path.isdir(value):
        warn("flight-dir", f"HWDIST_FLIGHT_DIR={value!r} looks like a file; it names a directory (every rank"
             " writes its own flight-rank<R>.jsonl in it), so the dumps go to"
             f" {os.path.join(value, 'flight-rank<R>.jsonl')!r}")
    return value


def read_timeout() -> Optional[float]:
    """``HWDIST_HANG_TIMEOUT`` in seconds; None (watchdog off) for 0, or a negative or bad value (warned)."""
    try:
        value = _settings.number("HWDIST_HANG_TIMEOUT")
    except ValueError as exc:
        warn("timeout", f"{exc}; the watchdog is off")
        return None
    if value is None or value != value:  # unset or NaN
        return None
    if value <= 0:
        if value < 0:
            warn("timeout", f"HWDIST_HANG_TIMEOUT={value:g} is negative; the watchdog is off (0: off)")
        return None
    return float(value)


def read_action() -> str:
    """``HWDIST_HANG_ACTION`` (report, raise, abort); a bad value: ``report``, warned."""
    try:
        return _settings.choice("HWDIST_HANG_ACTION")
    except ValueError as exc:
        warn("action", f"{exc}; using 'report'")
        return "report"


class Watchdog:
    """The daemon thread (one per process), started by the first recorded collective."""

    def __init__(self, recorder: _rec.Recorder, timeout: float, action: str) -> None:
        self.recorder, self.timeout, self.action = recorder, timeout, action
        self.tick = min(5.0, max(0.1, timeout / 10))
        self.gather = min(30.0, max(3.0, timeout))
        self.handled = 0  # last episode this rank answered
        self.reported: set[int] = set()  # id() of entries that already opened an episode
        self.torch_reported: set[tuple[str, int]] = set()  # (group, seq) of torch-recorded ones
        self.stop = threading.Event()
        self.wake = threading.Event()  # set by a failed call: step now, not at the next tick
        self.idle = threading.Event()  # no report in progress and none queued
        self.idle.set()
        self.failed: list[list[Any]] = []  # entries of calls that failed for a lost peer, not reported yet
        self.last_report = ""
        self.lock = threading.Lock()  # one episode at a time (the thread, or a failed call's own thread)
        #: the last episode whose HangDetected was handed to the main thread (raise action), and its guard:
        #: the watchdog's act and a failing call race to deliver it, and only one may
        self.delivered = 0
        self.deliver_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="hwdist-hang-watchdog", daemon=True)

    def start(self) -> None:
        """Start the thread (and, at exit, wait for a report in progress)."""
        self.thread.start()
        atexit.register(self.wait_idle)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while not self.stop.is_set():
            self.wake.wait(self.tick)
            self.wake.clear()
            try:
                with self.lock:
                    failed = self.failed.pop(0) if self.failed else None
                    if failed is None or id(failed) not in self.reported:
                        self._step(failed)
            except Exception as exc:  # never let the thread die silently, never raise elsewhere
                warn(f"step:{type(exc).__name__}", f"watchdog step failed: {exc!r}")
            finally:
                if not self.failed:
                    self.idle.set()

    def on_failure(self, entry: list[Any]) -> Optional[BaseException]:
        """A collective failed in the backend (a lost peer): the thread reports at once.

        The error reaches the caller without delay; if it ends the process, the exit
        waits (bounded, at exit) for the report.

        Returns:
            Under the ``raise`` action, for a call of the main thread that a hang report already
            covered: the [`HangDetected`][hwdist.flight.watchdog.HangDetected] the call raises
            instead of the backend's error. That is the call that fails because the other ranks
            acted on the same hang first (raised and exited: gloo says "connection closed") before
            this rank's watchdog delivered its own. Else None.
        """
        if not _backend_failure(entry[_rec.ERROR]):
            return None
        if (
            self.action == "raise"
            and id(entry) in self.reported
            and entry[_rec.THREAD] == threading.main_thread().ident
            and self._claim_delivery()
        ):
            return HangDetected()
        self.idle.clear()
        self._wait_at_exit_first()
        self.failed.append(entry)
        self.wake.set()
        return None

    def _wait_at_exit_first(self) -> None:
        """Make the at-exit wait for this report run before any other exit handler.

        The watchdog starts with the process group, before ``init_dist`` installs the handler that
        destroys the group at exit; exit handlers run last-registered first, so without this the group
        (and its store, which the report needs) would be gone before the report is gathered.
        """
        try:
            atexit.unregister(self.wait_idle)
            atexit.register(self.wait_idle)
        except Exception:
            pass

    def _claim_delivery(self) -> bool:
        """Whether the caller delivers this episode's HangDetected (True once per episode)."""
        with self.deliver_lock:
            if self.delivered >= self.handled:
                return False
            self.delivered = self.handled
            return True

    def wait_idle(self) -> None:
        """At interpreter exit: let a report in progress finish (at most the record-exchange time + 2 s)."""
        if self.thread.is_alive() and not self.idle.wait(self.gather + 2.0):
            warn("exit", "the process exits while a hang report is still being gathered")

    def _store(self) -> Any:
        import torch.distributed as torch_dist

        if not torch_dist.is_initialized():
            return None
        return _compat.group_store(None)

    def _overdue(self) -> Any:
        """The oldest overdue hwdist call (an entry), else torch-recorded call (a dict), else None."""
        now = time.time()
        for e in self.recorder.entries():
            if id(e) in self.reported:
                continue
            state = e[_rec.STATE]
            if state == _rec.ISSUED and now - e[_rec.START] > self.timeout:
                return e
        if _fr.available():
            return _fr.overdue(self.timeout, now, self.torch_reported)
        return None

    def _mark(self, overdue: Any) -> None:
        if isinstance(overdue, dict):
            self.torch_reported.add((overdue["group"], overdue["seq"]))
        else:
            self.reported.add(id(overdue))

    def _step(self, failed: Optional[list[Any]] = None) -> None:
        store = self._store()
        if store is None:
            return
        overdue = failed or self._overdue()
        if overdue is not None:
            self.idle.clear()
            self._wait_at_exit_first()
        try:
            current = int(store.add(EPISODE, 0))
        except Exception as exc:
            if overdue is not None:
                self._mark(overdue)
                warn("store", f"the store is unreachable ({exc!r}); the report shows this rank only")
                self._episode(None, 0, overdue)
            return
        if current > self.handled:
            self._episode(store, current, overdue)
            return
        if overdue is None:
            return
        self._mark(overdue)
        try:  # the key exists: add(EPISODE, 0) above made it
            got = store.compare_set(EPISODE, str(self.handled), str(self.handled + 1))
            episode = int(got.decode() if isinstance(got, bytes) else got)
        except Exception:
            episode = int(store.add(EPISODE, 1))
        self._episode(store, max(episode, self.handled + 1), overdue)

    # ------------------------------------------------------------------ one episode

    def _episode(self, store: Any, episode: int, overdue: Any) -> None:
        self.handled = max(self.handled, episode)
        for e in self.recorder.pending():
            self.reported.add(id(e))  # what is in flight now is covered by this report
        mine = record(self.recorder, "hang")
        for d in mine["entries"]:
            if d["group"].startswith(_fr.PREFIX) and d["state"] == "issued":
                self.torch_reported.add((d["group"], d["seq"]))
        me, ws = mine["rank"], mine["world_size"]
        records: dict[int, Optional[dict[str, Any]]] = {r: None for r in range(ws)}
        records[me] = mine
        if store is not None:
            self._exchange(store, episode, mine, records, self.gather)
        headline = self._headline(overdue, me, ws, episode)
        text = _report.render(records, ws, headline)
        self.last_report = text
        HangDetected.last_message = _report.diagnose(records, ws)
        try:
            print(text, file=sys.stderr, flush=True)
        except Exception:
            pass
        reported = time.time()
        self._dump()
        if store is not None and self.action != "report":
            self._all_done(store, episode, me, ws, records)
        self._act(overdue, reported)

    def _exchange(
        self, store: Any, episode: int, mine: dict[str, Any], records: dict[int, Any], wait: float
    ) -> None:
        me, ws = mine["rank"], mine["world_size"]
        try:
            store.set(f"{RECORD}/{episode}/{me}", json.dumps(mine))
        except Exception as exc:
            warn("store", f"could not publish this rank's record ({exc!r}); the report shows this rank only")
            return
        missing = [r for r in range(ws) if r != me]
        deadline = time.time() + wait
        while missing and time.time() < deadline:
            for r in list(missing):
                key = f"{RECORD}/{episode}/{r}"
                try:
                    if _compat.store_check(store, [key]):
                        records[r] = json.loads(store.get(key))
                        missing.remove(r)
                except Exception as exc:
                    warn("store-read", f"could not read rank {r}'s record ({exc!r})")
                    missing.remove(r)
            if missing:
                time.sleep(0.05)

    def _all_done(self, store: Any, episode: int, me: int, ws: int, records: dict[int, Any]) -> None:
        """Before ending or interrupting anything, wait (bounded) for every rank that answered to print."""
        try:
            store.set(f"{RECORD}/{episode}/done/{me}", "1")
            keys = [f"{RECORD}/{episode}/done/{r}" for r in range(ws) if records.get(r) is not None]
            deadline = time.time() + self.gather
            while time.time() < deadline and not _compat.store_check(store, keys):
                time.sleep(0.05)
        except Exception:
            pass

    def _headline(self, overdue: Any, me: int, ws: int, episode: int) -> str:
        head = f"rank {me} of {ws}, episode {episode}"
        if overdue is None:
            return head + ": another rank reported a collective that did not complete"
        d = overdue if isinstance(overdue, dict) else _rec.entry_dict(overdue)
        group = "the default group" if d["group"] == "default" else d["group"]
        if d["state"] == "failed":
            return head + f": {d['op']} #{d['seq']} on {group} ({d['site']}) failed in the backend"
        return (
            head + f": {d['op']} #{d['seq']} on {group} ({d['site']}) has not completed after"
            f" {self.timeout:g} s (HWDIST_HANG_TIMEOUT)"
        )

    def _dump(self) -> None:
        try:
            path = dump(self.recorder, None, "hang")
            print(f"hwdist hang doctor: flight record written to {path} (merge: hwdist trace DIR)",
                  file=sys.stderr, flush=True)
        except Exception as exc:
            where = _settings.text("HWDIST_FLIGHT_DIR") or "the default directory"
            warn("dump", f"could not write the flight record to {where!r} ({exc!r}); set HWDIST_FLIGHT_DIR")

    def _act(self, overdue: Any, reported: float) -> None:
        if self.action == "abort":
            _exit("abort")
        failed = isinstance(overdue, list) and overdue[_rec.STATE] == _rec.FAILED
        if self.action == "report" or failed:
            return  # a failed call raises anyway
        # raise: an exception in the main thread, delivered when it next runs Python code (unless its
        # blocked call already failed and raised this episode's HangDetected itself: on_failure)
        if not self._claim_delivery():
            return
        _raised.clear()
        main = threading.main_thread().ident
        if main is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(HangDetected))
        # A main thread running Python raises within milliseconds. One blocked in a collective (hwdist's,
        # or torch's own: DDP's backward, which the recorder may not see) or in another C call does not:
        # abort the group (a backend whose abort cancels the call makes it raise), and end the process
        # when the thread is still blocked EXIT_WITHIN seconds after the report.
        if _raised.wait(min(1.0, self.timeout)):
            _watch_exit(reported)
            return
        _abort_groups()
        if _raised.wait(max(0.0, reported + EXIT_WITHIN - time.time())):
            _watch_exit(reported)
            return
        _exit("raise (the main thread stayed blocked in the backend)")


def _watch_exit(reported: float) -> None:
    """After ``HangDetected`` was raised: bound the interpreter's exit, never a program that handles it.

    Uncaught, the exception ends the main thread and the interpreter runs its exit handlers (torch's
    and hwdist's teardown of the process group), which on a loaded host or with a stuck peer can take
    seconds. A thread (so that the report's own at-exit wait is not held up) ends the process with
    status 1, as the uncaught exception would have, when it is still exiting ``EXIT_WITHIN`` seconds
    after the report. A main thread still alive then caught the exception and goes on: left alone.
    """

    def watch() -> None:
        main = threading.main_thread()
        deadline = reported + EXIT_WITHIN
        while time.time() < deadline and main.is_alive():
            time.sleep(0.05)
        if main.is_alive():
            return
        time.sleep(max(0.0, deadline - time.time()))
        _exit("raise (HangDetected ended the main thread; its exit handlers still ran)", code=1)

    threading.Thread(target=watch, name="hwdist-hang-exit", daemon=True).start()


#: Words of a backend error that means a lost peer (gloo: "Connection closed by peer", NCCL: "remote process
#: exited", MPI: "aborted"); other failures are recorded, not reported.
LOST_PEER = ("connection", "closed", "reset", "peer", "broken pipe", "remote process", "abort", "timed out")


def _backend_failure(error: Any) -> bool:
    """A failure worth a report: the backend lost a peer (not an argument error, not hwdist's own)."""
    argument_errors = (HwdistError, TypeError, ValueError, KeyboardInterrupt)
    if error is None or isinstance(error, argument_errors):
        return False
    text = str(error).lower()
    return any(word in text for word in LOST_PEER)


def _abort_groups() -> None:
    """Abort the default process group where torch has ``abort()``.

    A backend whose abort cancels the call in flight makes the blocked call raise; one whose abort does
    not (docs/debugging-hangs.md) leaves it blocked, and ``_act``'s fallback ends the process.
    """
    pg = _compat.default_group()
    abort = getattr(pg, "abort", None)
    if abort is None:
        return
    try:
        abort()
    except Exception:
        pass


def _exit(why: str, code: int = HANG_EXIT_CODE) -> None:
    try:
        print(f"hwdist hang doctor: HWDIST_HANG_ACTION={why}: exiting with status {code}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
    except Exception:
        pass
    os._exit(code)
