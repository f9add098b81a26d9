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
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import hwdist
from hwdist.testing import RankPool

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]
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


# ------------------------------------------------------------------ groups torch destroyed


@pytest.fixture(scope="module")
def ranks():
    """``run(fn, *args, world=2)``: ``fn`` on live ranks without a process group (each ``fn`` makes its
    own and destroys it), kept between tests; a broken pool is replaced."""
    pools: dict[int, RankPool] = {}

    def run(fn, *args, world: int = 2):
        pool = pools.get(world)
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
            pool = pools[world] = RankPool(world, None, timeout=TIMEOUT, pg_timeout=60)
        return pool.run(fn, *args)

    yield run
    for pool in pools.values():
        pool.close()


def _init(store: str, world: int = 0) -> None:
    rank = int(os.environ["RANK"])
    world = world or int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _error(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 (the type and text are the result)
        return type(exc).__name__, str(exc)
    return None


def _every_op(group, me: int, n: int) -> dict:
    """Every public hwdist operation on ``group``: ``{op: (error type, message) or None}``."""
    t = lambda: torch.ones(2)  # noqa: E731
    each = lambda: [t() for _ in range(n)]  # noqa: E731
    calls = {
        "all_reduce": lambda: hwdist.all_reduce(t(), group=group),
        "reduce": lambda: hwdist.reduce(t(), dst=0, group=group),
        "broadcast": lambda: hwdist.broadcast(t(), src=0, group=group),
        "all_gather": lambda: hwdist.all_gather(t(), group=group),
        "gather": lambda: hwdist.gather(t(), dst=0, group=group),
        "scatter": lambda: hwdist.scatter(t(), each() if me == 0 else None, src=0, group=group),
        "reduce_scatter": lambda: hwdist.reduce_scatter(t(), each(), group=group),
        "all_to_all": lambda: hwdist.all_to_all(each(), each(), group=group),
        "barrier": lambda: hwdist.barrier(group=group),
        "sync_random_seed": lambda: hwdist.sync_random_seed(group=group),
        "reduce_mean": lambda: hwdist.reduce_mean(t(), group=group),
        "all_reduce_dict": lambda: hwdist.all_reduce_dict({"loss": t()}, group=group),
        "all_reduce_params": lambda: hwdist.all_reduce_params([t()], group=group),
        "all_gather_object": lambda: hwdist.all_gather_object({"r": me}, group=group),
        "gather_object": lambda: hwdist.gather_object({"r": me}, dst=0, group=group),
        "broadcast_object_list": lambda: hwdist.broadcast_object_list([me], src=0, group=group),
        "broadcast_object": lambda: hwdist.broadcast_object(me, src=0, group=group),
        "scatter_object_list": lambda: hwdist.scatter_object_list(
            [None], list(range(n)) if me == 0 else None, src=0, group=group
        ),
        "collect_results": lambda: hwdist.collect_results([me], n, group=group),
    }
    return {op: _error(call) for op, call in calls.items()}


def _rank_destroyed_subgroup(store: str) -> dict:
    _init(store)
    me = dist.get_rank()
    try:
        sub = dist.new_group([0, 1])
        before = _every_op(sub, me, 2)  # the group works, and hwdist keeps what it learnt of it
        dist.destroy_process_group(sub)
        after = _every_op(sub, me, 2)
        t = torch.ones(1)
        hwdist.all_reduce(t)  # the default group is untouched
        fresh = dist.new_group([0, 1])
        return {"before": before, "after": after, "world": t.item(),
                "fresh": hwdist.all_gather_object(me, group=fresh)}  # fmt: skip
    finally:
        hwdist.destroy()


def test_every_op_on_a_subgroup_torch_destroyed_says_the_group_was_destroyed(ranks, tmp_path):
    """Before the fix: the object collectives raised a bare ``KeyError('<ProcessGroup object ...>')``,
    ``barrier`` and the tensor collectives returned as if they had run."""
    for res in ranks(_rank_destroyed_subgroup, str(tmp_path / "store")):
        assert all(err is None for err in res["before"].values()), res["before"]
        assert res["world"] == 2.0 and res["fresh"] == [0, 1]
        for op, err in res["after"].items():
            assert err is not None, f"{op} ran on a destroyed group"
            kind, msg = err
            assert kind == "ValueError", (op, err)
            assert msg.startswith(f"{op}: group was destroyed: torch.distributed no longer knows"), (op, msg)
            assert "Fix: pass a live group" in msg, (op, msg)


def _rank_old_group_after_reinit(store: str, store2: str) -> dict:
    _init(store)
    old = dist.new_group([0, 1])
    hwdist.all_reduce(torch.ones(1), group=old)
    dist.destroy_process_group()  # every group, the subgroup with it
    _init(store2)
    try:
        return {"old": _error(lambda: hwdist.all_gather_object(1, group=old)),
                "new": hwdist.all_gather_object(dist.get_rank())}  # fmt: skip
    finally:
        hwdist.destroy()


def test_a_group_from_before_destroy_process_group_and_a_new_init_is_refused(ranks, tmp_path):
    for res in ranks(_rank_old_group_after_reinit, str(tmp_path / "s1"), str(tmp_path / "s2")):
        assert res["new"] == [0, 1]
        kind, msg = res["old"]
        assert kind == "ValueError" and msg.startswith("all_gather_object: group was destroyed"), res["old"]


# ------------------------------------------------------------------ the default group made again


def _reduced(me: int, step: int) -> dict:
    """``all_reduce_dict`` (sum, in place) of a float and an int64 value."""
    data = {"loss": torch.tensor(float(me + step)), "n": torch.tensor([me, 1])}
    hwdist.all_reduce_dict(data)
    return {k: v.tolist() for k, v in data.items()}


def _rank_reinit_smaller(store: str, store2: str) -> dict:
    """3 ranks reduce dicts, torch destroys the group, ranks 0 and 1 make a 2-rank group and reduce again."""
    _init(store)
    me = dist.get_rank()
    out: dict = {"first": []}
    for step in range(2):
        out["first"].append(_reduced(me, step))
    dist.destroy_process_group()  # torch's own destroy, not hwdist's
    if me == 2:
        return out
    _init(store2, world=2)
    try:
        out["second"] = []
        for step in range(3):
            out["second"].append(_reduced(me, step))
        t = torch.full((2,), float(me + 1))
        hwdist.all_reduce(t)
        out["all_reduce"] = t.tolist()
        return out
    finally:
        hwdist.destroy()


def test_all_reduce_dict_after_torch_destroys_the_group_and_fewer_ranks_init_again(ranks, tmp_path):
    results = ranks(_rank_reinit_smaller, str(tmp_path / "s1"), str(tmp_path / "s2"), world=3)
    for res in results:  # sums over ranks 0, 1, 2
        assert res["first"] == [{"loss": 3.0 + 3 * step, "n": [3, 3]} for step in range(2)], res
    for res in results[:2]:  # sums over ranks 0, 1
        assert res["second"] == [{"loss": 1.0 + 2 * step, "n": [1, 2]} for step in range(3)], res
        assert res["all_reduce"] == [3.0, 3.0]


def _rank_numbers_after_reinit(store: str, store2: str) -> dict:
    """Calls on the default group, torch destroys it while the old group object is still referenced, a new
    one is made: the flight recorder numbers the new group's calls from 1, however a caller names it."""
    from hwdist import flight

    _init(store)
    t = torch.ones(2)
    for _ in range(3):
        hwdist.all_reduce(t)
    old = dist.GroupMember.WORLD  # kept alive (a user's attribute, a cache) across the new init
    dist.destroy_process_group()  # torch's own destroy, not hwdist's
    _init(store2)
    try:
        since = time.time()
        hwdist.all_reduce(t)
        hwdist.all_reduce(t, group=dist.GroupMember.WORLD)  # the default group passed explicitly
        hwdist.all_reduce(t)
        entries = [e for e in flight.snapshot() if e["start"] >= since]
        return {"seqs": [e["seq"] for e in entries], "groups": [e["group"] for e in entries],
                "old_alive": old is not None}  # fmt: skip
    finally:
        hwdist.destroy()


def test_the_recorder_numbers_a_remade_default_group_from_one_whichever_way_it_is_named(ranks, tmp_path):
    for res in ranks(_rank_numbers_after_reinit, str(tmp_path / "s1"), str(tmp_path / "s2")):
        assert res["groups"] == ["default"] * 3, res
        assert res["seqs"] == [1, 2, 3], res
