"""The harness itself: results come back, failures are reported with every rank's story.

At the end, its security defaults: a private pool directory, loopback-only sockets between the
ranks, private directories from ``create_tmpdir``.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import torch

import hwdist
from hwdist.testing import RankFailure, RankPool, run_distributed
from hwdist.testing.pytest_plugin import one_backend, world_sizes

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _rank_and_sum() -> tuple[int, int, float]:
    t = torch.tensor([float(hwdist.get_rank() + 1)], device=hwdist.get_comm_device())
    torch.distributed.all_reduce(t)
    return hwdist.get_rank(), hwdist.get_world_size(), t.item()


def _raise_on_rank1() -> None:
    if hwdist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    t = torch.ones(1)
    torch.distributed.all_reduce(t)  # the others block here until killed


def _kill_rank1() -> None:
    if hwdist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    torch.distributed.all_reduce(torch.ones(1))


def _sleep_forever_on_rank0() -> None:
    if hwdist.get_rank() == 0:
        time.sleep(3600)


def _skip_everywhere() -> None:
    pytest.skip("nothing to do here")


@pytest.mark.parametrize("backend", one_backend())
@pytest.mark.parametrize("world_size", world_sizes())
def test_results_come_back_in_rank_order(dist, world_size, backend):
    results = dist(_rank_and_sum, world_size, backend)
    expected_sum = world_size * (world_size + 1) / 2
    assert results == [(r, world_size, expected_sum) for r in range(world_size)]


def test_a_raising_rank_is_the_root_cause_and_others_are_killed_fast():
    # Timed from a started pool: importing a CUDA build of torch takes 10+ s on a loaded 2-core machine.
    with RankPool(3, "gloo", pg_timeout=600) as pool, pytest.raises(RankFailure) as info:
        start = time.monotonic()
        pool.run(_raise_on_rank1)
    elapsed = time.monotonic() - start
    text = str(info.value)
    assert "root cause: rank 1 error: ValueError: boom on rank 1" in text
    assert "hung ranks: 0, 2" in text
    assert "Traceback" in text
    assert elapsed < 30, f"failure took {elapsed:.1f}s to surface"


def test_a_killed_rank_is_named_first():
    with pytest.raises(RankFailure) as info:
        run_distributed(_kill_rank1, 2, "gloo", pg_timeout=600)
    assert "root cause: rank 1 died: died: killed by signal SIGKILL" in str(info.value)


def test_a_hung_rank_is_named_with_its_stack():
    with RankPool(2, "gloo") as pool, pytest.raises(RankFailure) as info:  # start-up is not part of the 5 s
        pool.run(_sleep_forever_on_rank0, timeout=5)
    text = str(info.value)
    assert "hung ranks: 0 (timed out after 5s)" in text
    assert "_sleep_forever_on_rank0" in text  # faulthandler's stack of the hung rank


def test_skip_in_a_rank_skips_the_test():
    with pytest.raises(pytest.skip.Exception, match="nothing to do here") as info:
        run_distributed(_skip_everywhere, 2, "gloo")
    assert str(info.value) == "nothing to do here"  # the reason as the rank gave it


def test_skip_in_a_rank_is_reported_at_the_ranks_line():
    # pytest reports a skip at the innermost frame of its traceback (``SKIPPED [1] FILE:LINE: reason``)
    with pytest.raises(pytest.skip.Exception) as info:
        run_distributed(_skip_everywhere, 2, "gloo")
    crash = info.traceback[-1]
    line = _skip_everywhere.__code__.co_firstlineno + 1  # the pytest.skip(...) line
    assert (str(crash.path), crash.lineno + 1) == (__file__, line), info.getrepr()
    assert "pytest.skip(" in str(crash.statement)


def test_pool_is_reused_and_refuses_work_after_a_failure():
    with RankPool(2, "gloo") as pool:
        first = pool.run(os.getpid)
        assert pool.run(os.getpid) == first  # same processes
        with pytest.raises(RankFailure):
            pool.run(_raise_on_rank1)
        with pytest.raises(RuntimeError, match="broken"):
            pool.run(os.getpid)


class _OneDeviceDriver(hwdist.Driver):
    """A CPU driver that, like NCCL, runs one rank per device and sees one device."""

    device_type = "cpu"
    ranks_per_device = 1
    torch_backend = "gloo"


def test_more_ranks_than_devices_is_a_skip_with_the_reason_before_any_spawn():
    hwdist.register_backend("onedev", _OneDeviceDriver, override=True)
    try:
        with pytest.raises(
            pytest.skip.Exception, match=r"at most 1 rank\(s\) per cpu device: 2 local ranks need 2"
        ):
            RankPool(2, "onedev")
        from hwdist.testing.harness import _too_few_devices

        assert _too_few_devices(1, "onedev") is None
        assert _too_few_devices(3, "gloo") is None  # gloo: any number of ranks share the CPU
    finally:
        hwdist.unregister_backend("onedev")


UNGUARDED = """
import torch
import hwdist
from hwdist.testing import run_distributed


def check_sum() -> float:
    t = torch.tensor([float(hwdist.get_rank() + 1)])
    hwdist.all_reduce(t)
    return t.item()


print(run_distributed(check_sum, 2, "gloo", timeout=60))
"""


def test_a_script_without_the_main_guard_is_told_about_it(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert proc.returncode != 0
    last = [ln for ln in proc.stderr.splitlines() if "outside `if __name__" in ln]
    assert last, proc.stderr[-3000:]
    assert "(unguarded.py, line 13)" in proc.stderr  # the parent names the script's line
    assert "HINT: put the call under the guard" in last[-1]


def test_a_guarded_call_is_not_taken_for_an_unguarded_one(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(UNGUARDED.replace("\nprint(", '\nif __name__ == "__main__":\n    print('))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[3.0, 3.0]"


# ---------------------------------------------------------------------------
# security defaults: private directories, loopback only
# ---------------------------------------------------------------------------


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_harness_directory_is_private(rank_pools):
    pool = rank_pools.get(2, "gloo")
    assert _mode(pool._dir) == 0o700


def _sockets_and_dirs(base: str) -> dict:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[9] in inodes:
                addresses.append(cols[1].split(":")[0])  # local address, hex
    made = hwdist.create_tmpdir()
    given = hwdist.create_tmpdir(tmpdir=os.path.join(base, "given"))
    modes = [_mode(made), _mode(given)]
    hwdist.barrier()
    if hwdist.get_rank() == 0:
        os.rmdir(made)
    return {"addresses": addresses, "modes": modes}


@pytest.mark.skipif(not os.path.isdir("/proc/self/net"), reason="needs /proc/net (Linux)")
def test_harness_ranks_use_loopback_only_and_dirs_are_private(dist, tmp_path):
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    for r in dist(_sockets_and_dirs, 2, "gloo", str(tmp_path)):
        assert r["addresses"], "no TCP socket found for the gloo pairs"
        assert set(r["addresses"]) <= loopback, r["addresses"]
        assert r["modes"] == [0o700, 0o700]


def _environment() -> tuple[Optional[str], Optional[str], int, bool]:
    return (
        os.environ.get("HWDIST_TEST_LATE"), os.environ.get("HWDIST_TEST_GONE"), torch.get_num_threads(),
        "torch" in sys.modules,
    )


def test_each_pool_starts_with_the_callers_environment_of_that_moment(monkeypatch):
    """Ranks come from a forkserver started by the first pool, whose own environment is older: a
    variable set after it started is seen, one removed since is gone, OMP_NUM_THREADS is applied."""
    monkeypatch.setenv("HWDIST_TEST_GONE", "present when the first pool starts")
    with RankPool(2, None) as pool:
        first = pool.run(_environment)
    assert all(r[1] == "present when the first pool starts" and r[3] for r in first), first
    monkeypatch.delenv("HWDIST_TEST_GONE")
    monkeypatch.setenv("HWDIST_TEST_LATE", "set later")
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if first[0][2] != 1 else "2")
    want = int(os.environ["OMP_NUM_THREADS"])
    with RankPool(2, None) as pool:
        later = pool.run(_environment)
    assert later == [("set later", None, want, True)] * 2, later


def _write_to_fd_1(text: str) -> None:
    os.write(1, text.encode())


def test_ranks_write_to_the_callers_descriptors_of_that_moment(tmp_path):
    """A rank's descriptors 1 and 2 are the caller's when the pool starts, not those of the forkserver
    (started by an earlier pool, with descriptor 1 pointing elsewhere)."""
    with RankPool(2, None) as pool:
        pool.run(_write_to_fd_1, "")
    target = tmp_path / "stdout.txt"
    saved = os.dup(1)
    try:
        with open(target, "w") as f:
            os.dup2(f.fileno(), 1)
            with RankPool(2, None) as pool:
                pool.run(_write_to_fd_1, "a rank writes to descriptor 1\n")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert target.read_text().count("a rank writes to descriptor 1") == 2, target.read_text()
