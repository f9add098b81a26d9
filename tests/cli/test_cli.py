"""The ``hwdist`` command: output and exit codes, success and failure paths.

Most tests run ``python -m hwdist`` in a subprocess with this worktree first
on PYTHONPATH (so they test this tree's hwdist, installed or not). Usage
errors that never spawn ranks also run in-process through ``main()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

import hwdist
from hwdist import cli, cli_bench

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: What a subprocess needs on PYTHONPATH: the repository (the package, tests, benchmarks) (tests, benchmarks).
SRC_PATH = str(ROOT)


def run_cli(
    *args: str, env: Optional[dict[str, str]] = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    """``python -m hwdist ARGS`` from the worktree root; returns the finished process."""
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HWDIST_", "SLURM_", "OMPI_", "PMI_"))
    }
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        full_env.pop(var, None)
    full_env["PYTHONPATH"] = SRC_PATH + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hwdist", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(proc: subprocess.CompletedProcess, command: str = "check") -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{proc.stderr}"
    assert lines[0].startswith(f"hwdist {command}: error: "), lines[0]
    return lines[0]


def unavailable_backend() -> str:
    """A registered backend this machine cannot run (nccl on a CPU-only torch)."""
    names = [n for n in hwdist.list_backends() if not hwdist.get_driver(n).is_available()]
    if not names:
        pytest.skip("every registered backend is available here")
    return "nccl" if "nccl" in names else names[0]


# ---- packaging ---------------------------------------------------------------


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'hwdist = "hwdist.cli:main"' in text


def test_the_mpi_extra_installs_what_the_mpi_suite_needs():
    text = (ROOT / "pyproject.toml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("mpi = "))
    for req in ("mpi4py", "mpich", "pytest"):  # mpi_suite runs pytest under mpiexec
        assert f'"{req}' in line


def test_no_command_prints_help_and_exits_2():
    proc = run_cli()
    assert proc.returncode == 2
    assert "env" in proc.stderr and "check" in proc.stderr and "bench" in proc.stderr


# ---- hwdist env ----------------------------------------------------------------


def test_env_reports_drivers_detection_mpi_and_torch_map():
    proc = run_cli("env")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for heading in (
        "System:",
        "Drivers (detection order):",
        "Detection:",
        "Launcher:",
        "mpi runtime:",
        "Environment variables (secrets masked):",
        "torch.distributed backends:",
    ):
        assert heading in out
    for name in hwdist.list_backends():
        assert f"  {name} " in out
    det = hwdist.detect()
    assert f"backend {det.backend}" in out and "auto-detected" in out


def test_env_json_is_complete_and_consistent_with_the_registry():
    proc = run_cli(
        "env", "--json", env={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_PROCID": "3"}
    )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    import numpy
    import torch

    assert rep["torch"]["version"] == torch.__version__
    assert rep["numpy"]["version"] == numpy.__version__
    by_name = {d["name"]: d for d in rep["drivers"]}
    assert set(hwdist.list_backends()) <= set(by_name)
    assert "emu" in by_name  # hwdist.testing's emulated accelerator is listed too
    for name, d in by_name.items():
        drv = hwdist.get_driver(name)
        assert d["available"] == drv.is_available()
        if d["available"]:
            assert d["reason"] is None and isinstance(d["device_count"], int)
        else:
            assert d["reason"] == drv.unavailable_reason() and d["device_count"] is None
        assert d["capabilities"]["native_ops"]
    assert rep["detection"]["backend"] == hwdist.detect().backend
    assert rep["detection"]["overridden"] is False
    variables = rep["launcher"]["variables"]
    assert variables["torchrun"]["RANK"] == "3" and variables["slurm"]["SLURM_PROCID"] == "3"
    assert rep["launcher"]["inferred"] == hwdist.infer_launcher(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_PROCID": "3"}
    )
    assert set(rep["runtime_details"]["mpi"]) >= {"torch_built_with_mpi", "mpi4py", "launchers_on_path"}
    assert isinstance(rep["torch_backends"]["default_device_backend_map"], dict)


def test_env_shows_an_override_and_a_bad_override_without_crashing():
    fallback = hwdist.detect().backend
    proc = run_cli("env", "--json", env={"HWDIST_BACKEND": fallback})
    assert proc.returncode == 0, proc.stderr
    det = json.loads(proc.stdout)["detection"]
    assert det["overridden"] is True and det["source"] == "HWDIST_BACKEND"
    proc = run_cli("env", env={"HWDIST_BACKEND": "no-such-backend"})
    assert proc.returncode == 0, proc.stderr
    assert "error: unknown backend 'no-such-backend'" in proc.stdout


# ---- hwdist check ------------------------------------------------------------


def test_check_passes_on_two_ranks_of_the_detected_backend():
    proc = run_cli("check", "-n", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"2 rank(s), backend '{hwdist.detect().backend}'" in out
    assert " 0 failed" in out and "FAIL" not in out
    assert any(ln.startswith("dist_info") and " pass " in ln for ln in out.splitlines())


def test_check_json_on_the_emulated_accelerator():
    proc = run_cli("check", "-n", "2", "--backend", "emu", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["backend"] == "emu" and rep["world_size"] == 2
    assert rep["failed"] == 0 and rep["passed"] >= 1
    statuses = {r["status"] for r in rep["results"]}
    assert statuses <= {
        "pass",
        "n/a",
        "refused (as declared)",
    }  # emu refuses int64 reductions (no lossless plan)
    assert rep["passed"] + rep["not_available"] + rep["refused"] == len(rep["results"])


def test_an_injected_wrong_result_gives_a_fail_row_and_exit_1():
    proc = run_cli("check", "-n", "2", "--only", "dist_info", "--inject-failure", "dist_info")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("dist_info")]
    assert len(rows) == 1 and " FAIL " in rows[0]
    assert "got" in rows[0] and "expected" in rows[0]
    assert "0 passed, 1 failed" in proc.stdout


def test_a_rank_that_raises_gives_a_fail_row_naming_the_root_cause():
    proc = run_cli(
        "check", "-n", "2", "--only", "dist_info", "--json", env={"HWDIST_CHECK_INJECT": "dist_info::raise"}
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["failed"] == 1
    (row,) = rep["results"]
    assert row["status"] == "FAIL"
    assert "root cause: rank 1 error: RuntimeError: failure injected by HWDIST_CHECK_INJECT" in row["detail"]


def test_check_on_an_unavailable_backend_is_one_line_with_the_fix():
    name = unavailable_backend()
    proc = run_cli("check", "--backend", name)
    assert proc.returncode == 2
    line = one_error_line(proc)
    reason = hwdist.get_driver(name).unavailable_reason()
    assert f"backend '{name}' is not available here: {reason}" in line
    assert "Available: " + ", ".join(hwdist.available_backends()) in line
    assert "Fix: pass --backend " in line
    assert proc.stdout == ""


def test_check_on_an_unknown_backend_lists_the_registered_ones():
    proc = run_cli("check", "--backend", "no-such-backend")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "unknown backend 'no-such-backend'" in line
    assert "gloo" in line and "Fix:" in line


# ---- hwdist bench ------------------------------------------------------------


def test_bench_json_sweep_uses_nccl_tests_bus_bandwidth():
    proc = run_cli(
        "bench",
        "-n",
        "2",
        "--ops",
        "all_reduce,all_gather,broadcast",
        "--sizes",
        "1K,4K",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["world_size"] == 2 and rep["dtype"] == "float32"
    rows = rep["results"]
    assert [(r["op"], r["size"]) for r in rows] == [
        (op, size) for op in ("all_reduce", "all_gather", "broadcast") for size in (1024, 4096)
    ]
    factor = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": (2 - 1) / 2, "broadcast": 1.0}
    for r in rows:
        assert r["time_us"] > 0
        assert r["wrong"] == 0
        assert r["algbw_gbps"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor[r["op"]])
        assert r["impl"] in ("hwdist", "torch")
    assert "bench: all_reduce" in proc.stderr  # progress while it runs


def test_bench_table_and_plot():
    import importlib.util
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "bw.png")
        proc = run_cli("bench", "--ops", "broadcast", "--sizes", "1K:2K", "--iters", "2", "--plot", png)
        if importlib.util.find_spec("matplotlib") is None:
            assert proc.returncode == 2
            assert "pip install matplotlib" in one_error_line(proc, "bench")
            return
        assert proc.returncode == 0, proc.stderr
        with open(png, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "# broadcast (" in proc.stdout
    assert "busbw(GB/s)" in proc.stdout
    assert len([ln for ln in proc.stdout.splitlines() if ln.strip().startswith(("1024 ", "2048 "))]) == 2


# ---- usage errors in-process (they never spawn ranks) ------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bench", "--sizes", "1Q"], "--sizes: bad size '1Q'"),
        (["bench", "--sizes", "4K:1K"], "MIN is larger than MAX"),
        (["bench", "--sizes", "1K:4K:1"], "bad size factor"),
        (["bench", "--ops", "all_reduce,nope"], "--ops: unknown op(s) nope"),
        (["check", "--only", "nope"], "--only: unknown check(s) nope"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, argv, needle):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hwdist {argv[0]}: error: ") and needle in err[0]


def test_bad_nproc_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["check", "-n", "0"])
    assert info.value.code == 2
    assert "-n/--nproc: expected a positive integer, got '0'" in capsys.readouterr().err


def test_an_unavailable_override_variable_is_a_usage_error(capsys, monkeypatch):
    name = unavailable_backend()
    monkeypatch.setenv("HWDIST_BACKEND", name)
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert f"HWDIST_BACKEND='{name}'" in err and "Fix: unset the variable or pass --backend" in err


def test_parse_sizes():
    assert cli_bench.parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert cli_bench.parse_sizes("1K:1M:32") == [1024, 32768, 1048576]
    assert cli_bench.parse_sizes("8, 1k ,2MiB,1G") == [8, 1024, 2 << 20, 1 << 30]
    assert cli_bench.parse_sizes("256M") == [256 << 20]


def test_bus_factor_matches_nccl_tests():
    assert cli_bench.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert cli_bench.bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert cli_bench.bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert cli_bench.bus_factor("broadcast", 8) == 1.0
    assert cli_bench.bus_factor("all_reduce", 1) == 0.0
