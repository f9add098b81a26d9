"""``hwdist env``: system facts, the environment variables that matter (secrets masked), ``--issue``."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy
import pytest
import torch

import hwdist
from hwdist import cli_env
from hwdist.drivers._common import AcceleratorDriver

from .test_cli import run_cli
from hwdist.cli_env import environment_variables

SECRETS = {
    "HWDIST_API_TOKEN": "tok-3141592653",
    "NCCL_SECRET_SAUCE": "sauce-2718281828",
    "MASTER_PASSWORD": "pw-1618033988",
    "GLOO_KEY": "key-1414213562",
}
SHOWN = {
    "NCCL_DEBUG": "INFO",
    "NCCL_SOCKET_IFNAME": "eth9",
    "GLOO_SOCKET_IFNAME": "lo",
    "MASTER_ADDR": "10.1.2.3",
    "MASTER_PORT": "29511",
    "OMP_NUM_THREADS": "3",
    "HWDIST_SOMETHING": "on",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "SLURM_JOB_ID": "4242",
}


def test_system_facts_match_the_machine():
    facts = cli_env.system_facts()
    assert facts["cpu_count"] == os.cpu_count()
    assert 1 <= facts["cpus_usable"] <= facts["cpu_count"]
    assert facts["os"] and facts["kernel"] and facts["machine"]
    if os.path.exists("/proc/meminfo"):
        kb = int(re.search(r"MemTotal:\s*(\d+)", open("/proc/meminfo").read()).group(1))
        assert facts["memory_bytes"] == kb * 1024
    if os.path.isdir("/dev/shm"):
        assert facts["shm"]["total_bytes"] == shutil.disk_usage("/dev/shm").total
    if os.path.exists("/proc/cpuinfo") and "model name" in open("/proc/cpuinfo").read():
        assert facts["cpu_model"] in open("/proc/cpuinfo").read()


def test_relevant_variables_are_shown_and_secrets_masked():
    env = {**SHOWN, **SECRETS, "UNRELATED_VARIABLE": "x", "PATH": os.environ.get("PATH", "")}
    found = cli_env.environment_variables(env)
    for name, value in SHOWN.items():
        assert found[name] == value
    for name in SECRETS:
        assert found[name] == cli_env.MASK
    assert "UNRELATED_VARIABLE" not in found and "PATH" not in found


@pytest.mark.parametrize("mode", [[], ["--json"], ["--issue"]])
def test_no_mode_prints_a_secret(mode):
    proc = run_cli("env", *mode, env={**SHOWN, **SECRETS})
    assert proc.returncode == 0, proc.stderr
    for value in SECRETS.values():
        assert value not in proc.stdout
    for name in SECRETS:
        assert f"{name}={cli_env.MASK}" in proc.stdout or f'"{name}": "{cli_env.MASK}"' in proc.stdout
    assert "NCCL_SOCKET_IFNAME" in proc.stdout and "eth9" in proc.stdout


def test_env_json_has_system_and_environment():
    proc = run_cli("env", "--json", env=SHOWN)
    rep = json.loads(proc.stdout)
    assert rep["system"]["cpu_count"] == os.cpu_count()
    assert rep["environment"]["OMP_NUM_THREADS"] == "3"
    assert rep["launcher"]["variables"]["slurm"]["SLURM_JOB_ID"] == "4242"
    assert rep["torch"]["distributed"] is True


def test_issue_mode_is_one_pasteable_block():
    proc = run_cli("env", "--issue", env=SHOWN)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "```text" and lines[-1] == "```"
    text = proc.stdout
    assert f"torch: {torch.__version__} (distributed: yes)" in text
    assert f"numpy: {numpy.__version__}" in text
    assert f"hwdist: {hwdist.__version__}" in text
    for needle in (
        "OS: ",
        "CPU: ",
        "RAM: ",
        "/dev/shm: ",
        "backends available: ",
        "detected: backend ",
        "mpi: ",
    ):
        assert needle in text
    assert "OMP_NUM_THREADS=3" in text and "MASTER_ADDR=10.1.2.3" in text
    assert len(lines) < 30  # short enough to paste


def test_every_driver_declares_its_variables_and_cli_names_none():
    """Device knowledge stays in the drivers: cli_env knows no backend's variables itself."""
    for name in ("nccl", "gloo", "hccl", "mpi"):
        assert hwdist.get_driver(name).env_vars
    source = open(cli_env.__file__).read()
    for word in ("NCCL", "GLOO", "HCCL", "CUDA", "cuda", "nccl"):
        assert word not in source


class _FakeVendor(AcceleratorDriver):
    """A driver whose 'vendor package' is numpy (installed everywhere here), for details()."""

    name = "fakevendor"
    device_type = "cpu"
    vendor_module = "numpy"


def test_accelerator_details_report_the_vendor_version_without_importing_it():
    facts = _FakeVendor().details()
    assert facts["numpy"] == numpy.__version__


def test_nccl_details_on_this_torch():
    facts = hwdist.get_driver("nccl").details()
    if (
        torch.version.cuda is None
        and getattr(torch.version, "hip", None) is None
        and not os.path.exists("/proc/driver/nvidia/version")
    ):
        assert facts == {}  # a CPU-only torch on a machine without NVIDIA's driver: nothing to say
    else:
        assert (
            facts.get("cuda_runtime") == torch.version.cuda or facts.get("rocm_runtime") == torch.version.hip
        )


def test_env_lists_every_setting_with_its_value(monkeypatch):
    from hwdist import settings

    monkeypatch.setitem(
        settings.SETTINGS,
        "HWDIST_FAKE_TOKEN",
        settings.Setting("HWDIST_FAKE_TOKEN", "text", "", "a secret (test)"),
    )
    env = {"HWDIST_DEBUG": "1", "HWDIST_FAKE_TOKEN": "tok-271828"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HWDIST_FLIGHT_SIGNAL", raising=False)
    rows = {r["name"]: r for r in cli_env.settings_report()}
    assert set(rows) == set(settings.SETTINGS)
    assert rows["HWDIST_DEBUG"]["value"] == "1" and rows["HWDIST_DEBUG"]["kind"] == "flag"
    assert rows["HWDIST_FAKE_TOKEN"]["value"] == cli_env.MASK
    assert rows["HWDIST_FLIGHT_SIGNAL"]["value"] is None and rows["HWDIST_FLIGHT_SIGNAL"]["default"] == "auto"
    assert rows["HWDIST_FLIGHT_SIGNAL"]["choices"] == ["auto", "on", "off"]
    import io

    out = io.StringIO()
    cli_env._print_env(cli_env.env_report(), out)
    text = out.getvalue()
    for name in settings.SETTINGS:
        assert name in text
    assert "HWDIST_DEBUG=1" in text and "HWDIST_FLIGHT_SIGNAL (unset; default 'auto')" in text
    assert "tok-271828" not in text


def test_env_json_lists_the_settings():
    proc = run_cli("env", "--json", env={"HWDIST_DEBUG": "0"})
    rows = {r["name"]: r for r in json.loads(proc.stdout)["settings"]}
    from hwdist import settings

    assert set(rows) == set(settings.SETTINGS) and rows["HWDIST_DEBUG"]["value"] == "0"


def test_launcher_variables_come_from_one_table(monkeypatch):
    """info, the MPI launcher and hwdist env read hwdist.launch_env's table; cli_env names no variable.
    """
    from hwdist import info, launch_env
    from hwdist.launch import mpi, resolvers

    assert info._LOCAL_RANK_VARS is resolvers.LOCAL_RANK_VARS
    assert mpi.LOCAL_RANK_VARS == launch_env.MPI_LOCAL_RANK_VARS and mpi.SIZE_VARS == launch_env.MPI_SIZE_VARS
    for var in resolvers.LOCAL_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MV2_COMM_WORLD_LOCAL_RANK", "5")  # MVAPICH: once only the MPI launcher knew it
    assert hwdist.get_local_rank() == 5
    monkeypatch.setenv(
        "SLURM_LOCALID", "0"
    )  # mpirun inside sbatch: Slurm's variable describes the batch step
    assert hwdist.get_local_rank() == 5
    found = cli_env.environment_variables({"MV2_COMM_WORLD_SIZE": "4", "PMIX_RANK": "1"})
    assert found == {"MV2_COMM_WORLD_SIZE": "4", "PMIX_RANK": "1"}
    source = open(cli_env.__file__).read()
    for word in ("OMPI_", "SLURM_", "PMI_", "LOCAL_RANK", "WORLD_SIZE"):
        assert word not in source


def test_threads_are_shown_even_when_omp_num_threads_is_unset(monkeypatch):
    import torch

    from hwdist import cli_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    facts = cli_env.system_facts()
    assert facts["torch_threads"] == torch.get_num_threads() and facts["omp_num_threads"] is None
    line = [ln for ln in cli_env._system_line(facts) if ln.startswith("Threads:")]
    assert line == [f"Threads: torch uses {torch.get_num_threads()} per process; OMP_NUM_THREADS=unset"]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cli_env._system_line(cli_env.system_facts())[-1].endswith("OMP_NUM_THREADS=3")


# ---------- torch's debug variables ----------
# ``hwdist env`` shows torch's own collective debugging variables beside hwdist's.

def test_torch_flight_recorder_and_nan_check_variables_are_listed():
    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": "/tmp/fr_",
        "TORCH_DIST_NAN_CHECK": "1",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_GLOO_LAZY_INIT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "100",
        "NCCL_DEBUG": "INFO",
        "UNRELATED": "x",
    }
    shown = environment_variables(env)
    assert set(shown) == set(env) - {"UNRELATED"}
    assert shown["TORCH_FR_BUFFER_SIZE"] == "2000"



def test_torch_215_engine_switch_is_listed_and_its_engine_shown(monkeypatch):
    """TORCH_DIST_USE_NCCL2 chooses the engine torch 2.15 builds for its NCCL name: listed with the
    other variables, and where torch has two engines and NCCL the driver's runtime facts name the one
    built."""
    from hwdist import _compat

    shown = environment_variables({"TORCH_DIST_USE_NCCL2": "0", "TORCH_FR_BUFFER_SIZE": "10"})
    assert shown == {"TORCH_DIST_USE_NCCL2": "0", "TORCH_FR_BUFFER_SIZE": "10"}
    drv = hwdist.get_driver("nccl")
    if not (_compat.HAS_NCCL_ENGINES and torch.distributed.is_nccl_available()):
        assert "engine" not in drv.details()  # one engine before torch 2.15, or no NCCL in this build
        return
    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", "0")
    assert drv.details()["engine"].startswith("nccl-legacy (ProcessGroupNCCL;")
    monkeypatch.delenv("TORCH_DIST_USE_NCCL2")
    assert drv.details()["engine"].startswith("nccl2 (torchcomms;")
