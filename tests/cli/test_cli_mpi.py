"""``hwdist check`` / ``bench`` on backend 'mpi': under ``mpiexec -n N``, and starting mpiexec itself.

Under an MPI launcher every MPI process is one rank (nothing is spawned);
outside one, ``--backend mpi`` re-runs the command under ``mpiexec -n N``.
Skipped without mpi4py or mpiexec, as tests/drivers/test_mpi.py does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwdist.testing.mpi_suite import ENV_SUITE, MPI_AS_ROOT
from tests.drivers.test_mpi import _mpi_missing

from .test_cli_io import SITE

ROOT = Path(__file__).resolve().parents[2]

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.mpi,
    pytest.mark.skipif(
        os.environ.get(ENV_SUITE) == "1", reason="spawns its own MPI job; not inside the MPI suite"
    ),
]


@pytest.fixture(autouse=True)
def _needs_mpi() -> None:
    why = _mpi_missing()
    if why:
        pytest.skip(why)


def run(cmd: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HWDIST_", "PMI_", "PMIX_", "OMPI_COMM_WORLD_", "SLURM_"))
    }
    env.update({"PYTHONPATH": str(ROOT), "MPIEXEC_TIMEOUT": "200", **MPI_AS_ROOT, **(extra_env or {})})
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def test_check_under_mpiexec_runs_each_process_as_a_rank(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITE)  # init_process_group writes to stdout and fd 1 first
    proc = run(
        [
            "mpiexec",
            "-n",
            "2",
            sys.executable,
            "-m",
            "hwdist",
            "check",
            "--backend",
            "mpi",
            "--only",
            "dist_info,all_reduce,all_gather_object",
            "--json",
        ],
        {"PYTHONPATH": f"{tmp_path}:{ROOT}", "HWDIST_TEST_NOISE": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout)  # one report (rank 0's), nothing else
    assert rep["backend"] == "mpi" and rep["world_size"] == 2
    assert rep["failed"] == 0 and rep["passed"] == len(rep["results"]) >= 8
    assert (
        proc.stderr.count("NOISE at init on fd 1") == 2 and proc.stderr.count("NOISE at init from print") == 2
    )
    assert proc.stderr.count("the 2 MPI process(es) are the ranks") == 1


def test_check_under_mpiexec_with_another_backend():
    proc = run(
        [
            "mpiexec",
            "-n",
            "2",
            sys.executable,
            "-m",
            "hwdist",
            "check",
            "--backend",
            "gloo",
            "--only",
            "dist_info,broadcast",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 rank(s), backend 'gloo'" in proc.stdout and " 0 failed" in proc.stdout
    assert proc.stdout.count("dist_info ") == 1  # rank 0 reports, once


def test_backend_mpi_starts_mpiexec_itself():
    proc = run(
        [
            sys.executable,
            "-m",
            "hwdist",
            "check",
            "--backend",
            "mpi",
            "-n",
            "3",
            "--only",
            "dist_info,gather",
            "--json",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert rep["world_size"] == 3 and rep["failed"] == 0
    assert "running: " in proc.stderr and "mpiexec -n 3 " in proc.stderr


def test_bench_on_mpi_checks_its_results():
    proc = run(
        [
            sys.executable,
            "-m",
            "hwdist",
            "bench",
            "--backend",
            "mpi",
            "--ops",
            "all_reduce,all_gather",
            "--sizes",
            "1K",
            "--iters",
            "2",
            "--json",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert rep["backend"] == "mpi" and rep["world_size"] == 2 and rep["wrong"] == 0
    assert [r["op"] for r in rep["results"]] == ["all_reduce", "all_gather"]


def test_a_different_n_under_mpiexec_is_a_usage_error():
    proc = run(
        ["mpiexec", "-n", "2", sys.executable, "-m", "hwdist", "check", "-n", "3", "--only", "dist_info"]
    )
    assert proc.returncode == 2
    want = "hwdist check: error: -n 3 under an MPI job of 2 process(es); expected -n 2 or no -n"
    assert want in proc.stderr
