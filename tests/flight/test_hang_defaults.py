"""The hang doctor with its defaults, on real DDP ranks: a hang ends the job and blames the right rank.

One process per rank (programs in ddp_hang_programs.py): hwdist is imported before
``init_process_group`` and nothing else is set but a short ``HWDIST_HANG_TIMEOUT``. The test polls
the ranks' stderr to time the first report and the processes' exits: every process must have exited
within 10 s of the first report, the action being the default one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hwdist import _compat
from hwdist.flight.watchdog import HANG_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "programs" / "ddp_hang_programs.py"
FILE = "programs/ddp_hang_programs.py"
HARD_TIMEOUT = 150.0
#: The promise: every process of the job has exited within this many seconds of the first report.
EXIT_AFTER_REPORT = 10.0
POLL = 0.1

pytestmark = [pytest.mark.dist, pytest.mark.slow]
needs_torch_fr = pytest.mark.skipif(
    not _compat.TORCH_FR,
    reason=f"torch {torch.__version__} has no flight recorder of its own (_dump_fr_trace_json; 2.13 has one)",
)


def _line(marker: str) -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if ln.rstrip().endswith(f"# SITE-{marker}"))


class Job:
    def __init__(self, logs: dict[int, str], codes: dict[int, int], reported: float, exited: float) -> None:
        self.logs, self.codes, self.reported, self.exited = logs, codes, reported, exited

    def diagnosis(self, rank: int) -> str:
        found = re.findall(r"^diagnosis: (.*)$", self.logs[rank], re.M)
        assert found, f"rank {rank} printed no report:\n{self.logs[rank]}"
        return found[0]

    def _sorted(self) -> list[tuple[int, str]]:
        return sorted(self.logs.items())

    def __repr__(self) -> str:
        return "\n".join(f"--- rank {r} (exit {self.codes.get(r)})\n{t}" for r, t in self._sorted())


def _run(scenario: str, tmp_path: Path, ws: int = 2, **extra: str) -> Job:
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWDIST_HANG_")}
    env.update(
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        HWDIST_HANG_TIMEOUT="3",
        HWDIST_FLIGHT_DIR=str(tmp_path / "flight"),
        HANG_LOGS=str(logs),
        GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"),
        OMP_NUM_THREADS="1",
        **extra,
    )
    args = [sys.executable, str(PROGRAM), scenario, str(tmp_path / "store")]
    procs = {
        r: subprocess.Popen(
            args,
            env={**env, "RANK": str(r), "WORLD_SIZE": str(ws)},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for r in range(ws)
    }
    files = {r: logs / f"rank{r}.err" for r in range(ws)}
    reported, exits = float("inf"), {}
    stop = time.time() + HARD_TIMEOUT
    try:
        while len(exits) < ws and time.time() < stop:
            now = time.time()
            if reported == float("inf") and any(
                f.exists() and "hwdist hang doctor: rank" in f.read_text() for f in files.values()
            ):
                reported = now
            for r, p in procs.items():
                if r not in exits and p.poll() is not None:
                    exits[r] = now
            time.sleep(POLL)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    texts = {r: f.read_text() if f.exists() else "" for r, f in files.items()}
    codes = {r: p.returncode for r, p in procs.items()}
    job = Job(texts, codes, reported, max(exits.values()) if len(exits) == ws else float("inf"))
    assert len(exits) == ws, f"the job did not end within {HARD_TIMEOUT} s:\n{job!r}"
    return job


def _assert_ended_by_the_report(job: Job) -> None:
    assert job.reported < float("inf"), job
    took = job.exited - job.reported
    assert took <= EXIT_AFTER_REPORT + 2 * POLL, f"exited {took:.1f} s after the first report\n{job!r}"
    for r, code in job.codes.items():
        # HangDetected uncaught (status 1), or ended by the watchdog when blocked in the backend (75)
        assert code in (1, HANG_EXIT_CODE), job
        assert "HangDetected" in job.logs[r] or f"exiting with status {HANG_EXIT_CODE}" in job.logs[r], job


def _fsdp2() -> str:
    from torch.distributed import fsdp

    return "" if hasattr(fsdp, "fully_shard") else f"torch {torch.__version__} has no FSDP2 (fully_shard)"


@needs_torch_fr
@pytest.mark.parametrize(
    "scenario,op",
    [
        ("skip_backward", "all_reduce"),
        ("uneven", "all_reduce"),
        pytest.param(
            "fsdp_skip_forward", "all_gather",
            marks=pytest.mark.skipif(bool(_fsdp2()), reason=_fsdp2() or "-"),
        ),
    ],
)
def test_a_loop_that_never_calls_hwdist_is_watched_and_ended(scenario, op, tmp_path):
    """Nothing but the import and a short timeout: torch's recorder names the rank that is missing."""
    job = _run(scenario, tmp_path)
    for r in range(2):
        diag = job.diagnosis(r)
        assert re.search(rf"rank 1 never called {op}\w* #\d+ \(torch\); it is in idle\(\)", diag), job
    assert "has not completed after 3 s" in job.logs[0], job
    _assert_ended_by_the_report(job)
    # offline, from the dumps: torch's entries are in them, and the same diagnosis comes out
    out = subprocess.run(
        [sys.executable, "-m", "hwdist", "trace", str(tmp_path / "flight")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0 and f"diagnosis: {job.diagnosis(0)}" in out.stdout, out.stdout + out.stderr


@needs_torch_fr
def test_a_rank_waiting_in_ddp_is_not_blamed_for_a_hwdist_call(tmp_path):
    """Rank 1 skips a step's backward and waits in hwdist's metrics call; rank 0 waits in DDP's backward."""
    job = _run("skip_step_metrics", tmp_path)
    metrics, backward = f"{FILE}:{_line('metrics')}", f"{FILE}:{_line('metrics-backward')}"
    for r in range(2):
        diag = job.diagnosis(r)
        assert "never called" not in diag, job
        want = f"rank 0 has not called all_reduce_dict #3 ({metrics}): it waits in torch's all_reduce #"
        assert want in diag, job
        assert f"main thread in skip_step_metrics() at {backward}" in diag, job
    _assert_ended_by_the_report(job)


def test_where_torch_collectives_are_invisible_the_report_says_so(tmp_path):
    """torch's recorder off (TORCH_FR_BUFFER_SIZE=0, or a torch without one): no rank is blamed."""
    job = _run("skip_step_metrics", tmp_path, TORCH_FR_BUFFER_SIZE="0")
    metrics, backward = f"{FILE}:{_line('metrics')}", f"{FILE}:{_line('metrics-backward')}"
    for r in range(2):
        diag = job.diagnosis(r)
        assert "never called" not in diag, job
        assert (
            f"rank 0 has not called all_reduce_dict #3 ({metrics}); its main thread is in skip_step_metrics()"
            f" at {backward}, outside any hwdist call, and torch.distributed's own collectives"
            f" (DDP's, FSDP's) are not visible on this rank (torch {torch.__version__.split('+')[0]})"
        ) in diag, job
    _assert_ended_by_the_report(job)


def _torch_makes_the_default_group(store: str) -> dict:
    import torch.distributed as tdist

    from hwdist import flight
    from hwdist.flight import torch_hooks

    before = flight.watchdog_running()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        attached = torch_hooks.attached_groups()
        return {"before": before, "after": flight.watchdog_running(), "attached": attached}
    finally:
        tdist.destroy_process_group()


def test_the_watchdog_starts_with_a_default_group_torch_makes(tmp_path):
    """hwdist imported first, then torch's own init_process_group, and no hwdist call at all."""
    from hwdist.testing import run_distributed

    results = run_distributed(
        _torch_makes_the_default_group, 2, None, str(tmp_path / "store"), env={"HWDIST_FLIGHT_TORCH": "1"}
    )
    for res in results:
        assert res["before"] is False and res["after"] is True, res
        # DDP's first collective is recorded through the hooks where torch has them (2.14+)
        assert res["attached"] == (["default"] if _compat.PG_HAS_HOOKS else []), res
