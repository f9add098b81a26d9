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
    for needle in ("OS: ", "CPU: ", "RAM: ", "/dev/shm: ", "backends available: ", "detected: backend ", "mpi: "):
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
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None and not os.path.exists("/proc/driver/nvidia/version"):
        assert facts == {}  # a CPU-only torch on a machine without NVIDIA's driver: nothing to say
    else:
        assert facts.get("cuda_runtime") == torch.version.cuda or facts.get("rocm_runtime") == torch.version.hip
