"""The hang doctor: a flight recorder of every collective, a hang watchdog, dumps and their analysis.

* [`recorder`][hwdist.flight.recorder]: the ring buffer, on by default
  (``HWDIST_FLIGHT_RECORDER=0`` turns it off).
* [`watchdog`][hwdist.flight.watchdog]: a daemon thread that, when a collective has
  not completed after ``HWDIST_HANG_TIMEOUT`` seconds, gathers every rank's
  record through the store and prints one report (``HWDIST_HANG_ACTION``:
  raise, the default, abort or report). Started with the default process group
  (``init_dist``, or torch's ``init_process_group`` after ``import hwdist``) or by
  the first hwdist collective, never by ``import`` itself.
* ``torch_fr``: torch's own flight recorder, read where torch has one,
  so DDP's and FSDP's collectives are in the report without any setting.
* [`report`][hwdist.flight.report]: the report and its one-line diagnosis, also used
  offline by ``hwdist trace DIR``.

Guide: docs/debugging-hangs.md.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Any, Optional

from .. import _compat
from .. import settings as _settings
from ..collectives import call_entry
from . import recorder as _rec
from . import torch_hooks as _hooks
from . import watchdog as _wd

__all__ = ["dump_flight_record", "enable", "enabled", "snapshot", "watchdog_running"]

_recorder = _rec.Recorder(_rec.default_size())
_watchdog: Optional[_wd.Watchdog] = None
_signal_state: dict[str, Any] = {}
_torch_calls: list[Optional[bool]] = [None]  # enable(torch_calls=...); None: HWDIST_FLIGHT_TORCH


def _on_first_call() -> None:
    """Start the watchdog and the SIGUSR1 dump (once per process, from the first recorded collective)."""
    global _watchdog
    _settings.check_unknown()
    try:
        timeout = _wd.read_timeout()
        if timeout is not None and _watchdog is None:
            _watchdog = _wd.Watchdog(_recorder, timeout, _wd.read_action())
            _watchdog.start()
            _recorder.on_failure = _watchdog.on_failure
        _install_signal(timeout is not None)
    except Exception as exc:  # never into the user's collective
        _wd.warn("start", f"could not start the watchdog ({exc!r})")
    _attach_torch()


def _on_group(group: Any, is_default: bool) -> None:
    """torch made a process group: start the watchdog with the default group, record torch's calls on it."""
    if not enabled():
        return
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        return
    if _recorder.on_first_call is not None:
        _recorder._first_call()  # the watchdog and the SIGUSR1 dump, as the first hwdist call would
    elif is_default:
        _attach_torch()
    # another group: torch has not recorded its ranks yet (new_group does after this); the hooks attach it
    # at the next collective on an attached group, and torch's own recorder sees it from its first call


def group_started(group: Any = None) -> None:
    """Start what goes with a process group (the watchdog, torch's calls on it); ``init_backend`` calls it."""
    try:
        _on_group(group if group is not None else _compat.default_group(), group is None)
    except Exception as exc:  # never into the caller
        _wd.warn("start", f"could not start the watchdog ({exc!r})")


def _attach_group(group: Any) -> None:
    try:
        _hooks.attach(_recorder, group)
    except Exception as exc:  # never into the user's collective
        _wd.warn("torch-hooks", f"could not attach to torch's collective hooks ({exc!r})")


def _attach_torch() -> None:
    """Record torch.distributed's own calls too, through torch's hooks (torch >= 2.14; torch_hooks.py)."""
    try:
        wanted = _torch_calls[0] if _torch_calls[0] is not None else _settings.flag("HWDIST_FLIGHT_TORCH")
        if wanted and not _hooks.available():
            import torch

            seen = "its own flight recorder is read instead" if _compat.TORCH_FR else "they are not recorded"
            _wd.warn(
                "torch-hooks-missing",
                f"HWDIST_FLIGHT_TORCH=1 asks for torch.distributed's own calls, but torch {torch.__version__}"
                f" has no per-group collective hooks (torch >= 2.14); {seen}",
            )
        if wanted and _hooks.available():
            _recorder.on_new_group = _attach_group
            _hooks.attach_all(_recorder)
    except Exception as exc:  # never into the user's collective
        _wd.warn("torch-hooks", f"could not attach to torch's collective hooks ({exc!r})")


def enable(on: bool = True, torch_calls: Optional[bool] = None) -> bool:
    """Switch the flight recorder on or off in this process; returns the previous state.

    With ``torch_calls=True`` (or ``HWDIST_FLIGHT_TORCH=1``) on torch >= 2.14 it also records the
    collectives that torch.distributed, DDP and FSDP issue themselves, through torch's hooks: from
    this call on when a process group exists (call it after ``init_process_group``), else from the
    first hwdist call. Off by default (its cost: docs/benchmarks.md).

    Args:
        on: record every collective (True) or nothing (False).
        torch_calls: record torch.distributed's own calls too (None: ``HWDIST_FLIGHT_TORCH``).

    Returns:
        Whether it was on.

    Examples:
        >>> hwdist.flight.enable(False)   # every rank, or only where you need the speed
        True
        >>> hwdist.flight.enable(torch_calls=True)   # after init_process_group: DDP's calls too
        False
    """
    was = enabled()
    if torch_calls is not None:
        _torch_calls[0] = bool(torch_calls)
        if not torch_calls:
            _recorder.on_new_group = None
            _hooks.detach_all()
    if on:
        if _recorder.on_first_call is None and not _recorder.ring and _watchdog is None:
            _recorder.on_first_call = _on_first_call
        call_entry.set_recorder(_recorder)
        _attach_torch()  # torch's own calls too, from now on (idempotent; nothing before a process group)
    elif call_entry.recorder() is _recorder:
        call_entry.set_recorder(None)
        _recorder.on_new_group = None
        _hooks.detach_all()
    return was


def enabled() -> bool:
    """Whether the flight recorder is on in this process."""
    return call_entry.recorder() is _recorder


def watchdog_running() -> bool:
    """Whether this process's hang watchdog thread runs (started by the first collective)."""
    return _watchdog is not None and _watchdog.thread.is_alive()


def snapshot() -> list[dict[str, Any]]:
    """This process's recorded collectives, oldest first, as dicts (what dumps hold, one per line).

    Returns:
        One dict per entry: ``group``, ``seq``, ``op``, ``backend``, ``args``, ``site``, ``start``, ``end``,
        ``state`` (issued, completed or failed) and ``error`` for a failed call.
    """
    return [_rec.entry_dict(e) for e in _recorder.entries()]


def dump_flight_record(path: Optional[str] = None) -> Optional[str]:
    """Write this rank's flight record as JSON lines; call it on every rank, then run ``hwdist trace DIR``.

    The file holds a header line (rank, host, pid, the main thread's stack) and one
    line per recorded collective. Never raises: a path that cannot be written gives a
    warning and None.

    Args:
        path: a directory (the file is ``flight-rank<R>.jsonl`` in it) or a ``.jsonl`` file name: with
            several ranks each writes ``<stem>-rank<R>.jsonl`` beside it (``a/run7-rank1.jsonl``), and a
            file that exists is left as it is (the record goes to ``<name>.1.jsonl``); default
            ``HWDIST_FLIGHT_DIR`` (always a directory), or the private ``<tmp>/hwdist-flight-<uid>``
            (mode 0700). Files are mode 0600, written to a new file and renamed into place.

    Returns:
        The file written, or None when it could not be written.

    Examples:
        >>> hwdist.dump_flight_record("/shared/run7/flight")
        '/shared/run7/flight/flight-rank0.jsonl'   # rank 0
        '/shared/run7/flight/flight-rank1.jsonl'   # rank 1
    """
    target = os.fspath(path) if path is not None else None
    try:
        return _wd.dump(_recorder, target, "dump_flight_record")
    except Exception as exc:
        where = target or _settings.text("HWDIST_FLIGHT_DIR") or "the default directory"
        _wd.warn(f"dump:{where}", f"could not write the flight record to {where!r} ({exc!r})")
        return None


# --------------------------------------------------------------------------- SIGUSR1


def _signal_free(signum: int) -> bool:
    """Whether nothing handles ``signum`` yet (faulthandler, a C library or Python code)."""
    if signal.getsignal(signum) not in (signal.SIG_DFL, None):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(512)  # struct sigaction starts with the handler on Linux and macOS
        if libc.sigaction(signum, None, buf) != 0:
            return True
        return not ctypes.c_void_p.from_buffer(buf).value
    except Exception:
        return True


def _dump_on_signal(reason: str) -> None:
    path = dump_flight_record()
    if path is not None:
        print(f"hwdist: flight record written to {path} ({reason})", file=sys.stderr, flush=True)


def _install_signal(watchdog_on: bool) -> None:
    """Dump the record on SIGUSR1 (``HWDIST_FLIGHT_SIGNAL``: auto = when the watchdog runs)."""
    try:
        mode = _settings.choice("HWDIST_FLIGHT_SIGNAL")
    except ValueError as exc:
        _wd.warn("signal", f"{exc}; SIGUSR1 is not handled")
        return
    usr1 = getattr(signal, "SIGUSR1", None)
    if mode == "off" or (mode == "auto" and not watchdog_on) or usr1 is None or _signal_state:
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be installed from the main thread
    if not _signal_free(usr1):
        if mode == "on":
            _wd.warn("signal", "SIGUSR1 already has a handler (faulthandler?); no flight-record dump on it")
        return
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)

    def handler(signum: int, frame: Any) -> None:
        if not _signal_state.get("pipe"):
            _dump_on_signal("SIGUSR1")

    signal.signal(usr1, handler)
    _signal_state["handler"] = handler
    try:
        old = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        old = -2
    if old != -1:  # another wakeup fd (asyncio) is in use: keep it; the handler dumps when Python runs
        if old >= 0:
            signal.set_wakeup_fd(old)
        os.close(rfd)
        os.close(wfd)
        return
    _signal_state["pipe"] = True  # a blocked main thread cannot run a Python handler: a thread reads the pipe

    def reader() -> None:
        while True:
            try:
                data = os.read(rfd, 64)
            except OSError:
                return
            if not data:
                return
            if usr1 in data:
                _dump_on_signal("SIGUSR1")

    threading.Thread(target=reader, name="hwdist-flight-signal", daemon=True).start()


if _settings.flag("HWDIST_FLIGHT_RECORDER"):
    enable(True)
    # start with every group torch makes from now on (the one change import makes outside hwdist: _compat)
    _compat.watch_group_creation(_on_group)
