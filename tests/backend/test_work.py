"""The Work the hwdist backend returns, and what its callers see when a rank hangs or dies.

A Work whose finish fails completes with the exception (never a Work that does not complete); a DDP
rank that skips an all_reduce through the backend is named by hwdist's watchdog (rank, op, sequence
number) within ``HWDIST_HANG_TIMEOUT`` + 5 s; a rank that dies makes the others raise within seconds.
The multi-rank cases start one process per rank (tests/backend/_hang_program.py).
"""

from __future__ import annotations

import json
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

NEED = ".".join(map(str, _compat.PYTHON_BACKENDS_TORCH))
pytestmark = [
    pytest.mark.skipif(not _compat.PYTHON_BACKENDS, reason=f"needs torch >= {NEED} (Python backends)"),
    pytest.mark.timeout(240),
]
ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("_hang_program.py")
TIMEOUT = 3


def test_a_failing_finish_completes_the_work_with_its_exception():
    from hwdist.backend import _work

    def boom() -> None:
        raise ValueError("copy back failed")

    inner = _work.done([torch.ones(1)])
    work = _work.then([inner], boom, "result")
    assert work.is_completed() and not work.is_success()
    assert isinstance(work.exception(), ValueError)
    with pytest.raises(ValueError, match="copy back failed"):
        work.wait()
    failed = _work.then([_work.failed(RuntimeError("peer gone"))], lambda: None, None)
    with pytest.raises(RuntimeError, match="peer gone"):
        failed.get_future().wait()
    assert _work.then([], lambda: None, 7).get_future().wait() == 7


def test_the_finish_runs_once_on_the_waiting_thread_unless_the_future_is_asked_for():
    import threading

    from hwdist.backend import _work

    wrapped = torch.futures.Future()
    ran: list = []
    work = _work.then([_work.FutureWork(wrapped)], lambda: ran.append(threading.get_ident()), "result")
    assert not work.is_completed()
    wrapped.set_result(None)  # the wrapped call is done: nothing was queued on its thread
    assert ran == []
    assert work.wait() and ran == [threading.get_ident()]
    assert work.wait() and work.is_success() and len(ran) == 1  # once
    asked = torch.futures.Future()
    chained = _work.then([_work.FutureWork(asked)], lambda: ran.append("future"), 7)
    fut = chained.get_future()
    assert not fut.done()
    asked.set_result(None)  # completes the future asked for, through its callback
    assert fut.wait() == 7 and ran[-1] == "future" and chained.is_completed()


def _run(scenario: str, tmp_path: Path, ws: int = 2) -> dict[int, str]:
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        HWDIST_HANG_TIMEOUT=str(TIMEOUT),
        HWDIST_HANG_ACTION="abort",
        HWDIST_FLIGHT_DIR=str(tmp_path / "flight"),
        GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"),
        OMP_NUM_THREADS="1",
        HANG_IDLE="40",
    )
    args = [sys.executable, str(PROGRAM), scenario, str(tmp_path / "store")]
    procs = []
    for r in range(ws):
        with open(logs / f"rank{r}.err", "w") as err:
            procs.append(
                subprocess.Popen(
                    args,
                    env={**env, "RANK": str(r), "WORLD_SIZE": str(ws)},
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                )
            )
    stop = time.time() + 150
    try:
        for p in procs:
            p.wait(timeout=max(1.0, stop - time.time()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return {r: (logs / f"rank{r}.err").read_text() for r in range(ws)}


def test_ddp_hang_through_the_backend_is_named_within_the_timeout(tmp_path):
    logs = _run("skip", tmp_path)
    lines = (tmp_path / "flight" / "flight-rank0.jsonl").read_text().splitlines()
    header, entries = json.loads(lines[0]), [json.loads(ln) for ln in lines[1:]]
    pending = [e for e in entries if e["state"] == "issued"]
    assert pending and pending[0]["op"] == "all_reduce", entries[-4:]
    assert pending[0]["backend"] == "hwdist:gloo", pending[0]  # the wrapped backend, named
    want = f"rank 1 never called all_reduce #{pending[0]['seq']}"
    for text in logs.values():
        found = re.findall(r"^diagnosis: (.*)$", text, re.M)
        assert found and want in found[0], (want, logs)
    assert f"{PROGRAM.name}:" in pending[0]["site"], pending[0]  # the user's backward line
    waited = header["time"] - pending[0]["start"]
    assert waited <= TIMEOUT + 5, (waited, header)
    assert not any("is being deprecated" in text for text in logs.values()), logs


def test_a_rank_that_dies_makes_the_others_raise_within_seconds(tmp_path):
    logs = _run("die", tmp_path)
    started = float(re.search(r"rank 0: started at ([0-9.]+)", logs[0]).group(1))
    raised = re.search(r"rank 0: RAISED (\w+) at ([0-9.]+)", logs[0])
    assert raised is not None, logs
    assert float(raised.group(2)) - started < 30, logs[0]
    # the recorder saw the failure (asked of the Work without torch's deprecated is_success/exception, which
    # print a warning in every process that calls them)
    assert "rank 0: RECORDED all_reduce failed" in logs[0], logs[0]
    assert not any("is being deprecated" in text for text in logs.values()), logs
