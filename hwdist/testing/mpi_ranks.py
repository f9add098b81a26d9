"""The processes of one ``mpiexec`` job as ranks, with the ``RankPool`` interface ``hwdist check``/``bench``
use.

Under ``mpiexec -n N`` (Open MPI's ``OMPI_COMM_WORLD_SIZE``, MPICH/Intel
MPI's ``PMI_SIZE``, MVAPICH's ``MV2_COMM_WORLD_SIZE``) nothing is spawned:
every process initialises the backend through the ``mpi`` launcher, runs each
function in place, and the outcomes are exchanged over mpi4py, so every
process sees every rank's result (or the same [`RankFailure`][hwdist.testing.harness.RankFailure]).
[`rerun`][hwdist.testing.mpi_ranks.rerun] starts such a job for a backend whose driver requires it.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import traceback
from typing import Any, Callable, Optional, Sequence, TextIO

from .harness import RankFailure

__all__ = ["LAUNCHER", "RERUN_ENV", "JobRanks", "job_size", "job_ranks", "rerun"]

#: The launcher name (``Driver.required_launcher``) this module can start and join.
LAUNCHER = "mpi"
#: Set in the processes [`rerun`][hwdist.testing.mpi_ranks.rerun] starts (they must not start mpiexec again).
RERUN_ENV = "HWDIST_CLI_UNDER_MPIEXEC"


def job_size() -> Optional[int]:
    """The size of the MPI job this process belongs to (from its launcher's variables), or None."""
    from ..launch.mpi import SIZE_VARS

    for var in SIZE_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return None


class JobRanks:
    """The job's processes as the ranks of ``backend`` (a stuck collective is bounded by the
    process-group timeout and ``MPIEXEC_TIMEOUT``, not by a watchdog)."""

    broken = False

    def __init__(self, backend: str, timeout: float) -> None:
        from mpi4py import MPI

        import hwdist

        self.comm = MPI.COMM_WORLD
        self.rank: int = self.comm.Get_rank()
        self.world_size: int = self.comm.Get_size()
        self.backend = backend
        try:
            hwdist.init_dist(LAUNCHER, backend=backend, timeout=timeout)
            outcome: tuple[str, Any, str] = ("ready", None, "")
        except Exception as exc:
            outcome = ("init_error", None, f"{traceback.format_exc()}\n{type(exc).__name__}: {exc}")
        self._check(self.comm.allgather(outcome), "start-up")

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` here (on every process of the job); every rank's result, by rank."""
        try:
            outcome: tuple[str, Any, str] = ("ok", fn(*args, **kwargs), "")
        except BaseException as exc:  # report everything, as RankPool does
            outcome = ("error", None, f"{traceback.format_exc()}\n{type(exc).__name__}: {exc}")
        return self._check(self.comm.allgather(outcome), getattr(fn, "__qualname__", repr(fn)))

    def _check(self, outcomes: list[tuple[str, Any, str]], what: str) -> list[Any]:
        failed = [r for r, o in enumerate(outcomes) if o[0] not in ("ok", "ready")]
        if not failed:
            return [o[1] for o in outcomes]
        root = failed[0]
        last = [ln for ln in outcomes[root][2].strip().splitlines() if ln.strip()][-1:] or ["(no message)"]
        lines = [f"{what} failed on {self.world_size} rank(s) of the mpiexec job, backend {self.backend!r}:"]
        lines.append(f"  root cause: rank {root} {outcomes[root][0]}: {last[0].strip()}")
        lines += [f"\n===== rank {r}: {outcomes[r][0]} =====\n{outcomes[r][2].rstrip()}" for r in failed]
        raise RankFailure("\n".join(lines), {r: outcomes[r][2] for r in failed})

    def close(self) -> None:
        """Destroy the process group (the processes themselves belong to mpiexec)."""
        import hwdist

        hwdist.destroy()


def job_ranks(
    nproc: Optional[int], backend: str, timeout: float, err: TextIO
) -> tuple[Callable[[], JobRanks], int]:
    """``(factory of JobRanks, job size)`` for a process of an MPI job.

    Raises:
        ValueError: mpi4py is missing, or ``nproc`` is not the job's size.
    """
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError("under mpiexec, hwdist check/bench needs mpi4py. Fix: pip install mpi4py") from None
    size = MPI.COMM_WORLD.Get_size()
    if nproc is not None and nproc != size:
        raise ValueError(f"-n {nproc} under an MPI job of {size} process(es); expected -n {size} or no -n")

    def make() -> JobRanks:
        if MPI.COMM_WORLD.Get_rank() == 0:
            err.write(f"hwdist: the {size} MPI process(es) are the ranks; starting backend '{backend}'...\n")
            err.flush()
        return JobRanks(backend, timeout)

    return make, size


def rerun(argv: Sequence[str], n: int, limit: float, err: TextIO) -> int:
    """Run ``python -m hwdist ARGV`` under ``mpiexec -n N``; its exit code.

    The job's processes write the report to this process's stdout themselves.
    ``MPIEXEC_TIMEOUT`` (seconds; MPICH and Open MPI read it) is set to
    ``limit`` unless already set.

    Raises:
        ValueError: no mpiexec/mpirun on PATH, or this process was itself started by
            [`rerun`][hwdist.testing.mpi_ranks.rerun].
    """
    if os.environ.get(RERUN_ENV):
        raise ValueError(
            "started under mpiexec by hwdist, but no MPI rank variables are set (PMI_SIZE,"
            " OMPI_COMM_WORLD_SIZE)"
        )
    launcher = shutil.which("mpiexec") or shutil.which("mpirun")
    if launcher is None:
        raise ValueError(
            "this backend needs every rank started by one MPI job, and no mpiexec/mpirun is on PATH."
            f" Fix: install an MPI (pip install mpich) or run: mpiexec -n {n} hwdist {' '.join(argv)}"
        )
    env = {**os.environ, RERUN_ENV: "1"}
    env.setdefault("MPIEXEC_TIMEOUT", str(int(math.ceil(limit))))
    cmd = [launcher, "-n", str(n), sys.executable, "-m", "hwdist", *argv]
    err.write(
        f"hwdist: this backend needs one MPI job; running: {launcher} -n {n}"
        f" {os.path.basename(sys.executable)} -m hwdist {' '.join(argv)}\n"
    )
    err.flush()
    try:
        return subprocess.run(cmd, env=env, timeout=limit + 30).returncode
    except subprocess.TimeoutExpired:
        prefix = f"hwdist {argv[0]}" if argv else "hwdist"  # the command's own error form
        err.write(f"{prefix}: error: mpiexec did not finish within {limit + 30:g} s; stopped it\n")
        return 1
