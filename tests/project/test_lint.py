"""ruff's rules hold for the whole tree; mypy finds no error in hwdist/ (configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    if shutil.which("ruff") is None and subprocess.run(
        [sys.executable, "-m", "ruff", "--version"], capture_output=True
    ).returncode != 0:
        pytest.skip("ruff is not installed (it comes with the 'test' extra)")
    cmd = [sys.executable, "-m", "ruff", "check", "hwdist", "tests", "benchmarks"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing_in_hwdist():
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not installed (it comes with the 'test' extra)")
    cmd = [sys.executable, "-m", "mypy", "hwdist"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout, proc.stdout + proc.stderr
