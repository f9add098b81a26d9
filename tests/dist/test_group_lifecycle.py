"""Groups over their whole life on real ranks: inherited by a forked child, destroyed by torch, made again.

* A process forked from a rank after the group exists inherits the group but not its backend's
  threads. When the child exits normally, hwdist's exit hook must leave that group alone (no
  destroy there, and no destroy by the interpreter's finalisation either): the child exits with its
  own status, the parent's group keeps working, and the parent exits 0.
* A subgroup torch destroyed (``torch.distributed.destroy_process_group(group)``) passed to any hwdist
  operation: a clear error saying the group was destroyed, from every operation, on every rank.
* The default group destroyed by torch and made again with another number of ranks: hwdist's caches
  of the old group must not outlive it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = float(os.environ.get("HWDIST_TEST_TIMEOUT", "240"))
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# ------------------------------------------------------------------ a child forked after init

#: Children each rank forks at once per run; every one of them must exit with its own status.
CHILDREN = 10

# One rank of a 2-rank gloo job joined through a file store. It forks CHILDREN children at once after the
# group exists and hwdist has used it (which registers the exit hook); each child does some work with no
# collective and leaves through the interpreter's normal exit (sys.exit) with a status of its own. The
# parent then checks its group still works and prints each child's exit status.
_RANK_PROGRAM = """
import os, sys
rank, store, init, children = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
import torch
import torch.distributed as td
import hwdist
if init == "hwdist":
    hwdist.init_backend("gloo", rank=rank, world_size=2, init_method=f"file://{store}", timeout=60)
else:
    td.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
sub = td.new_group([0, 1])  # a second group the child inherits too
t = torch.ones(2)
hwdist.all_reduce(t)
hwdist.all_gather_object({"rank": rank}, group=sub)
pids = []
for i in range(children):
    pid = os.fork()
    if pid == 0:
        x = torch.arange(8.0).sum().item() + i  # work in the child, no collective
        sys.exit(i % 3)  # the interpreter's normal exit, with the child's own status
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
t = torch.full((2,), float(rank + 1))
hwdist.all_reduce(t, group=sub)  # the parent's groups are untouched
print("rank", rank, "children", codes, "sum", t.tolist(), flush=True)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("HWDIST_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _fork_job(tmp_path: Path, init: str) -> list[subprocess.CompletedProcess]:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(_RANK_PROGRAM))
    store = tmp_path / "store"
    argv = lambda r: [sys.executable, str(script), str(r), str(store), init, str(CHILDREN)]  # noqa: E731
    procs = [
        subprocess.Popen(argv(r), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for r in range(2)
    ]  # fmt: skip
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return done


@pytest.mark.parametrize("init", ["torch", "hwdist"])
def test_a_child_forked_after_init_exits_normally_and_leaves_the_parents_group_alone(tmp_path, init):
    """Before the fix, each child's exit hook destroyed the inherited group: SIGABRT
    (``std::system_error: Invalid argument``) or a 30 s block and exit status 1, in every child."""
    runs = _fork_job(tmp_path, init)
    want = [i % 3 for i in range(CHILDREN)]
    for rank, p in enumerate(runs):
        report = f"rank {rank}: exit {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
        assert p.returncode == 0, report
        assert f"rank {rank} children {want} sum [3.0, 3.0]" in p.stdout, report
        assert "could not be torn down" not in p.stderr, report


def test_the_exit_hook_still_tears_down_the_group_of_the_process_that_made_it(tmp_path):
    """The parent's own exit is unchanged by the fork rule: its hook destroys its group."""
    script = tmp_path / "own.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, sys
        import torch
        import torch.distributed as td
        import hwdist
        rank, store = int(sys.argv[1]), sys.argv[2]
        atexit.register(lambda: print("group alive at exit:", td.is_initialized(), flush=True))
        td.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        hwdist.all_reduce(torch.ones(1))
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    """))
    argv = lambda r: [sys.executable, str(script), str(r), str(tmp_path / "store")]  # noqa: E731
    procs = [subprocess.Popen(argv(r), env=_env(), stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        # the child's line says the inherited group is still there (left alone); the parent's that its
        # own hook destroyed it (the hook registered first runs last)
        assert out.count("group alive at exit: True") == 1 and "child 0" in out, out
        assert out.rstrip().endswith("group alive at exit: False"), out
