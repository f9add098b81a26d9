"""The flight recorder sees torch.distributed's own calls through torch's per-group hooks (torch >= 2.14).

On real gloo ranks: DDP's and raw torch.distributed collectives enter the ring with op, dtype and shape,
sequence number and call site; hwdist's own calls once; a call that fails is recorded failed; a failing
hook never breaks a collective; and the hang doctor names the missing rank on real DDP hangs (programs
in ddp_hang_programs.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist import _compat
from hwdist.flight import torch_hooks
from hwdist.testing.pytest_plugin import capture_error

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(
        not _compat.PG_HAS_HOOKS,
        reason=f"torch {torch.__version__} has no ProcessGroup.register_pre_hook (torch >= 2.14): only"
        " hwdist's own calls are recorded there",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "programs" / "ddp_hang_programs.py"
THIS = Path(__file__).name


def _line(marker: str) -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if ln.rstrip().endswith(f"# SITE-{marker}"))


def _here() -> int:
    return sys._getframe(1).f_lineno


def _since(last: object) -> list:
    """The ring's entries after ``last`` ((group, seq) of the newest one before; None: all).

    The ring is bounded: in a pool that has run many collectives it is full, so a count taken
    before would point past its end.
    """
    entries = hwdist.flight.snapshot()
    keys = [(e["group"], e["seq"]) for e in entries]
    return entries[keys.index(last) + 1:] if last in keys else entries


def _ring_sees_torch_calls() -> dict:
    hwdist.flight.enable(torch_calls=True)
    try:
        before = hwdist.flight.snapshot()
        last = (before[-1]["group"], before[-1]["seq"]) if before else None
        t = torch.ones(4)
        torch_dist.all_reduce(t)
        line_raw = _here() - 1
        hwdist.all_reduce(t)
        line_hw = _here() - 1
        sub = torch_dist.new_group([0, 1])
        torch_dist.barrier()  # a group torch made later is attached at the next call on an attached group
        torch_dist.broadcast(t, src=0, group=sub)
        line_sub = _here() - 1
        entries = _since(last)
        deadline = time.time() + 10
        while any(e["state"] == "issued" for e in entries) and time.time() < deadline:
            time.sleep(0.01)  # the end time comes from the work's future, on a backend thread
            entries = _since(last)
        return {
            "entries": [(e["group"], e["op"], e["args"], e["site"], e["state"]) for e in entries],
            "seqs": [e["seq"] for e in entries if e["group"] == "default"],
            "lines": (line_raw, line_hw, line_sub),
            "t": t.tolist(),
        }
    finally:
        hwdist.flight.enable(torch_calls=False)


def _ring_sees_torch_calls_unverified() -> dict:
    # verification off: its header round is a torch collective of its own inside hwdist's call, which the
    # group's numbering counts too (the ring's sequence numbers then skip it)
    with hwdist.verification(False):
        return _ring_sees_torch_calls()


def test_torch_calls_enter_the_ring_once_with_their_call_site(dist):
    for res in dist(_ring_sees_torch_calls_unverified, 2, "gloo"):
        raw, hw, sub = res["lines"]
        want = [
            ("default", "all_reduce", "float32[4]", f"flight/{THIS}:{raw}", "completed"),
            ("default", "all_reduce", "float32[4]", f"flight/{THIS}:{hw}", "completed"),  # hwdist's: once
            ("group[0,1]", "broadcast", "float32[4]", f"flight/{THIS}:{sub}", "completed"),
        ]
        sites = {f"flight/{THIS}:{line}" for line in (raw, hw, sub)}
        assert [e for e in res["entries"] if e[3] in sites] == want, res
        assert res["seqs"] == list(range(res["seqs"][0], res["seqs"][0] + len(res["seqs"]))), res
        assert res["t"] == [4.0] * 4  # 1 -> 2 (torch) -> 4 (hwdist)


def _failing_hook() -> dict:
    hwdist.flight.enable()
    try:
        hooks = torch_hooks.attach(hwdist.flight._recorder, None)
        assert hooks is not None

        def boom(tensors):
            raise ValueError("a summary that fails")

        torch_hooks._summary, saved = boom, torch_hooks._summary
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t = torch.ones(3) * (hwdist.get_rank() + 1)
                torch_dist.all_reduce(t)  # the hook fails: the collective must not
                before = len(hwdist.flight.snapshot())
                torch_dist.all_reduce(t)
                after = len(hwdist.flight.snapshot())
        finally:
            torch_hooks._summary = saved
        msgs = [str(w.message) for w in caught if "torch's hooks failed" in str(w.message)]
        return {"t": t.tolist(), "warnings": msgs, "on": hooks.on, "recorded_after": after - before}
    finally:
        hwdist.flight.enable(torch_calls=False)


def test_a_failing_hook_never_breaks_the_collective(dist):
    for res in dist(_failing_hook, 2, "gloo"):
        assert res["t"] == [6.0] * 3, res  # ranks hold 1 and 2: 3 after one all_reduce, 6 after two
        assert len(res["warnings"]) == 1 and "ValueError" in res["warnings"][0], res
        assert res["on"] is False and res["recorded_after"] == 0, res


def _a_torch_call_that_fails() -> dict:
    """Rank 0 alone all-reduces on a group with a 1 s timeout: gloo fails the call; rank 1 never joins."""
    from datetime import timedelta

    hwdist.flight.enable(torch_calls=True)
    try:
        sub = torch_dist.new_group([0, 1], timeout=timedelta(seconds=1))
        torch_dist.barrier()  # attaches the hooks to the group made since the last call
        out: dict = {}
        if torch_dist.get_rank() == 0:
            work = torch_dist.all_reduce(torch.ones(2), group=sub, async_op=True)
            error = capture_error(work.wait)
            out["raised"] = error[0] if error else None
            deadline = time.time() + 10
            while time.time() < deadline:  # the end comes from the work's future, on gloo's thread
                mine = [e for e in hwdist.flight.snapshot() if e["group"] == "group[0,1]"]
                if mine and mine[-1]["state"] != "issued":
                    break
                time.sleep(0.01)
            out["recorded"] = (mine[-1]["op"], mine[-1]["state"]) if mine else None
        torch_dist.barrier()
        return out
    finally:
        hwdist.flight.enable(torch_calls=False)


def test_a_torch_call_that_fails_is_recorded_failed(dist):
    r0, r1 = dist(_a_torch_call_that_fails, 2, "gloo")
    assert r0["raised"] is not None, r0  # gloo's own timeout error reached the caller
    assert r0["recorded"] == ("all_reduce", "failed"), r0
    assert r1 == {}, r1


# ---- the hang doctor on real DDP/FSDP hangs (one process per rank) ----------------------------------


def _run(scenario: str, tmp_path: Path, ws: int = 2) -> dict:
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        HWDIST_HANG_TIMEOUT="3",
        HWDIST_HANG_ACTION="abort",
        HANG_TORCH_CALLS="1",
        HWDIST_FLIGHT_DIR=str(tmp_path / "flight"),
        HANG_LOGS=str(logs),
        GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"),
        OMP_NUM_THREADS="1",
    )
    args = [sys.executable, str(PROGRAM), scenario, str(tmp_path / "store")]
    procs = [
        subprocess.Popen(
            args,
            env={**env, "RANK": str(r), "WORLD_SIZE": str(ws)},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for r in range(ws)
    ]
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
    files = {r: logs / f"rank{r}.err" for r in range(ws)}
    return {r: f.read_text() if f.exists() else "" for r, f in files.items()}


def _pending(tmp_path: Path, rank: int) -> dict:
    lines = (tmp_path / "flight" / f"flight-rank{rank}.jsonl").read_text().splitlines()[1:]
    issued = [json.loads(ln) for ln in lines if json.loads(ln).get("state") == "issued"]
    assert issued, lines[-5:]
    return issued[0]


def _check_hang(scenario: str, tmp_path: Path, stuck: int, missing: int) -> None:
    logs = _run(scenario, tmp_path)
    pending = _pending(tmp_path, stuck)
    want = f"rank {missing} never called {pending['op']} #{pending['seq']}"
    for text in logs.values():
        found = re.findall(r"^diagnosis: (.*)$", text, re.M)
        assert found and want in found[0], (want, logs)
    assert "has not completed after 3 s" in logs[stuck], logs
    out = subprocess.run(
        [sys.executable, "-m", "hwdist", "trace", str(tmp_path / "flight")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0 and want in out.stdout, out.stdout + out.stderr


def test_ddp_uneven_inputs_hang_names_the_rank_whose_data_ended(tmp_path):
    _check_hang("uneven", tmp_path, stuck=0, missing=1)
    assert f"ddp_hang_programs.py:{_line('uneven-backward')}" in _pending(tmp_path, 0)["site"]


def test_ddp_rank_that_skips_backward_is_named(tmp_path):
    _check_hang("skip_backward", tmp_path, stuck=0, missing=1)
    assert f"ddp_hang_programs.py:{_line('backward')}" in _pending(tmp_path, 0)["site"]


def test_fsdp2_rank_that_skips_a_forward_is_named(tmp_path):
    pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP")
    from torch.distributed import fsdp

    if not hasattr(fsdp, "fully_shard"):
        pytest.skip(f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard)")
    _check_hang("fsdp_skip_forward", tmp_path, stuck=0, missing=1)
    pending = _pending(tmp_path, 0)
    assert pending["op"] == "all_gather_into_tensor", pending  # FSDP2 gathers the next step's parameters
    assert f"ddp_hang_programs.py:{_line('fsdp-forward')}" in pending["site"], pending
