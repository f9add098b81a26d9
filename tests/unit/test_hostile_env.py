"""Hostile or sloppy environment variables get bounded, clear errors.

Resolvers are pure (they read a mapping), so these run without a process group. The
huge Slurm expansions are timed: a MemoryError or minutes of work would be the bug.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import hwdist
from hwdist.collectives import verify
from hwdist.detection import ENV_BACKEND, ENV_DEVICE
from hwdist.launch import LauncherError
from hwdist.launch.slurm import MAX_EXPANSION, SlurmLauncher, expand_hostlist, expand_tasks_per_node
from hwdist.launch.torchrun import TorchrunLauncher

SLURM = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"}


def _no_scontrol(nodelist):
    return None


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
    env = {**SLURM, "SLURM_LOCALID": "0", "SLURM_NODELIST": "n1", variable: value}
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
            {**SLURM, "SLURM_LOCALID": "0", "SLURM_NODELIST": "n1", "MASTER_PORT": port},
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
    with pytest.warns(UserWarning, match="verification mode is ON") if warns else _no_warning():
        assert verify._env_flag(verify.ENV_DEBUG) is on


def test_debug_level_2_turns_verification_on_at_import():
    code = "import hwdist; print(hwdist.verification_enabled())"
    env = dict(os.environ, HWDIST_DEBUG="2")
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
