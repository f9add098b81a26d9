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
from typing import Any, Callable, Iterator, Sequence, TextIO

__all__ = ["report_stream", "local_ranks", "startup_failure", "HEARTBEAT_S"]

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
