"""How ``hwdist check`` and ``hwdist bench`` get their ranks, and keep stdout for their report.

* [`report_stream`][hwdist.cli_ranks.report_stream]: while ranks run, file descriptor 1 points at stderr,
  so whatever torch, gloo or a rank prints (Python or C++, ``print`` or
  ``write(1, ...)``) lands on stderr; the report goes to a private duplicate
  of the original stdout that no rank inherits.
* [`local_ranks`][hwdist.cli_ranks.local_ranks]: spawned local ranks (``hwdist.testing.RankPool``),
  saying on stderr what is starting and how long it took.
* under ``mpiexec``, the job's processes themselves are the ranks
  (`hwdist.testing.mpi_ranks`).
* [`startup_failure`][hwdist.cli_ranks.startup_failure]: the one-line reason the ranks did not start.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
import threading
import time
import argparse
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO

__all__ = [
    "report_stream",
    "local_ranks",
    "startup_failure",
    "HEARTBEAT_S",
    "PROG",
    "UsageError",
    "error_line",
    "choose_backend",
    "ranks_for",
]

PROG = "hwdist"

#: While ranks start, stderr gets a line this often (seconds).
HEARTBEAT_S = 5.0


@contextlib.contextmanager
def report_stream(out: TextIO) -> Iterator[TextIO]:
    """Yield a stream for the report on ``out``'s descriptor, with that descriptor sent to stderr meanwhile.

    Ranks spawned inside the block inherit descriptor 1 pointing at stderr;
    the yielded stream writes to a non-inheritable duplicate of the original
    stdout. When ``out`` has no descriptor (a test's capture buffer), ``out``
    itself is yielded.
    """
    try:
        fd = out.fileno()
        err_fd = sys.stderr.fileno()
        out.flush()
        saved = os.dup(fd)  # non-inheritable (PEP 446): no rank gets it
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # no descriptor, or a closed one
        yield out
        return
    report = os.fdopen(saved, "w", encoding=getattr(out, "encoding", None) or "utf-8", closefd=True)
    os.dup2(err_fd, fd)
    try:
        yield report
        report.flush()
    finally:
        os.dup2(saved, fd)
        with contextlib.suppress(OSError):  # a closed pipe was reported by the flush above
            report.close()


def _say(err: TextIO, text: str) -> None:
    err.write(f"hwdist: {text}\n")
    err.flush()


def local_ranks(n: int, backend: str, timeout: float, err: TextIO) -> Callable[[], Any]:
    """A factory of ``RankPool(n, backend)`` that reports start-up progress on ``err``."""
    from .testing import RankPool

    starts = [0]

    def make() -> Any:
        again = "restarting" if starts[0] else "starting"
        starts[0] += 1
        _say(err, f"{again} {n} rank(s) on backend '{backend}' (limit {timeout:g} s, --timeout)...")
        begin = time.monotonic()
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(HEARTBEAT_S):
                _say(err, f"still starting {n} rank(s): {time.monotonic() - begin:.0f} s of {timeout:g} s")

        beat = threading.Thread(target=heartbeat, name="hwdist-start-progress", daemon=True)
        beat.start()
        try:
            pool = RankPool(n, backend, timeout=timeout, pg_timeout=timeout)
        finally:
            done.set()
            beat.join()
        _say(err, f"{n} rank(s) ready in {time.monotonic() - begin:.1f} s")
        return pool

    return make


def _ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``'0-2, 5, 7-8'``."""
    parts: list[str] = []
    for r in sorted(ranks):
        if parts and r == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def startup_failure(exc: BaseException, n: int, backend: str, timeout: float) -> str:
    """The reason ``n`` ranks did not start, from a ``RankFailure``'s report.

    With a ``--timeout`` hint when they were slow.
    """
    lines = [ln.strip() for ln in str(exc).splitlines()]
    root = next((ln[len("root cause:") :].strip() for ln in lines if ln.startswith("root cause:")), None)
    hung = next((ln[len("hung ranks:") :].strip() for ln in lines if ln.startswith("hung ranks:")), None)
    head = f"could not start {n} rank(s) on backend '{backend}'"
    if root is not None:
        text = f"{head}: {root}"
        if re.search(r"time[ds]? ?out|timeout|deadline", root, re.IGNORECASE):
            text += f". HINT: if the ranks were slow to meet, allow more time: --timeout {int(timeout * 4)}"
        return text
    if hung is not None:
        pending = [int(x) for x in re.findall(r"\d+", hung.split("(")[0])]
        ready = n - len(pending)
        guess = timeout * 4 if ready == 0 else timeout * 1.5 * n / ready
        suggest = int(math.ceil(guess / 10.0) * 10)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return (
            f"{head} within {timeout:g} s (--timeout): {ready} of {n} ready; rank(s) {_ranges(pending)} still"
            f" starting. HINT: each rank imports torch in a fresh process ({cores} CPU core(s) here);"
            f" pass --timeout {suggest}, or fewer ranks (-n)"
        )
    first = next((ln for ln in lines if ln), type(exc).__name__)
    return f"{head}: {first}"


# --------------------------------------------------------------------------
# what every command shares: its errors, its backend, its ranks
# --------------------------------------------------------------------------


class UsageError(Exception):
    """A problem with how the command was called; printed as one line, exit code 2."""


def error_line(command: Optional[str], message: str) -> str:
    """An error of the ``hwdist`` command as printed: ``hwdist COMMAND: error: MESSAGE``.

    The one form for every error (argparse's for a subcommand), so a script can grep one prefix;
    ``hwdist: error:`` only without a command (``hwdist bogus``).
    """
    return f"{PROG}{' ' + command if command else ''}: error: {message}"


def choose_backend(name: Optional[str]) -> Any:
    """The driver for ``--backend`` (default: what detection picks), available here.

    Raises:
        UsageError: unknown or unavailable backend, or a bad override variable.
    """
    import hwdist
    import hwdist.testing  # noqa: F401  (registers the emulated accelerator 'emu')

    if name is None:
        try:
            name = hwdist.detect().backend
        except hwdist.BackendError as exc:
            raise UsageError(f"{exc}. Fix: unset the variable or pass --backend NAME") from None
    try:
        driver = hwdist.get_driver(name)
    except hwdist.BackendError as exc:
        from .registry import close_name

        close = close_name(str(name))
        fix = f"pass --backend {close}" if close else "pass --backend with one of the registered names"
        raise UsageError(f"{exc}. Fix: {fix}") from None
    why = driver.unavailable_reason()
    if why is not None:
        available = hwdist.available_backends()
        fix = f"pass --backend {available[0]}" if available else "install a backend's support package"
        if driver.name in extras():  # the package's own extra installs what the backend needs
            fix = f"pip install 'hwdist[{driver.name}]'" + (f", or {fix}" if available else "")
        raise UsageError(
            f"backend {driver.name!r} is not available here: {why}. Available: {', '.join(available)}."
            f" Fix: {fix} (`hwdist env` lists every backend)"
        )
    return driver


def extras() -> list[str]:
    """The optional-dependency extras the installed hwdist declares (``[]`` if its metadata is absent)."""
    from importlib import metadata

    try:
        return list(metadata.metadata("hwdist").get_all("Provides-Extra") or [])
    except metadata.PackageNotFoundError:
        return []


def ranks_for(
    args: argparse.Namespace, driver: Any, argv: Sequence[str], err: TextIO
) -> tuple[Optional[Callable[[], Any]], Optional[int]]:
    """``(pool factory, None)`` for the command's ranks, or ``(None, exit code)`` when a launcher ran it.

    In an mpiexec job the job's processes are the ranks; a backend whose
    driver requires that launcher re-runs the command under ``mpiexec -n N``.
    """
    from .testing import mpi_ranks as job

    try:
        if job.job_size() is not None:
            make, args.nproc = job.job_ranks(args.nproc, driver.name, args.timeout, err)
            return make, None
        args.nproc = args.nproc or 2
        needs = driver.required_launcher
        if needs is None:
            return local_ranks(args.nproc, driver.name, args.timeout, err), None
        if needs != job.LAUNCHER:
            raise ValueError(
                f"backend {driver.name!r} needs every rank started by launcher {needs!r};"
                " start the command with it"
            )
        return None, job.rerun(list(argv), args.nproc, args.timeout * (len(_planned(args)) + 2), err)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _planned(args: argparse.Namespace) -> list[str]:
    """The check names (check) or op names (bench) the command will run: bounds an mpiexec run."""
    if args.command == "check":
        from . import checks

        return list(args.only or checks.check_names()) * 6  # up to 6 dtypes each
    return [o for o in args.ops.split(",") if o] * 16
