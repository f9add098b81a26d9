"""Dump files: written safely, read defensively.

Writing (``dump_flight_record``, ``SIGUSR1``, the watchdog):

* the default directory is private to the user: ``<tmp>/hwdist-flight-<uid>``,
  created with mode 0700. One that exists but is a link, is not owned by the
  user or can be written by the group or others is not used: the dump goes to a
  fresh private directory (``tempfile.mkdtemp``) with a warning naming both;
* each file is written to a new temporary file (``O_CREAT|O_EXCL|O_NOFOLLOW``,
  mode 0600, a random name) in the target's directory, then renamed over the
  target: a planted link is replaced, never followed;
* ``HWDIST_FLIGHT_DIR`` always names a directory: a value ending in ``.jsonl``
  is used as a directory too, with a warning (as a file, every rank would write
  the same one).

Reading (``hwdist trace``): a file is opened without blocking (a FIFO cannot
stall the reader), must be a regular file of at most
[`MAX_DUMP_BYTES`][hwdist.flight.files.MAX_DUMP_BYTES], and every field must
have its type and range; anything else skips that file with a reason. Text is
stripped of control characters (no terminal escapes reach the screen).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from typing import Any, Optional

__all__ = [
    "MAX_DUMP_BYTES", "MAX_RANKS", "BadDump", "clean", "default_dir", "read_dump", "write_lines",
]

#: The largest dump file ``hwdist trace`` reads (a full ring of 2048 entries is about 1 MiB).
MAX_DUMP_BYTES = 64 << 20
#: The largest rank count a dump may state (ranks and world sizes beyond it are refused as corrupt).
MAX_RANKS = 1 << 17
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class BadDump(ValueError):
    """A dump file that cannot be used; the message says why."""


def clean(text: Any, limit: int = 2000) -> str:
    """``text`` as a printable one-line string: control characters shown as ``\\xNN``, at most ``limit``."""
    s = str(text)[:limit]
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


# --------------------------------------------------------------------------- writing


def _private_dir_ok(path: str) -> Optional[str]:
    """Why ``path`` is not a usable private directory (None: it is)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"the group or others can write it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def default_dir() -> tuple[str, Optional[str]]:
    """The private default dump directory, created 0700: (directory, warning or None)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    path = os.path.join(tempfile.gettempdir(), f"hwdist-flight-{uid}")
    why = _private_dir_ok(path)
    if why is None:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        why = _private_dir_ok(path)  # a race with another user: check what is there now
        if why is None:
            return path, None
    fresh = tempfile.mkdtemp(prefix=f"hwdist-flight-{uid}-")
    return fresh, f"the dump directory {path!r} is not used ({why}); writing to {fresh!r} instead"


def write_lines(target: str, lines: list[str]) -> None:
    """Write ``lines`` to ``target`` through a private temporary file renamed over it (mode 0600)."""
    folder = os.path.dirname(os.path.abspath(target))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(16):
        tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"could not create a temporary file next to {target!r}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line + "\n")
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --------------------------------------------------------------------------- reading


def _read_bounded(path: str) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise BadDump(f"cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadDump("not a regular file")
        if st.st_size > MAX_DUMP_BYTES:
            raise BadDump(f"{st.st_size} bytes, more than the {MAX_DUMP_BYTES} a dump may have")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_DUMP_BYTES:
                raise BadDump(f"more than the {MAX_DUMP_BYTES} bytes a dump may have")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise BadDump(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _int(d: dict[str, Any], key: str, low: int, high: int, default: Optional[int] = None) -> int:
    v = d.get(key, default)
    if type(v) is not int or not low <= v <= high:  # bool is not a rank
        raise BadDump(f"field {key!r} must be an integer in [{low}, {high}], got {clean(repr(v)[:60], 60)}")
    return v


def _num(d: dict[str, Any], key: str, optional: bool = False) -> Optional[float]:
    v = d.get(key)
    if v is None and optional:
        return None
    try:
        f = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    except OverflowError:
        f = math.nan
    if not math.isfinite(f):
        raise BadDump(f"field {key!r} must be a finite number, got {clean(repr(v)[:60], 60)}")
    return f


def _str(d: dict[str, Any], key: str, default: Optional[str] = None, limit: int = 2000) -> str:
    v = d.get(key, default)
    if not isinstance(v, str):
        raise BadDump(f"field {key!r} must be a string, got {clean(repr(v), 60)}")
    return clean(v, limit)


def _entry(e: Any, n: int) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise BadDump(f"line {n} is not a JSON object")
    from .recorder import STATES

    try:
        out: dict[str, Any] = {
            "group": _str(e, "group", limit=200),
            "backend": _str(e, "backend", "?", 100),
            "seq": _int(e, "seq", 0, 1 << 62),
            "op": _str(e, "op", limit=100),
            "args": _str(e, "args", "", 200),
            "site": _str(e, "site", "?", 300),
            "start": _num(e, "start"),
            "end": _num(e, "end", optional=True),
            "state": _str(e, "state", limit=20),
            "thread": e.get("thread") if type(e.get("thread")) is int else None,
        }
        if out["state"] not in STATES:
            raise BadDump(f"field 'state' must be one of {', '.join(STATES)}, got {out['state']!r}")
        ranks = e.get("group_ranks")
        if ranks is not None:
            if not isinstance(ranks, list) or len(ranks) > MAX_RANKS or not all(
                type(r) is int and 0 <= r < MAX_RANKS for r in ranks
            ):
                raise BadDump(f"field 'group_ranks' must be a list of ranks below {MAX_RANKS}")
        out["group_ranks"] = ranks
        for key in ("file", "func", "error"):
            if e.get(key) is not None:
                out[key] = _str(e, key, limit=400)
    except BadDump as exc:
        raise BadDump(f"line {n}: {exc}") from None
    return out


def read_dump(path: str) -> dict[str, Any]:
    """One dump file as a checked record (``entries`` included); raises ``BadDump`` saying why not."""
    data = _read_bounded(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadDump(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            lines.append((n, json.loads(line)))
        except RecursionError:
            raise BadDump(f"line {n}: JSON nested too deeply") from None
        except ValueError as exc:
            raise BadDump(f"line {n}: not JSON ({exc})") from None
    if not lines:
        raise BadDump("empty")
    n, header = lines[0]
    if not isinstance(header, dict):
        raise BadDump("line 1 (the header) is not a JSON object")
    rec: dict[str, Any] = {
        "rank": _int(header, "rank", 0, MAX_RANKS - 1),
        "world_size": _int(header, "world_size", 1, MAX_RANKS, 1),
        "host": _str(header, "host", "?", 200),
        "pid": header.get("pid") if type(header.get("pid")) is int else "?",
        "time": _num(header, "time") if "time" in header else 0.0,
        "reason": _str(header, "reason", "", 200),
        "where": _str(header, "where", "", 400),
    }
    stack = header.get("stack", [])
    if not isinstance(stack, list) or not all(isinstance(f, str) for f in stack):
        raise BadDump("field 'stack' must be a list of strings")
    rec["stack"] = [clean(f, 400) for f in stack[-200:]]
    rec["entries"] = [_entry(e, m) for m, e in lines[1:]]
    return rec
