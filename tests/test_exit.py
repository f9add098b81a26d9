"""Programs that never call ``hwdist.destroy()`` exit 0 under torchrun: hwdist tears the group down at exit.

Without the exit hook, gloo's teardown during interpreter finalisation aborts a rank
now and then (``terminate called without an active exception``, exit -6) after the
right result was printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
RUNS = 10
AT_ONCE = 2
LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"
)


def _index_example() -> str:
    """The first code block of docs/index.md, as written."""
    text = (ROOT / "docs" / "index.md").read_text()
    return re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS
           and not k.startswith("HWDIST_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HWDIST_BACKEND"] = "gloo"  # the abort is gloo's; a GPU host would otherwise pick its own backend
    env.update(extra)
    return env


def _torchrun(script: Path, **extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(script)]  # fmt: skip
    return subprocess.run(
        argv, cwd=script.parent, env=_env(**extra), capture_output=True, text=True, timeout=240
    )


@pytest.mark.timeout(900)  # 10 torchrun jobs: about half a minute on 2 idle cores, far more on a loaded host
def test_index_example_exits_cleanly_every_time_under_torchrun(tmp_path):
    script = tmp_path / "example.py"
    code = _index_example()
    assert "destroy" not in code  # the example as a user writes it: no teardown of their own
    script.write_text(code)
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = list(pool.map(lambda _: _torchrun(script), range(RUNS)))
    failed = [p for p in runs if p.returncode != 0]
    assert not failed, f"{len(failed)} of {RUNS} runs failed; the first:\n" + (
        failed[0].stdout + failed[0].stderr
    )[-4000:]
    for p in runs:  # both ranks printed the mean (their lines may interleave on torchrun's stdout)
        assert p.stdout.count("tensor([1., 1.])") == 2, p.stdout


# Registered before the group exists, so it runs after hwdist's hook (atexit runs last-registered first).
# Each line goes out in one os.write: both ranks share torchrun's stdout, and print() writes its
# arguments one by one, so two ranks' lines could interleave mid-line.
_REPORT_AT_EXIT = """
import atexit
import os
import torch.distributed as td

def say(*parts):
    os.write(1, (" ".join(map(str, parts)) + "\\n").encode())

atexit.register(lambda: say("at exit, group alive:", td.is_initialized()))
"""


def test_group_made_by_torch_and_used_by_hwdist_is_torn_down_at_exit(tmp_path):
    script = tmp_path / "torch_made.py"
    script.write_text(_REPORT_AT_EXIT + textwrap.dedent("""
        import torch
        import hwdist
        from hwdist import _exit as exit_hook
        td.init_process_group("gloo")
        assert not exit_hook.installed()  # torch made the group; hwdist has not used it yet
        t = torch.ones(1)
        hwdist.all_reduce(t)
        say("hook:", exit_hook.installed(), t.item())
    """))
    p = _torchrun(script)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert p.stdout.count("hook: True 2.0") == 2, p.stdout
    assert p.stdout.count("at exit, group alive: False") == 2, p.stdout


@pytest.mark.parametrize("init", ["torch.distributed.init_process_group", "hwdist.init_dist"])
def test_exit_hook_leaves_no_reference_to_the_group_it_destroys(tmp_path, init):
    """hwdist's caches (the resolved driver, the engine's pass-through calls bound to the group, the
    group's state, the local group ``init_dist`` made) drop the group before the hook destroys it: a group
    still referenced there would be destroyed by the interpreter's finalisation instead, which aborts gloo
    now and then."""
    script = tmp_path / "references.py"
    start = 'td.init_process_group("gloo")' if init.startswith("torch") else 'hwdist.init_dist("pytorch")'
    script.write_text(_REPORT_AT_EXIT + textwrap.dedent("""
        import gc
        import weakref
        import torch
        import hwdist
        from hwdist import _exit as exit_hook
        START
        t = torch.ones(4)
        hwdist.all_reduce(t)
        hwdist.broadcast(t, 0)
        hwdist.all_reduce_dict({"loss": torch.tensor(1.0)})
        hwdist.all_gather_object({"rank": td.get_rank()})
        group = weakref.ref(td.distributed_c10d._get_default_group())
        exit_hook._teardown()  # what the hook runs at exit
        gc.collect()
        say("group referenced after the teardown:", group() is not None)
    """).replace("START", start))
    p = _torchrun(script)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert p.stdout.count("group referenced after the teardown: False") == 2, p.stdout + p.stderr[-3000:]


def test_group_destroyed_by_torch_is_not_left_to_the_finalisation(tmp_path):
    """A program that ends with torch's own ``destroy_process_group()``: torch drops the group, hwdist's
    caches still hold it; the exit hook drops those, so the group is freed while the interpreter is whole
    (not by its finalisation, which aborts gloo now and then)."""
    script = tmp_path / "torch_destroyed.py"
    script.write_text(_REPORT_AT_EXIT + textwrap.dedent("""
        import gc
        import weakref
        import torch
        import hwdist
        from hwdist import _exit as exit_hook
        td.init_process_group("gloo")
        t = torch.ones(4)
        hwdist.all_reduce(t)
        for verify in (True, False, True):
            hwdist.all_reduce_dict({"loss": torch.tensor(1.0), "n": torch.tensor(2.0)}, verify=verify)
        hwdist.all_gather_object({"rank": td.get_rank()})
        group = weakref.ref(td.distributed_c10d._get_default_group())
        td.destroy_process_group()
        gc.collect()
        say("held by hwdist after torch's destroy:", group() is not None)
        exit_hook._at_exit()  # what runs at exit
        gc.collect()
        say("held after the exit hook:", group() is not None)
    """))
    p = _torchrun(script)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert p.stdout.count("held by hwdist after torch's destroy: True") == 2, p.stdout + p.stderr[-3000:]
    assert p.stdout.count("held after the exit hook: False") == 2, p.stdout + p.stderr[-3000:]


def test_hook_off_leaves_the_group_and_destroy_stays_safe(tmp_path):
    script = tmp_path / "switch.py"
    script.write_text(_REPORT_AT_EXIT + textwrap.dedent("""
        import os
        import hwdist
        hwdist.init_dist("pytorch")
        hwdist.barrier()
        if os.environ["RANK"] == "0":
            hwdist.destroy()  # the documented call: the hook then finds nothing to do
            hwdist.destroy()  # twice is fine
    """))
    p = _torchrun(script, HWDIST_DESTROY_AT_EXIT="0")
    # rank 0 destroyed it itself; rank 1 kept it (switch off): one line each
    assert p.stdout.count("at exit, group alive: False") == 1, p.stdout + p.stderr[-3000:]
    assert p.stdout.count("at exit, group alive: True") == 1, p.stdout + p.stderr[-3000:]


def test_rank_whose_peer_is_gone_exits_without_waiting(tmp_path):
    script = tmp_path / "peer_gone.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, time
        import torch
        import hwdist
        atexit.register(lambda: print("torn down", time.time(), flush=True))  # runs after hwdist's hook
        hwdist.init_dist("pytorch")
        hwdist.all_reduce(torch.ones(4))
        if os.environ["RANK"] == "1":
            os._exit(0)  # gone without any teardown
        time.sleep(3)  # rank 1 is gone by now
        print("rank 0 leaves", time.time(), flush=True)
    """))
    p = _torchrun(script)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    left = float(re.search(r"rank 0 leaves ([0-9.]+)", p.stdout).group(1))
    torn = float(re.search(r"torn down ([0-9.]+)", p.stdout).group(1))
    assert torn - left < 10, f"rank 0's teardown took {torn - left:.1f} s with its peer gone"
