"""Launcher resolvers, read from environment dicts (no process group, no env writes)."""

from __future__ import annotations

import os

import pytest

import hwdist
from hwdist.launch import LaunchInfo, LauncherError
from hwdist.launch.core import LEGACY_BACKEND_IDS, _backend_name
from hwdist.launch.mpi import MpiLauncher
from hwdist.launch.resolvers import Launcher
from hwdist.launch.slurm import (
    PORT_BASE,
    PORT_SPAN,
    SlurmLauncher,
    expand_hostlist,
    expand_tasks_per_node,
    port_from_job_id,
)
from hwdist.launch.torchrun import TorchrunLauncher
import subprocess
import sys
import time
from hwdist.collectives import verify
from hwdist.detection import ENV_BACKEND, ENV_DEVICE
from hwdist.launch.slurm import MAX_EXPANSION

# ---------------------------------------------------------------- infer_launcher

TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29400",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "6",
    "SLURM_LOCALID": "2",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "3(x2)",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_JOB_ID": "123456",
}


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "none"),
        (TORCHRUN, "pytorch"),
        (OPENMPI, "mpi"),
        (MPICH, "mpi"),
        (SLURM, "slurm"),
        ({**SLURM, **TORCHRUN}, "pytorch"),  # torchrun inside an sbatch job
        ({**SLURM, **OPENMPI}, "slurm"),  # mpirun inside an sbatch job: mmengine's answer (pass 'mpi')
    ],
)
def test_infer_launcher(env, expected):
    assert hwdist.infer_launcher(env) == expected


def test_builtin_launchers_and_alias():
    assert hwdist.list_launchers() == ["pytorch", "mpi", "slurm", "none"]
    assert hwdist.get_launcher("torchrun") is hwdist.get_launcher("pytorch")
    with pytest.raises(LauncherError, match="unknown launcher 'pbs'.*pytorch, mpi, slurm, none"):
        hwdist.get_launcher("pbs")


# ---------------------------------------------------------------- torchrun


def test_torchrun_resolver_reads_every_variable():
    info = TorchrunLauncher().resolve(TORCHRUN)
    assert info == LaunchInfo(
        launcher="pytorch",
        rank=5,
        world_size=8,
        local_rank=1,
        local_world_size=4,
        node_rank=1,
        master_addr="node0",
        master_port=29400,
    )


def test_torchrun_local_rank_defaults():
    env = {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert TorchrunLauncher().resolve(env).local_rank == 2
    assert TorchrunLauncher().resolve({"RANK": "1", "WORLD_SIZE": "2"}).local_rank == 1


@pytest.mark.parametrize(
    "env, message",
    [
        ({"WORLD_SIZE": "2"}, "none of RANK is set"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK must be an integer, got 'x'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside world size 2"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
            "local rank 3 is outside",
        ),
    ],
)
def test_torchrun_bad_env(env, message):
    with pytest.raises(LauncherError, match=message):
        TorchrunLauncher().resolve(env)


def test_exports_never_include_unknowns():
    info = TorchrunLauncher().resolve({"RANK": "0", "WORLD_SIZE": "1"})
    assert info.exports() == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}


# ---------------------------------------------------------------- slurm


def _no_scontrol(nodelist):
    return None


def test_slurm_resolver_with_scontrol():
    calls = []

    def fake_scontrol(nodelist):
        calls.append(nodelist)
        return ["gpu07", "gpu08"]

    info = SlurmLauncher(hostnames=fake_scontrol).resolve(SLURM)
    assert calls == ["gpu[07-08]"]
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == (
        5,
        6,
        2,
        3,
        1,
    )
    assert info.master_addr == "gpu07"
    assert info.master_port == PORT_BASE + 123456 % PORT_SPAN
    assert info.exports()["MASTER_PORT"] == str(PORT_BASE + 123456 % PORT_SPAN)


def test_slurm_falls_back_to_own_hostlist_parser():
    info = SlurmLauncher(hostnames=_no_scontrol).resolve({**SLURM, "SLURM_NODELIST": "a[009-011],b"})
    assert info.master_addr == "a009"


def test_slurm_step_nodelist_wins_and_user_master_is_kept():
    env = {**SLURM, "SLURM_STEP_NODELIST": "c[3-4]", "MASTER_PORT": "4000"}
    info = SlurmLauncher(hostnames=_no_scontrol).resolve(env)
    assert (info.master_addr, info.master_port) == ("c3", 4000)
    env = {**SLURM, "MASTER_ADDR": "head"}
    assert SlurmLauncher(hostnames=_no_scontrol).resolve(env).master_addr == "head"


def test_slurm_port_is_deterministic_and_outside_ephemeral_range():
    ports = {port_from_job_id(str(j)) for j in range(0, 100000, 997)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN < 32768 for p in ports)
    assert port_from_job_id("42") == port_from_job_id("42") == PORT_BASE + 42
    assert port_from_job_id(None) == 29500


def test_slurm_conflicting_user_rank_is_an_error():
    with pytest.raises(LauncherError, match="RANK=1 is set in the environment but SLURM_PROCID says 5"):
        SlurmLauncher(hostnames=_no_scontrol).resolve({**SLURM, "RANK": "1"})


def test_slurm_without_localid_and_layout_is_an_error():
    env = {k: v for k, v in SLURM.items() if k not in ("SLURM_LOCALID", "SLURM_TASKS_PER_NODE")}
    with pytest.raises(LauncherError, match="SLURM_LOCALID is not set.*srun"):
        SlurmLauncher(hostnames=_no_scontrol).resolve(env)
    env["SLURM_NTASKS_PER_NODE"] = "3"
    assert SlurmLauncher(hostnames=_no_scontrol).resolve(env).local_rank == 5 % 3


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("n1", ["n1"]),
        ("gpu[01-03,07],login", ["gpu01", "gpu02", "gpu03", "gpu07", "login"]),
        ("r[1-2]n[8-9]", ["r1n8", "r1n9", "r2n8", "r2n9"]),
        ("x[9-10]-ib", ["x9-ib", "x10-ib"]),
    ],
)
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


def test_expand_hostlist_errors():
    with pytest.raises(LauncherError, match="unbalanced"):
        expand_hostlist("n[1-2")
    with pytest.raises(LauncherError, match="bad range"):
        expand_hostlist("n[3-1]")


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(LauncherError):
        expand_tasks_per_node("two")


def test_scontrol_is_used_when_on_path(tmp_path, monkeypatch):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho hostA\necho hostB\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert SlurmLauncher().resolve(SLURM).master_addr == "hostA"


# ---------------------------------------------------------------- mpi


def test_openmpi_resolver():
    info = MpiLauncher().resolve(OPENMPI)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert info.node_rank is None and info.master_addr is None


def test_mpich_resolver():
    info = MpiLauncher().resolve(MPICH)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (2, 3, 2, 3)


def test_mpi_under_srun_pmi_uses_slurm_localid():
    info = MpiLauncher().resolve({"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_LOCALID": "1"})
    assert (info.rank, info.local_rank) == (3, 1)


def test_mpi_without_local_rank_on_several_nodes_is_an_error():
    with pytest.raises(LauncherError, match="no local-rank variable"):
        MpiLauncher().resolve({"PMI_RANK": "1", "PMI_SIZE": "4"})


def test_mpi_keeps_user_master_variables():
    info = MpiLauncher().resolve({**OPENMPI, "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (info.master_addr, info.master_port) == ("h", 1234)


# ---------------------------------------------------------------- registry


def test_register_custom_launcher_is_inferred_by_priority():
    @hwdist.register_launcher("mycluster")
    class MyCluster(Launcher):
        priority = 25

        def detect(self, env):
            return "MYCLUSTER_ID" in env

        def resolve(self, env):
            return LaunchInfo("mycluster", int(env["MYCLUSTER_ID"]), 4, 0)

    try:
        assert hwdist.list_launchers()[:2] == ["pytorch", "mycluster"]
        assert hwdist.infer_launcher({**OPENMPI, "MYCLUSTER_ID": "2"}) == "mycluster"
        assert hwdist.get_launcher("mycluster").resolve({"MYCLUSTER_ID": "2"}).rank == 2
        with pytest.raises(LauncherError, match="already registered"):
            hwdist.register_launcher("mycluster", MyCluster)
    finally:
        hwdist.unregister_launcher("mycluster")
    assert "mycluster" not in hwdist.list_launchers()
    with pytest.raises(LauncherError, match="unknown launcher"):
        hwdist.unregister_launcher("mycluster")


def test_register_rejects_malformed():
    with pytest.raises(LauncherError, match="lacks 'detect'"):
        hwdist.register_launcher("bad", object())
    with pytest.raises(LauncherError, match="reserved"):
        hwdist.register_launcher("auto", Launcher)


# ---------------------------------------------------------------- backend names


def test_legacy_backend_ids():
    assert {k: _backend_name(k) for k in LEGACY_BACKEND_IDS} == {1: "mpi", 2: "gloo", 3: "nccl"}
    with pytest.raises(
        hwdist.BackendError, match=r"dist_backend.TCP: the .tcp. backend was removed from torch in 1.0"
    ):
        _backend_name(0)
    with pytest.raises(hwdist.BackendError, match="not a legacy dist_backend id"):
        _backend_name(7)
    with pytest.raises(TypeError, match="backend must be"):
        _backend_name(True)


def test_named_backend_is_kept_and_none_is_detected(monkeypatch):
    assert _backend_name(" gloo ") == "gloo"
    monkeypatch.setenv("HWDIST_BACKEND", "gloo")
    assert _backend_name(None) == "gloo"


class _AbsentDriver(hwdist.Driver):
    device_type = "cpu"

    def unavailable_reason(self):
        return "no such card"


@pytest.fixture
def absent_backend():
    hwdist.register_backend("absent", _AbsentDriver)
    yield
    hwdist.unregister_backend("absent")


def test_init_dist_errors_before_touching_anything(monkeypatch, absent_backend):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    before = dict(os.environ)
    with pytest.raises(hwdist.BackendError, match="'tcp' backend was removed"):
        hwdist.init_dist("pytorch", backend="tcp")
    with pytest.raises(hwdist.BackendError, match="unknown backend 'nosuch'"):
        hwdist.init_dist("pytorch", backend="nosuch")
    with pytest.raises(
        hwdist.BackendError, match="'absent' is not available here: no such card.*Available: .*gloo"
    ):
        hwdist.init_dist("pytorch", backend="absent")
    with pytest.raises(LauncherError, match="unknown launcher 'pbs'"):
        hwdist.init_dist("pbs", backend="gloo")
    with pytest.raises(LauncherError, match="none of RANK is set"):
        hwdist.init_dist("pytorch", backend="gloo")
    with pytest.raises(ValueError, match="init_backend must be one of 'torch', 'deepspeed', 'colossalai'"):
        hwdist.init_dist("pytorch", backend="gloo", init_backend="nosuch")
    assert dict(os.environ) == before
    assert not hwdist.is_distributed()


def test_init_dist_none_creates_nothing_and_describes_the_process():
    info = hwdist.init_dist("none", backend="gloo")
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.node_rank, info.backend) == (
        "none", 0, 1, 0, 0, "gloo"
    )
    assert not hwdist.is_distributed()
    hwdist.destroy()
    hwdist.destroy()  # safe twice, also without a group


def test_clusters_page_example_runs_under_plain_python():
    """docs/clusters.md's first block, as written, in a process without launcher variables."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = re.search(r"```python\n(.*?)```", (root / "docs" / "clusters.md").read_text(), flags=re.S).group(1)
    assert "info = dist.init_dist()" in code and "info.node_rank" in code
    launch_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_", "PMI_", "SLURM_", "MASTER_", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith((*launch_vars, "HWDIST_"))}
    env["HWDIST_BACKEND"] = "gloo"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "0", "0", "gloo"]


def test_importing_hwdist_registers_no_exit_hook():
    """The exit hook comes with a group hwdist starts or uses, never with the import."""
    import subprocess
    import sys

    code = (
        "import atexit, traceback\n"
        "seen = []\n"
        "real = atexit.register\n"
        "def spy(fn, *a, **k):\n"
        "    seen.append(traceback.extract_stack()[-2].filename)\n"
        "    return real(fn, *a, **k)\n"
        "atexit.register = spy\n"
        "import os, hwdist, hwdist.testing\n"
        "from hwdist import _exit as exit_hook\n"
        "pkg = os.path.dirname(hwdist.__file__) + os.sep\n"
        "print(exit_hook.installed(), [f for f in seen if f.startswith(pkg)])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False []"


def test_the_exit_hook_destroys_a_live_group_once_and_nothing_else(monkeypatch):
    import torch
    import torch.distributed as td

    from hwdist import _exit as exit_hook

    td.init_process_group("gloo", store=td.HashStore(), rank=0, world_size=1)
    try:
        hwdist.all_reduce(torch.ones(1))  # first use by hwdist of a group torch created
        assert exit_hook.installed()
        monkeypatch.setattr(exit_hook, "_ran", False)
        exit_hook._at_exit()
        assert not td.is_initialized()
        exit_hook._at_exit()  # once: a second call (or a later group) is left alone
    finally:
        hwdist.destroy()


# ---------- hostile launcher variables ----------
# Hostile or sloppy environment variables get bounded, clear errors.

SLURM_TWO_TASKS = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"}


@pytest.mark.parametrize(
    "variable, value, message",
    [
        (
            "SLURM_NODELIST",
            "n[0-99999999]",
            "expands to 100000000 entries, more than hwdist's limit of 1000000",
        ),
        ("SLURM_NODELIST", "r[0-9999]n[0-9999]", "expands to 100000000 entries"),
        ("SLURM_NODELIST", "a[1-600000],b[1-600000]", "expands to 1200000 entries"),
        ("SLURM_NODELIST", "node[²-3]", "malformed Slurm node list 'node[²-3]': bad range '²-3'"),
        ("SLURM_NODELIST", "node[1,٣]", "bad item '٣'"),
        ("SLURM_NODELIST", "n[0-" + "9" * 5000 + "]", "malformed Slurm node list"),
        (
            "SLURM_TASKS_PER_NODE",
            "2(x100000000000)",
            "expands to 100000000000 entries, more than hwdist's limit",
        ),
        ("SLURM_TASKS_PER_NODE", "1(x" + "9" * 5000 + ")", "malformed SLURM_TASKS_PER_NODE"),
        ("SLURM_TASKS_PER_NODE", "²", "malformed SLURM_TASKS_PER_NODE '²'"),
    ],
)
def test_slurm_expansion_is_bounded_and_clear(variable, value, message):
    env = {**SLURM_TWO_TASKS, "SLURM_LOCALID": "0", "SLURM_NODELIST": "n1", variable: value}
    start = time.monotonic()
    with pytest.raises(LauncherError, match=message.replace("[", r"\[").replace("(", r"\(")):
        SlurmLauncher(hostnames=_no_scontrol).resolve(env)
    assert time.monotonic() - start < 2.0  # counted, never built


def test_slurm_expansion_still_expands_real_lists():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert len(expand_hostlist(f"n[1-{MAX_EXPANSION}]")) == MAX_EXPANSION  # the limit itself is fine


@pytest.mark.parametrize("port", ["99999", "0", "-1", "65536"])
def test_master_port_out_of_range_is_refused(port):
    for launcher, env in (
        (TorchrunLauncher(), {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": port}),
        (
            SlurmLauncher(hostnames=_no_scontrol),
            {**SLURM_TWO_TASKS, "SLURM_LOCALID": "0", "SLURM_NODELIST": "n1", "MASTER_PORT": port},
        ),
    ):
        with pytest.raises(
            LauncherError, match=f"the rendezvous port \\(MASTER_PORT\\) must be in 1..65535, got {port}"
        ):
            launcher.resolve(env)
    ok = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "65535"}
    assert TorchrunLauncher().resolve(ok).master_port == 65535


@pytest.mark.parametrize("device", ["CPU", "Cpu", " cpu "])
def test_device_override_is_case_insensitive_like_the_backend(monkeypatch, device):
    monkeypatch.delenv(ENV_BACKEND, raising=False)
    monkeypatch.setenv(ENV_DEVICE, device)
    found = hwdist.detect()
    assert (found.device_type, found.backend, found.source) == ("cpu", "gloo", ENV_DEVICE)
    monkeypatch.setenv(ENV_BACKEND, "GLOO")
    found = hwdist.detect()
    assert (found.device_type, found.backend, found.source) == ("cpu", "gloo", ENV_BACKEND)


@pytest.mark.parametrize(
    "value, on, warns",
    [
        ("1", True, False),
        ("2", True, False),
        ("10", True, False),
        ("true", True, False),
        ("ON", True, False),
        ("0", False, False),
        ("00", False, False),
        ("", False, False),
        ("no", False, False),
        ("Off", False, False),
        ("maybe", True, True),
        ("²", True, True),
    ],
)
def test_debug_levels_are_never_silently_off(monkeypatch, value, on, warns):
    monkeypatch.setenv(verify.ENV_DEBUG, value)
    with pytest.warns(UserWarning, match="debug mode .* is ON") if warns else _no_warning():
        assert verify._env_flag(verify.ENV_DEBUG) is on


def test_debug_level_2_turns_verification_on_at_import():
    code = "import hwdist; print(hwdist.verification_enabled())"
    env = dict(os.environ, HWDIST_DEBUG="2", HWDIST_VERIFY="0")  # debug mode wins over HWDIST_VERIFY=0
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "True"


class _no_warning:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
