"""Run the distributed test suite under ``mpiexec``: every MPI process is one rank.

Usage::

    mpiexec -n 3 python -m hwdist.testing.mpi_suite [pytest args, default: tests -m dist -q]

Each process initialises hwdist with ``init_dist('mpi', backend=...)`` (backend
from ``HWDIST_MPI_SUITE_BACKEND``, default ``mpi``) and runs the same pytest
session. The ``dist`` fixture then runs each check function in place on every
rank (instead of on a spawned pool) and all-gathers the outcomes over MPI, so
every rank asserts on the same per-rank results and reports the same failures.
Tests parametrized for another world size or backend are skipped, as are
tests that do not use the ``dist`` fixture (they test the harness, spawn
fresh ranks, or run locally; the normal run covers them).
Rank 0 prints pytest's report; all ranks exit with the worst exit code.

A rank that fails while the others wait in a collective cannot be killed
from here; the MPI watchdog (docs/mpi.md) aborts the job once a call has
waited longer than the process-group timeout (``HWDIST_TEST_PG_TIMEOUT``,
60 s). Bound the run with ``MPIEXEC_TIMEOUT`` (MPICH) or ``timeout`` too.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable, Optional

__all__ = ["MpiLocalPools", "main", "ENV_SUITE", "ENV_BACKEND"]

#: Set to "1" in the ranks of an MPI suite run (tests that spawn processes skip on it).
ENV_SUITE = "HWDIST_MPI_SUITE"
#: Environment that lets Open MPI's mpiexec run as root (CI containers, GPU hosts); MPICH ignores it.
MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
#: Backend the suite initialises (default 'mpi').
ENV_BACKEND = "HWDIST_MPI_SUITE_BACKEND"


def _skip(reason: str) -> None:
    import pytest

    pytest.skip(reason)


class MpiLocalPools:
    """Stand-in for the pytest plugin's ``PoolCache``: runs checks on the MPI ranks themselves."""

    def __init__(self, max_pools: int = 0) -> None:
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD
        self.size = self.comm.Get_size()
        self.backend = os.environ.get(ENV_BACKEND, "mpi")

    def run(
        self,
        fn: Callable[..., Any],
        world_size: int = 2,
        backend: Optional[str] = "gloo",
        *args: Any,
        timeout: Optional[float] = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Run ``fn`` on every MPI rank; results by rank (as the pooled harness returns them).

        ``timeout`` is accepted for the pooled harness's signature and not used: the whole run is bounded
        by ``MPIEXEC_TIMEOUT`` and the process-group timeout (module docstring).
        """
        # Same signature as pytest_plugin's pooled run (deliberate): the ``dist`` fixture hands
        # tests either one, so a test runs unchanged under the pools and under mpiexec.
        from .harness import RankFailure, is_skip

        if world_size != self.size or backend != self.backend:
            _skip(f"MPI suite runs world size {self.size} on backend {self.backend!r} only")
        try:
            outcome: tuple[str, Any, str] = ("ok", fn(*args, **kwargs), "")
        except BaseException as exc:  # report everything, as the harness does
            kind = "skip" if is_skip(exc) else "error"
            outcome = (kind, None, f"{traceback.format_exc()}\n{type(exc).__name__}: {exc}")
        outcomes = self.comm.allgather(outcome)
        failed = [r for r, o in enumerate(outcomes) if o[0] == "error"]
        if failed:
            name = getattr(fn, "__qualname__", repr(fn))
            last = outcomes[failed[0]][2].strip().splitlines()[-1]
            lines = [f"{name} failed on {self.size} MPI rank(s), backend {self.backend!r}:"]
            lines.append(f"  root cause: rank {failed[0]} error: {last}")
            lines += [f"\n===== rank {r}: error =====\n{outcomes[r][2].rstrip()}" for r in failed]
            raise RankFailure("\n".join(lines), {r: outcomes[r][2] for r in failed})
        skips = [o for o in outcomes if o[0] == "skip"]
        if skips:
            _skip(skips[0][2].strip().splitlines()[-1])
        return [o[1] for o in outcomes]

    def close(self) -> None:
        """Nothing to stop: the ranks are the MPI processes."""


class _SuitePlugin:
    """pytest hooks of the MPI suite: local pools for ``dist``, other tests skipped."""

    def pytest_configure(self, config: Any) -> None:
        from . import pytest_plugin

        pytest_plugin.PoolCache = MpiLocalPools  # type: ignore[misc,assignment]

    def pytest_collection_modifyitems(self, config: Any, items: list[Any]) -> None:
        import pytest

        mark = pytest.mark.skip(reason="does not use the `dist` fixture; not run under the MPI suite")
        for item in items:
            if "dist" not in getattr(item, "fixturenames", ()):
                item.add_marker(mark)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point for ``mpiexec -n N python -m hwdist.testing.mpi_suite [pytest args]``."""
    try:
        from mpi4py import MPI
    except ImportError:
        print("hwdist.testing.mpi_suite needs mpi4py (pip install mpi4py mpich)", file=sys.stderr)
        return 2
    comm = MPI.COMM_WORLD
    backend = os.environ.setdefault(ENV_BACKEND, "mpi")
    os.environ[ENV_SUITE] = "1"
    os.environ["HWDIST_TEST_WORLD_SIZES"] = str(comm.Get_size())
    os.environ["HWDIST_TEST_BACKENDS"] = backend
    import pytest

    import hwdist
    import hwdist.testing  # noqa: F401  (registers 'emu' for HWDIST_MPI_SUITE_BACKEND=emu)

    from hwdist import settings

    timeout = float(settings.bounded("HWDIST_TEST_PG_TIMEOUT", 0.001, 1e7, default=60, what="seconds"))
    hwdist.init_dist("mpi", backend=backend, timeout=timeout)
    args = list(sys.argv[1:] if argv is None else argv) or ["tests", "-m", "dist", "-q"]
    if comm.Get_rank() != 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
    rc = int(pytest.main([*args, "-p", "no:cacheprovider"], plugins=[_SuitePlugin()]))
    rc = comm.allreduce(rc, op=MPI.MAX)
    hwdist.destroy()
    return rc


if __name__ == "__main__":
    sys.exit(main())
