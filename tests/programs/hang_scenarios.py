"""One rank of a hang scenario (tests/flight/test_hang_doctor.py starts one process per rank, or mpiexec).

Usage: ``python hang_scenarios.py SCENARIO BACKEND STORE_FILE`` with ``RANK``/``WORLD_SIZE`` set
(or under ``mpiexec`` with BACKEND ``mpi``). Each scenario makes the last rank misbehave; the
lines the report must name carry a ``# SITE-<name>`` marker that the test looks up.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

import hwdist
import hwdist.testing  # noqa: F401  (registers the emulated accelerator "emu")


def evaluate(seconds: float) -> None:
    """Busy in Python (not in a collective) for ``seconds``: the late rank."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)  # SITE-evaluate


def idle() -> None:
    """Where ranks that got through wait for the watchdog (the rest of a training loop)."""
    evaluate(60)


def _rank_from_env() -> int:
    for var in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def scenario_sleep(rank: int, last: int, t: torch.Tensor) -> None:
    if rank == last:
        evaluate(float(os.environ.get("HANG_SLEEP", "60")))
    hwdist.all_reduce(t)  # SITE-stuck-sleep


def scenario_csleep(rank: int, last: int, t: torch.Tensor) -> None:
    if rank == last:  # one long C call: an exception sent to this thread waits until it returns
        time.sleep(float(os.environ.get("HANG_SLEEP", "60")))  # SITE-csleep
    hwdist.all_reduce(t)  # SITE-stuck-csleep


def scenario_skip(rank: int, last: int, t: torch.Tensor) -> None:
    if rank != last:
        hwdist.all_reduce(t)  # SITE-skipped
    hwdist.all_reduce(t)  # SITE-stuck-skip
    idle()


def scenario_different(rank: int, last: int, t: torch.Tensor) -> None:
    if rank == last:
        hwdist.broadcast(t, 0)  # SITE-other
    else:
        hwdist.all_reduce(t)  # SITE-stuck-different
    idle()


def scenario_barrier(rank: int, last: int, t: torch.Tensor) -> None:
    if rank == last:
        hwdist.barrier()  # SITE-extra
    hwdist.all_reduce(t)  # SITE-stuck-barrier
    idle()


def scenario_kill(rank: int, last: int, t: torch.Tensor) -> None:
    if rank == last:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
        hwdist.all_reduce(t)  # SITE-killed
    else:
        time.sleep(2.0)
        hwdist.all_reduce(t)  # SITE-stuck-kill
    idle()


SCENARIOS = {
    "sleep": scenario_sleep,
    "csleep": scenario_csleep,
    "skip": scenario_skip,
    "different": scenario_different,
    "barrier": scenario_barrier,
    "kill": scenario_kill,
}


def _act_late(seconds: float) -> None:
    """Delay this rank's watchdog between its report and its action, as a loaded host's scheduler can.

    The other ranks then act first (raise, exit), and this rank's blocked call fails with the
    backend's lost-peer error before its own watchdog acts: the race the raise action must survive.
    """
    from hwdist.flight import watchdog

    act = watchdog.Watchdog._act

    def late(self: watchdog.Watchdog, overdue: object) -> None:
        time.sleep(seconds)
        act(self, overdue)  # type: ignore[arg-type]

    watchdog.Watchdog._act = late  # type: ignore[method-assign]


def main() -> None:
    if os.environ.get("HANG_DEBUG"):
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["HANG_DEBUG"]), exit=False)
    name, backend, store = sys.argv[1:4]
    logs = os.environ.get("HANG_LOGS")
    if logs:  # one file per rank (mpiexec mixes the ranks' stderr)
        fd = os.open(os.path.join(logs, f"rank{_rank_from_env()}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
    if backend == "mpi":
        hwdist.init_dist("mpi", backend="mpi", timeout=120)
    else:
        from hwdist.launch.core import init_backend

        rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        timeout = float(os.environ.get("HANG_PG_TIMEOUT", "120"))  # the process group's own timeout
        init_backend(
            backend, rank=rank, world_size=ws, local_rank=rank, init_method=f"file://{store}", timeout=timeout
        )
    rank, ws = hwdist.get_rank(), hwdist.get_world_size()
    late = os.environ.get("HANG_LATE_ACT")  # "RANK:SECONDS": that rank's watchdog acts late
    if late:
        who, seconds = late.split(":")
        if int(who) == rank:
            _act_late(float(seconds))
    t = torch.ones(1)
    hwdist.all_reduce(t)  # SITE-first
    hwdist.all_reduce(t)
    print(f"rank {rank}: started at {time.time()}", file=sys.stderr, flush=True)
    try:
        SCENARIOS[name](rank, ws - 1, t)
    except BaseException as exc:
        print(f"rank {rank}: RAISED {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        if name == "kill":
            raise  # an uncaught error ends the process the usual way (the exit awaits the report)
        time.sleep(float(os.environ.get("HANG_LINGER", "0")))  # alive after raising (a handler's clean-up)
        os._exit(3)
    print(f"rank {rank}: scenario returned", file=sys.stderr, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
