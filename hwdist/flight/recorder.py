"""The flight recorder: a ring buffer of this process's recent collectives.

An observer of the collective entry (`hwdist.collectives.call_entry`): every
outermost public collective appends one entry when it starts and completes it
when it returns or raises. Per call the hot path reads the clock twice, finds
the user's call site (first frame outside hwdist), bumps the group's sequence
number and keeps the first argument's dtype and shape (as objects: the text is
made only when the buffer is read). Measured cost: docs/benchmarks.md.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Optional

import torch

from .. import _compat, _state
from .. import settings as _settings

__all__ = ["Recorder", "GroupInfo", "ISSUED", "COMPLETED", "FAILED", "STATES", "entry_dict"]

ISSUED, COMPLETED, FAILED = 0, 1, 2
#: State names as dumps and reports show them.
STATES = ("issued", "completed", "failed")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_Tensor = torch.Tensor
_now = time.time
_getframe = sys._getframe
_get_ident = threading.get_ident
_default_group = _compat.default_group
_weakref = weakref.ref

# Entry layout (a list, the cheapest object to make): the indices below.
SEQ, OP, GROUP, ARGS, CODE, LINE, START, END, STATE, ERROR, THREAD = range(11)


class GroupInfo:
    """What the recorder keeps per process group: its label, ranks, backend and sequence counter."""

    __slots__ = ("label", "ranks", "backend", "seq")

    def __init__(self, label: str, ranks: Optional[list[int]], backend: str) -> None:
        self.label, self.ranks, self.backend, self.seq = label, ranks, backend, 0


def _group_info(group: Any) -> Optional[GroupInfo]:
    """The group's info, made on first use; None when no process group is initialised (a no-op call)."""
    st = _state.of(group)
    info: Optional[GroupInfo] = st.flight
    if info is not None:
        return info
    import torch.distributed as torch_dist

    if not (_compat.DIST_AVAILABLE and torch_dist.is_initialized()):
        return None
    world = _compat.default_group()
    if group is not None and group is world:
        info = _group_info(None)  # the default group, passed explicitly: one counter with group=None
    else:
        from .. import registry

        try:
            backend = registry.resolve(group).name
        except Exception:
            backend = "?"
        if group is None:
            info = GroupInfo("default", None, backend)
        else:
            try:
                ranks: Optional[list[int]] = list(torch_dist.get_process_group_ranks(group))
            except Exception:
                ranks = None
            label = f"group[{','.join(map(str, ranks))}]" if ranks is not None else f"group@{id(group):x}"
            info = GroupInfo(label, ranks, backend)
    st.flight = info
    return info


group_info = _group_info  # for torch_hooks.py: the same info (and sequence count) for a group


def _summary(value: Any) -> Any:
    """A cheap summary of a collective's first argument: objects only, formatted later by ``describe``."""
    if isinstance(value, _Tensor):
        return (value.dtype, value.shape)
    if isinstance(value, (list, tuple)):
        first = value[0] if value else None
        if isinstance(first, _Tensor):
            return ("list", len(value), first.dtype, first.shape)
        return ("list", len(value))
    if isinstance(value, dict):
        return ("dict", len(value))
    return type(value).__name__


def describe(summary: Any) -> str:
    """The text of a summary: ``float32[4, 3]``, ``list[2] of float32[4]``, ``dict[20]``, ``int``.

    A tensor argument is kept while the call runs and weakly after it: ``?`` once it was freed.
    """
    if isinstance(summary, weakref.ref):
        summary = summary()
        if summary is None:
            return "?"
    if isinstance(summary, _Tensor):
        summary = _summary(summary)
    if isinstance(summary, str):
        return summary
    if not isinstance(summary, tuple):
        return ""
    if len(summary) == 2 and isinstance(summary[0], torch.dtype):
        return f"{str(summary[0])[6:]}[{', '.join(map(str, summary[1]))}]"
    kind, n = summary[0], summary[1]
    text = f"{kind}[{n}]"
    if len(summary) == 4:
        text += f" of {describe((summary[2], summary[3]))}"
    return text


def _dead() -> None:
    """A weak reference that never had a referent."""
    return None


class Recorder:
    """The ring buffer and the observer methods (``begin``/``end``) the collective entry calls."""

    def __init__(self, size: int) -> None:
        self.size = max(16, int(size))
        self.ring: collections.deque[list[Any]] = collections.deque(maxlen=self.size)
        self._append = self.ring.append
        self.world_info: Optional[GroupInfo] = None  # the default group's info (group=None), cached
        self._world_pg: Any = _dead  # a weak reference to the default group the cached info belongs to
        self._launch_checked = False  # whether a call without a process group looked for a launcher
        self.on_first_call: Any = None  # called once, on the first recorded call (starts the watchdog)
        self.on_new_group: Any = None  # called with a group the recorder sees for the first time
        #: called with the entry of a call that raised (the watchdog's report); may return the exception
        #: the call raises instead (the raise action's HangDetected)
        self.on_failure: Any = None

    def begin(self, op: str, group: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record the start of a call (the observer protocol); returns the entry (the token). Never raises."""
        try:
            if group is None:  # the common case: the default group's info, dropped with its group state
                info = self.world_info
                pg = self._world_pg()
                if info is None or pg is None or pg is not _compat.default_group():
                    info = self._world()  # first call, or torch destroyed and made the default group anew
            else:
                info = _state.of(group).flight
                if info is None:
                    info = _group_info(group)
                    if info is not None:
                        self._first_call()
                        if self.on_new_group is not None:  # torch's own calls on it too (torch_hooks.py)
                            self.on_new_group(group)
            if info is None:
                return None
            f: Any = _getframe(2)  # begin <- guarded <- the caller (a few more hwdist frames on other paths)
            while f.f_code.co_filename.startswith(_PACKAGE_DIR):  # the first frame outside hwdist
                f = f.f_back
            info.seq += 1
            entry = [
                info.seq, op, info, args[0] if args else None, f.f_code, f.f_lasti,
                _now(), 0.0, ISSUED, None, _get_ident(),
            ]
            self._append(entry)
            return entry
        except Exception:  # (a frame walk that ran out of frames, ...): this call goes unrecorded
            return None

    def _first_call(self) -> None:
        if self.on_first_call is not None:
            hook, self.on_first_call = self.on_first_call, None
            hook()

    def _world(self) -> Optional[GroupInfo]:
        info = _group_info(None)
        if info is None and not self._launch_checked:  # a collective with no process group: a launcher's?
            self._launch_checked = True
            from .. import info as _info

            _info.warn_if_launched(stacklevel=5)
        if info is not None:  # a process group exists: start the watchdog (never for a non-distributed run)
            self._first_call()
            # keyed by torch's group object: a default group destroyed and made anew (by hwdist or by
            # torch directly) is a new group with a counter of its own, whichever way a caller names it
            self._world_pg = weakref.ref(_compat.default_group())
            self.world_info = info
        return info

    def end(self, token: Any, error: Optional[BaseException]) -> Optional[BaseException]:
        """Complete the entry (the observer protocol); for a failed call, what ``on_failure`` returns."""
        if token is None:
            return None
        token[END] = _now()
        arg = token[ARGS]
        if type(arg) is _Tensor or isinstance(arg, _Tensor):  # kept weakly once the call is over
            token[ARGS] = _weakref(arg)
        elif arg is not None:
            token[ARGS] = _summary(arg)
        if error is None:
            token[STATE] = COMPLETED
        else:
            token[STATE] = FAILED
            token[ERROR] = error
            if self.on_failure is not None:
                try:
                    instead = self.on_failure(token)
                except Exception:
                    return None  # never into the caller
                return instead if isinstance(instead, BaseException) else None
        return None

    def entries(self) -> list[list[Any]]:
        """The entries in the buffer, oldest first (a snapshot)."""
        return list(self.ring)  # one C-level copy: atomic with respect to the recording thread

    def pending(self) -> list[list[Any]]:
        """Entries still in flight, oldest first."""
        return [e for e in self.entries() if e[STATE] == ISSUED]


def line_of(code: Any, lasti: int) -> int:
    """The source line of instruction offset ``lasti`` in ``code`` (what ``frame.f_lineno`` said)."""
    lines = getattr(code, "co_lines", None)
    if lines is not None:  # Python 3.10+
        for start, stop, line in lines():
            if start <= lasti < stop and line is not None:
                return int(line)
    import dis

    found = code.co_firstlineno
    for offset, line in dis.findlinestarts(code):
        if offset > lasti:
            break
        if line is not None:
            found = line
    return int(found)


def site_of(entry: list[Any]) -> str:
    """``file.py:LINE`` of an entry's call site (the path shortened to its last two parts)."""
    code = entry[CODE]
    if code is None:
        return "?"
    return f"{short_path(code.co_filename)}:{line_of(code, entry[LINE])}"


def short_path(path: str) -> str:
    """The last two parts of a path (``pkg/train.py``), enough to find a file in a report."""
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def entry_dict(entry: list[Any]) -> dict[str, Any]:
    """An entry as the JSON object dumps, the side channel and reports use."""
    info: GroupInfo = entry[GROUP]
    code = entry[CODE]
    err = entry[ERROR]
    out: dict[str, Any] = {
        "group": info.label,
        "group_ranks": info.ranks,
        "backend": info.backend,
        "seq": entry[SEQ],
        "op": entry[OP],
        "args": describe(entry[ARGS]),
        "site": site_of(entry),
        "file": code.co_filename if code is not None else None,
        "func": code.co_name if code is not None else None,
        "start": entry[START],
        "end": entry[END] or None,
        "state": STATES[entry[STATE]],
        "thread": entry[THREAD],
    }
    if err is not None:
        out["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    return out


def default_size() -> int:
    """The buffer size from ``HWDIST_FLIGHT_SIZE``: 16 to 2**24 entries (0: the default, 2048).

    A bad or out-of-range value (text, 400 digits) gives a warning naming the variable, and 2048.
    """
    value = _settings.bounded(
        "HWDIST_FLIGHT_SIZE", 0, 1 << 24, integer=True, what="entries the flight recorder keeps per process"
    )
    return max(16, int(value) or 2048)


#: The keys ``warn`` has warned for (once per process).
WARNED: set[str] = set()


def warn(key: str, message: str) -> None:
    """One RuntimeWarning per ``key`` per process, also on stderr (a thread's warnings may be lost)."""
    if key in WARNED:
        return
    WARNED.add(key)
    text = f"hwdist hang doctor: {message}"
    try:
        print(text, file=sys.stderr, flush=True)
        warnings.warn(text, RuntimeWarning, stacklevel=2)
    except Exception:
        pass
