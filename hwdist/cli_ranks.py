"""How ``hwdist check`` and ``hwdist bench`` get their ranks, and keep stdout for their report.

* :func:`report_stream`: while ranks run, file descriptor 1 points at stderr,
  so whatever torch, gloo or a rank prints (Python or C++, ``print`` or
  ``write(1, ...)``) lands on stderr; the report goes to a private duplicate
  of the original stdout that no rank inherits.
* :func:`local_ranks`: spawned local ranks (``hwdist.testing.RankPool``),
  saying on stderr what is starting and how long it took.
* :class:`MpiRanks`: under ``mpiexec``, the MPI processes themselves are the
  ranks; :func:`rerun_under_mpiexec` starts that for ``--backend mpi``.
* :func:`startup_failure`: the one-line reason the ranks did not start.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Iterator, Optional, Sequence, TextIO

__all__ = [
    "report_stream",
    "local_ranks",
    "MpiRanks",
    "under_mpi_launcher",
    "rerun_under_mpiexec",
    "startup_failure",
    "MPIEXEC_ENV",
]

#: Set in the processes ``hwdist`` starts under mpiexec itself (they must not start mpiexec again).
MPIEXEC_ENV = "HWDIST_CLI_UNDER_MPIEXEC"


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
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        yield out
        return
    out.flush()
    saved = os.dup(fd)  # non-inheritable (PEP 446): no rank gets it
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
        pool = RankPool(n, backend, timeout=timeout, pg_timeout=timeout)
        _say(err, f"{n} rank(s) ready in {time.monotonic() - begin:.1f} s")
        return pool

    return make


def under_mpi_launcher() -> bool:
    """Whether mpiexec/mpirun started this process (an MPI world-size variable is set)."""
    from .launch.mpi import SIZE_VARS

    return any(os.environ.get(v) for v in SIZE_VARS)


class MpiRanks:
    """The MPI processes of this job as the ranks, with the ``RankPool`` interface ``hwdist`` uses.

    Every process initialises ``backend`` through the ``mpi`` launcher and
    runs each function in place; outcomes are exchanged over mpi4py, so every
    process sees every rank's result (or the same :class:`RankFailure`).
    A rank stuck in a collective is bounded by the process-group timeout and
    by ``MPIEXEC_TIMEOUT``, not by a watchdog.
    """

    broken = False

    def __init__(self, backend: str, timeout: float) -> None:
        from mpi4py import MPI

        import hwdist

        self.comm = MPI.COMM_WORLD
        self.rank: int = self.comm.Get_rank()
        self.world_size: int = self.comm.Get_size()
        self.backend = backend
        try:
            hwdist.init_dist("mpi", backend=backend, timeout=timeout)
            outcome: tuple[str, Any, str] = ("ready", None, "")
        except Exception as exc:
            outcome = ("init_error", None, f"{traceback.format_exc()}\n{type(exc).__name__}: {exc}")
        self._check(self.comm.allgather(outcome), "start-up")

    def run(self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` here (on every MPI process); every rank's result, by rank."""
        try:
            outcome: tuple[str, Any, str] = ("ok", fn(*args, **kwargs), "")
        except BaseException as exc:  # report everything, as RankPool does
            outcome = ("error", None, f"{traceback.format_exc()}\n{type(exc).__name__}: {exc}")
        return self._check(self.comm.allgather(outcome), getattr(fn, "__qualname__", repr(fn)))

    def _check(self, outcomes: list[tuple[str, Any, str]], what: str) -> list[Any]:
        from .testing import RankFailure

        failed = [r for r, o in enumerate(outcomes) if o[0] not in ("ok", "ready")]
        if not failed:
            return [o[1] for o in outcomes]
        root = failed[0]
        last = [ln for ln in outcomes[root][2].strip().splitlines() if ln.strip()][-1:] or ["(no message)"]
        lines = [f"{what} failed on {self.world_size} MPI rank(s), backend {self.backend!r}:"]
        lines.append(f"  root cause: rank {root} {outcomes[root][0]}: {last[0].strip()}")
        lines += [f"\n===== rank {r}: {outcomes[r][0]} =====\n{outcomes[r][2].rstrip()}" for r in failed]
        raise RankFailure("\n".join(lines), {r: outcomes[r][2] for r in failed})

    def close(self) -> None:
        """Destroy the process group (the processes themselves belong to mpiexec)."""
        import hwdist

        hwdist.destroy()


def rerun_under_mpiexec(argv: Sequence[str], n: int, limit: float, err: TextIO) -> Optional[int]:
    """Run ``python -m hwdist ARGV`` under ``mpiexec -n N``; its exit code, or None if no mpiexec is on PATH.

    The MPI processes write the report to this process's stdout themselves.
    ``MPIEXEC_TIMEOUT`` (seconds; MPICH and Open MPI read it) is set to
    ``limit`` unless already set.
    """
    launcher = shutil.which("mpiexec") or shutil.which("mpirun")
    if launcher is None:
        return None
    env = {**os.environ, MPIEXEC_ENV: "1"}
    env.setdefault("MPIEXEC_TIMEOUT", str(int(math.ceil(limit))))
    cmd = [launcher, "-n", str(n), sys.executable, "-m", "hwdist", *argv]
    _say(err, f"backend 'mpi' needs one MPI job; running: {' '.join(cmd[:3])} {os.path.basename(sys.executable)} -m hwdist {' '.join(argv)}")
    try:
        return subprocess.run(cmd, env=env, timeout=limit + 30).returncode
    except subprocess.TimeoutExpired:
        _say(err, f"error: mpiexec did not finish within {limit + 30:g} s; stopped it")
        return 1


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
    """The reason ``n`` ranks did not start, from a ``RankFailure``'s report, with a ``--timeout`` hint when slow."""
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
