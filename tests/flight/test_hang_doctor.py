"""The hang doctor end to end: real ranks hang (or die) and every rank's report must say why.

Each scenario of tests/programs/hang_scenarios.py runs as separate processes (one
per rank joined through a file store, or ``mpiexec -n N`` for the MPI backend)
with ``HWDIST_HANG_TIMEOUT=2``: a late rank, a skipped collective, different
collectives, an extra barrier, a rank SIGKILLed mid-collective. The test
asserts the one-line diagnosis each rank printed (with the exact call-site
lines, read from the ``# SITE-`` markers of the scenario file), the action's
effect (exit status, or ``HangDetected`` raised on every rank) and that it all
happened within the deadline plus a few seconds. Every run has a hard timeout
and is killed on it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from hwdist.flight.watchdog import HANG_EXIT_CODE
from hwdist.testing.mpi_suite import ENV_SUITE, MPI_AS_ROOT

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "programs" / "hang_scenarios.py"
DEADLINE = 2.0
#: What a report may take beyond the deadline: the watchdog's tick, the record exchange (3 s when a rank is
#: silent), the done-barrier, a loaded 2-core CI machine.
SLACK = 15.0
HARD_TIMEOUT = 90.0
FILE = "programs/hang_scenarios.py"
SITES = {
    m.group(1): i
    for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
    if (m := re.search(r"# SITE-([\w-]+)", line))
}

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get(ENV_SUITE) == "1", reason="starts its own ranks; not run inside the mpiexec suite"
    ),
]


def _site(name: str) -> str:
    return f"{FILE}:{SITES[name]}"


def _here(name: str) -> str:
    """A ``# SITE-`` marker of this file."""
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, ln in enumerate(lines, 1) if ln.endswith(f"# SITE-{name}"))
    return f"flight/test_hang_doctor.py:{line}"


def _mpi_missing() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    return "" if shutil.which("mpiexec") else "mpiexec is not on PATH"


class Run:
    """The outcome of one scenario: per rank its exit status and stderr; the seconds it took."""

    def __init__(
        self, codes: dict[int, Optional[int]], logs: dict[int, str], started: float, ended: float
    ) -> None:
        self.codes, self.logs, self.started, self.ended = codes, logs, started, ended
        self.mpi = False

    def diagnosis(self, rank: int) -> str:
        found = re.findall(r"^diagnosis: (.*)$", self.logs[rank], re.M)
        assert found, f"rank {rank} printed no report:\n{self.logs[rank]}"
        return found[0]

    def __repr__(self) -> str:
        return "\n".join(f"--- rank {r} (exit {self.codes[r]})\n{self.logs[r]}" for r in sorted(self.logs))


def _run(scenario: str, backend: str, ws: int, action: str, tmp_path: Path, **env: str) -> Run:
    logs = tmp_path / "logs"
    logs.mkdir()
    full = dict(os.environ)
    full.update(
        PYTHONPATH=str(ROOT) + os.pathsep + full.get("PYTHONPATH", ""),
        HWDIST_HANG_TIMEOUT=str(DEADLINE),
        HWDIST_HANG_ACTION=action,
        HWDIST_FLIGHT_DIR=str(tmp_path / "flight"),
        HANG_LOGS=str(logs),
        GLOO_SOCKET_IFNAME=full.get("GLOO_SOCKET_IFNAME", "lo"),
        OMP_NUM_THREADS="1",
    )
    # the doctor is what these scenarios look at: verification would catch their mismatched calls before
    # they hang (test_verification_raises_before_the_hang)
    full["HWDIST_VERIFY"] = "0"
    full.update(env)
    full.pop(ENV_SUITE, None)
    args = [sys.executable, str(SCRIPT), scenario, backend, str(tmp_path / "store")]
    if backend == "mpi":
        full.update(MPI_AS_ROOT)
        procs = [
            subprocess.Popen(
                ["mpiexec", "-n", str(ws), *args],
                env=full,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        ]
    else:
        procs = [
            subprocess.Popen(
                args,
                env={**full, "RANK": str(r), "WORLD_SIZE": str(ws)},
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for r in range(ws)
        ]
    codes: dict[int, Optional[int]] = {}
    stop = time.time() + HARD_TIMEOUT
    try:
        for i, p in enumerate(procs):
            codes[i] = p.wait(timeout=max(1.0, stop - time.time()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    ended = time.time()
    texts = {
        r: (logs / f"rank{r}.err").read_text() if (logs / f"rank{r}.err").exists() else "" for r in range(ws)
    }
    starts = [float(m.group(1)) for t in texts.values() for m in [re.search(r"started at ([\d.]+)", t)] if m]
    assert starts, f"no rank started:\n{texts}"
    assert len(codes) == len(procs), f"the ranks did not end within {HARD_TIMEOUT} s (hard timeout):\n{texts}"
    if backend == "mpi":  # mpiexec's status: the first failing process's, or 9 for those it killed
        codes = {r: codes[0] for r in range(ws)}
    run = Run(codes, texts, max(starts), ended)
    run.mpi = backend == "mpi"
    return run


BACKENDS = ["gloo", "emu"]
WORLD_SIZES = [2, 3]
ALL = pytest.mark.parametrize(
    "backend,ws",
    [(b, n) for b in BACKENDS for n in WORLD_SIZES]
    + [
        pytest.param("mpi", n, marks=pytest.mark.skipif(bool(_mpi_missing()), reason=_mpi_missing() or "-"))
        for n in WORLD_SIZES
    ],
)


def _assert_aborted(run: Run) -> None:
    """The abort action ended every rank, each after printing its report.

    Once the first rank exits, a rank still blocked in the backend may get its error ("Connection closed by
    peer") a moment before its own exit: the scenario then ends with its status 3. Under mpiexec the job's
    status is the first process's, or 9 for those it killed.
    """
    want = {HANG_EXIT_CODE, 3} | ({9} if run.mpi else set())
    assert set(run.codes.values()) <= want, run
    assert any("HWDIST_HANG_ACTION=abort: exiting with status 75" in t for t in run.logs.values()), run


def _assert_fast(run: Run) -> None:
    took = run.ended - run.started
    assert took < DEADLINE + SLACK, (
        f"took {took:.1f} s after the ranks started (deadline {DEADLINE} s)\n{run!r}"
    )


@ALL
def test_late_rank(backend, ws, tmp_path):
    run = _run("sleep", backend, ws, "abort", tmp_path)
    last = ws - 1
    want = (
        f"rank {last} never called all_reduce #3 ({_site('stuck-sleep')});"
        f" it is in evaluate() at {_site('evaluate')}"
    )
    for r in range(ws):
        assert run.diagnosis(r) == want, run
        assert f"pending all_reduce #3 ({_site('stuck-sleep')}) float32[1]" in run.logs[r], run
        assert f"main thread in evaluate() at {_site('evaluate')}" in run.logs[r], run
        assert f"{_site('stuck-sleep')} in scenario_sleep" in run.logs[r], run  # rank 0's stack
    _assert_aborted(run)
    _assert_fast(run)
    # every rank dumped its record; `hwdist trace` merges them into the same diagnosis
    out = subprocess.run(
        [sys.executable, "-m", "hwdist", "trace", str(tmp_path / "flight")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert f"diagnosis: {want}" in out.stdout, out.stdout
    assert "| default |" in out.stdout and "| #3 |" in out.stdout, out.stdout


@ALL
def test_skipped_collective(backend, ws, tmp_path):
    run = _run("skip", backend, ws, "abort", tmp_path)
    last = ws - 1
    for r in range(ws):
        diag = run.diagnosis(r)
        assert "the ranks' calls on the default group first differ at #3" in diag, run
        assert (
            f"rank 0 all_reduce ({_site('skipped')})" in diag
            and f"rank {last} all_reduce ({_site('stuck-skip')})" in diag
        )
        assert (
            f"rank {last} never called all_reduce #4 ({_site('stuck-skip')}); it is in evaluate()" in diag
        ), run
    _assert_aborted(run)
    _assert_fast(run)


@ALL
def test_different_collectives(backend, ws, tmp_path):
    run = _run("different", backend, ws, "abort", tmp_path)
    last = ws - 1
    others = "rank 0" if ws == 2 else "ranks 0, 1"
    want = (
        f"rank {last} called broadcast #3 ({_site('other')}) where {others} called all_reduce #3"
        f" ({_site('stuck-different')})"
    )
    for r in range(ws):
        assert want in run.diagnosis(r), run
    _assert_aborted(run)
    _assert_fast(run)


@pytest.mark.parametrize("scenario", ["different", "barrier"])
def test_verification_raises_before_the_hang(scenario, tmp_path):
    """With verification on (the default) a collective that meets another on some rank raises
    CollectiveMismatch on every rank in the header round: no hang, no report."""
    run = _run(scenario, "gloo", 2, "abort", tmp_path, HWDIST_VERIFY="1")
    for r in range(2):
        assert "RAISED CollectiveMismatch" in run.logs[r], run
        assert "op: rank 0: all_reduce; rank 1: " in run.logs[r], run
        assert "hang doctor: rank" not in run.logs[r], run
    _assert_fast(run)


@ALL
def test_extra_barrier(backend, ws, tmp_path):
    run = _run("barrier", backend, ws, "abort", tmp_path)
    last = ws - 1
    others = "rank 0" if ws == 2 else "ranks 0, 1"
    want = (
        f"rank {last} called barrier #3 ({_site('extra')}) where {others} called all_reduce #3"
        f" ({_site('stuck-barrier')})"
    )
    for r in range(ws):
        assert want in run.diagnosis(r), run
    _assert_aborted(run)
    _assert_fast(run)


@ALL
def test_rank_killed_mid_collective(backend, ws, tmp_path):
    run = _run("kill", backend, ws, "abort", tmp_path)
    last = ws - 1
    _assert_fast(run)
    if backend == "mpi":  # mpiexec ends the job when a process is killed: nobody hangs, nobody reports
        assert run.codes[0] != 0, run
        return
    assert run.codes[last] == -signal.SIGKILL, run
    for r in range(last):
        diag = run.diagnosis(r)
        assert diag.startswith(f"rank {last} did not answer (dead"), run
        assert f"all_reduce #3 ({_site('stuck-kill')})" in diag, run
        assert run.codes[r] == HANG_EXIT_CODE, run
    # offline, from the dumps the others left: the killed rank "left no dump", not "did not answer"
    out = subprocess.run(
        [sys.executable, "-m", "hwdist", "trace", str(tmp_path / "flight")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert f"diagnosis: rank {last} left no dump (it died before dumping, or its file was not collected)" in (
        out.stdout
    ), out.stdout
    assert "did not answer" not in out.stdout, out.stdout


@pytest.mark.parametrize("late", ["", "0:3"], ids=["in-order", "other-rank-acts-first"])
@pytest.mark.parametrize("backend", ["gloo", "emu"])
def test_raise_action_raises_on_every_rank(backend, late, tmp_path):
    # "0:3": rank 0's watchdog acts 3 s late (a loaded host), so rank 1 raises and exits first and rank 0's
    # blocked all_reduce fails with gloo's lost-peer error before rank 0 acts: it must still raise
    # HangDetected
    ws = 2
    run = _run("sleep", backend, ws, "raise", tmp_path, HANG_LATE_ACT=late)
    want = (
        f"rank 1 never called all_reduce #3 ({_site('stuck-sleep')});"
        f" it is in evaluate() at {_site('evaluate')}"
    )
    for r in range(ws):
        # rank 1 was running Python: it raises at once, then exits; rank 0, blocked inside gloo, is released
        # by that exit (gloo's lost-peer error, which the covered call turns into HangDetected)
        assert f"rank {r}: RAISED HangDetected: {want}" in run.logs[r], run
        assert run.codes[r] == 3, run  # the scenario's own exit status after catching the exception
    assert "HangDetected" not in run.logs[0].split("RAISED HangDetected")[1], run  # raised once, not twice
    _assert_fast(run)


def test_raise_action_with_a_live_peer_in_a_long_c_call(tmp_path):
    """The late rank is in one long C call and stays alive after raising: nothing releases rank 0 early.

    gloo's ``abort()`` returns without releasing a call blocked on a live peer (torch 2.13; see
    docs/debugging-hangs.md), so rank 0 must end by the fallback: status 75 and the reason, 10 s after
    acting, never a hang. A torch whose abort does release the call makes rank 0 raise instead.
    """
    run = _run("csleep", "gloo", 2, "raise", tmp_path, HANG_SLEEP="5", HANG_LINGER="15")
    want = f"rank 1 never called all_reduce #3 ({_site('stuck-csleep')}); it is in scenario_csleep() at"
    assert want in run.diagnosis(0), run
    assert "rank 1: RAISED HangDetected: " in run.logs[1] and run.codes[1] == 3, (
        run
    )  # when its sleep returned
    if run.codes[0] == HANG_EXIT_CODE:
        assert "HWDIST_HANG_ACTION=raise (the main thread stayed blocked in the backend)" in run.logs[0], run
        assert "RAISED" not in run.logs[0], run
    else:  # the group's abort released the blocked call
        assert "rank 0: RAISED HangDetected: " in run.logs[0] and run.codes[0] == 3, run
    assert run.ended - run.started < 5 + 15 + SLACK, run  # rank 1 lingers 15 s after its 5 s sleep


def test_report_action_changes_nothing(tmp_path):
    run = _run("sleep", "gloo", 2, "report", tmp_path, HANG_SLEEP="6")
    for r in range(2):
        assert "never called all_reduce #3" in run.diagnosis(r), run
        assert f"rank {r}: scenario returned" in run.logs[r], run  # the late rank arrived; the call completed
        assert run.codes[r] == 0, run
    dumps = sorted((tmp_path / "flight").glob("flight-rank*.jsonl"))
    assert [p.name for p in dumps] == ["flight-rank0.jsonl", "flight-rank1.jsonl"]
    header, *entries = [json.loads(line) for line in dumps[0].read_text().splitlines()]
    assert header["rank"] == 0 and header["reason"] == "hang"
    mine = [e for e in entries if e["group"] == "default"]  # hwdist's; torch's own record is "torch:default"
    assert [e["seq"] for e in mine] == [1, 2, 3] and mine[-1]["state"] == "issued"


def test_sigusr1_dumps_while_blocked_in_a_collective(tmp_path):
    """SIGUSR1 while rank 0 waits inside gloo: the record is written by a thread (the main thread is in C)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        HWDIST_HANG_TIMEOUT="60",
        HWDIST_FLIGHT_DIR=str(tmp_path / "f"),
        HANG_LOGS=str(logs),
        HANG_SLEEP="8",
        GLOO_SOCKET_IFNAME="lo",
        WORLD_SIZE="2",
    )
    args = [sys.executable, str(SCRIPT), "sleep", "gloo", str(tmp_path / "store")]
    procs = [
        subprocess.Popen(args, env={**env, "RANK": str(r)}, cwd=ROOT, start_new_session=True)
        for r in range(2)
    ]
    try:
        deadline = time.time() + 60
        while "started" not in ((logs / "rank0.err").read_text() if (logs / "rank0.err").exists() else ""):
            assert time.time() < deadline, "rank 0 did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # rank 0 is now inside all_reduce #3, waiting for rank 1
        procs[0].send_signal(signal.SIGUSR1)
        dump = tmp_path / "f" / "flight-rank0.jsonl"
        while not dump.exists():
            assert time.time() < deadline, (logs / "rank0.err").read_text()
            time.sleep(0.1)
        lines = [json.loads(line) for line in dump.read_text().splitlines()]
        assert lines[0]["reason"] == "dump_flight_record" and lines[-1]["state"] == "issued"
        assert procs[0].poll() is None  # the signal did not end the rank
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


# ------------------------------------------------------------------ the recorder's entries on pooled ranks


def _record_rank() -> dict:
    import torch
    import torch.distributed as tdist

    import hwdist
    from hwdist import flight
    from hwdist.collectives import call_entry

    # the ring full first (as on pooled ranks after earlier tests): it keeps recording, the oldest entries
    # go; so the new entries are picked by start time, not by position (a full ring's length does not grow)
    ring = call_entry.recorder().size  # type: ignore[union-attr]
    one = torch.zeros(1)
    for _ in range(ring):
        hwdist.all_reduce(one)
    full = len(flight.snapshot()) == ring
    since = time.time()
    t = torch.ones(3, 2)
    hwdist.all_reduce(t)  # SITE-rec-a
    hwdist.all_reduce_dict({"a": torch.tensor(1.0)})  # SITE-rec-b
    hwdist.all_reduce(t, group=tdist.GroupMember.WORLD)  # the default group passed explicitly: same counter
    sub = hwdist.new_group(list(range(hwdist.get_world_size())))
    hwdist.broadcast(t, 0, group=sub)  # SITE-rec-c
    try:
        hwdist.all_reduce(t, op="no-such-op")  # SITE-rec-d
    except Exception as exc:  # noqa: BLE001
        failed = type(exc).__name__
    was = flight.enable(False)
    hwdist.all_reduce(t)  # not recorded
    flight.enable(was)
    entries = [e for e in flight.snapshot() if e["start"] >= since]
    return {
        "entries": entries,
        "failed": failed,
        "running": flight.watchdog_running(),
        "full": full,
        "still_full": len(flight.snapshot()) == ring,
    }


@pytest.mark.parametrize("backend", ["gloo", "emu"])
@pytest.mark.parametrize("ws", [1, 2, 3])
def test_recorder_entries(dist, ws, backend):
    for res in dist(_record_rank, ws, backend):
        assert res["full"] and res["still_full"], res
        es = res["entries"]
        assert [e["op"] for e in es] == [
            "all_reduce",
            "all_reduce_dict",
            "all_reduce",
            "broadcast",
            "all_reduce",
        ]
        default = [e for e in es if e["group"] == "default"]
        seqs = [e["seq"] for e in default]
        assert seqs == list(range(seqs[0], seqs[0] + 4)), seqs  # consecutive, explicit WORLD included
        assert [e["site"] for e in es] == [
            _here("rec-a"),
            _here("rec-b"),
            es[2]["site"],
            _here("rec-c"),
            _here("rec-d"),
        ]
        assert es[2]["site"].startswith("flight/test_hang_doctor.py:")
        assert (
            es[0]["args"] == "float32[3, 2]" and es[0]["state"] == "completed" and es[0]["backend"] == backend
        )
        assert es[1]["args"] == "dict[1]"
        sub = es[3]
        assert sub["group"] == f"group[{','.join(map(str, range(ws)))}]" and sub["seq"] == 1, sub
        assert sub["group_ranks"] == list(range(ws))
        assert es[4]["state"] == "failed" and es[4]["error"].startswith(res["failed"]), es[4]
        assert all(e["end"] >= e["start"] for e in es)
        assert res["running"]  # the first collective started the watchdog (HWDIST_HANG_TIMEOUT default 300)


def _numbers_after_state_dropped() -> dict:
    import time

    import torch
    import torch.distributed as tdist

    import hwdist
    from hwdist import flight, registry

    t = torch.ones(2)
    hwdist.all_reduce(t)
    registry.forget_groups()  # what hwdist.destroy and the exit hook do first; here the group lives on
    since = time.time()
    hwdist.all_reduce(t)
    hwdist.all_reduce(t, group=tdist.GroupMember.WORLD)  # the default group passed explicitly
    hwdist.all_reduce(t)
    entries = [e for e in flight.snapshot() if e["start"] >= since]
    return {"seqs": [e["seq"] for e in entries], "groups": [e["group"] for e in entries]}


@pytest.mark.parametrize("backend", ["gloo", "emu"])
def test_the_default_group_keeps_one_counter_after_hwdist_drops_its_state(dist, backend):
    for res in dist(_numbers_after_state_dropped, 2, backend):
        assert res["groups"] == ["default"] * 3, res
        assert res["seqs"] == [1, 2, 3], res  # one counter, restarted with the state, for None and WORLD


def _numbered_mismatch_rank() -> dict:
    import torch
    import torch.distributed as tdist

    import hwdist
    from hwdist import flight
    from hwdist.collectives import verify

    with verify.verification():
        sub = tdist.new_group(list(range(hwdist.get_world_size())))  # a group both count from its start
        hwdist.all_reduce(torch.ones(1), group=sub)
        hwdist.broadcast(torch.ones(1), 0, group=sub)
        try:
            hwdist.all_reduce(torch.ones(1 + (hwdist.get_rank() == 1)), group=sub)
            msg = None
        except verify.CollectiveMismatch as exc:
            msg = str(exc)
    hwdist.barrier()
    label = f"group[{','.join(map(str, range(hwdist.get_world_size())))}]"
    mine = [e for e in flight.snapshot() if e["group"] == label]
    return {"msg": msg, "seqs": [e["seq"] for e in mine[-3:]], "state": mine[-1]["state"]}


@pytest.mark.parametrize("backend", ["gloo", "emu"])
@pytest.mark.parametrize("ws", [2, 3])
def test_verification_and_the_recorder_number_calls_alike(dist, ws, backend):
    # both count a group's calls from 1: the mismatch is call #3 in the error and in the flight record
    for res in dist(_numbered_mismatch_rank, ws, backend):
        assert res["msg"] is not None and res["state"] == "failed", res
        assert "collective mismatch in 'all_reduce' (call #3 on this group)" in res["msg"], res
        assert res["seqs"] == [1, 2, 3], res


def _dump_to_a_file_name(folder: str) -> dict:
    import torch

    import hwdist

    hwdist.all_reduce(torch.ones(2))
    first = hwdist.dump_flight_record(os.path.join(folder, "a", "run7.jsonl"))
    hwdist.barrier()
    again = hwdist.dump_flight_record(os.path.join(folder, "a", "run7.jsonl"))  # the first files exist now
    return {"first": first, "again": again, "rank": hwdist.get_rank()}


@pytest.mark.parametrize("ws", [1, 2])
def test_a_jsonl_dump_path_gives_one_file_per_rank_and_never_overwrites(dist, ws, tmp_path):
    (tmp_path / "a").mkdir()
    existing = tmp_path / "a" / "run7.jsonl"
    existing.write_text("the user's own file\n")
    results = dist(_dump_to_a_file_name, ws, "gloo", str(tmp_path))
    for res in results:
        r = res["rank"]
        name = "run7.1.jsonl" if ws == 1 else f"run7-rank{r}.jsonl"
        again = "run7.2.jsonl" if ws == 1 else f"run7-rank{r}.1.jsonl"
        assert res["first"] == str(tmp_path / "a" / name), res
        assert res["again"] == str(tmp_path / "a" / again), res
        for path in (res["first"], res["again"]):
            header = json.loads(Path(path).read_text().splitlines()[0])
            assert header["rank"] == r and header["world_size"] == ws, header
    assert existing.read_text() == "the user's own file\n"
