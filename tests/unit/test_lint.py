"""ruff's error and bug rules (configured in pyproject.toml) hold for the whole tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    if shutil.which("ruff") is None and subprocess.run(
        [sys.executable, "-m", "ruff", "--version"], capture_output=True
    ).returncode != 0:
        pytest.skip("ruff is not installed (it comes with the 'test' extra)")
    cmd = [sys.executable, "-m", "ruff", "check", "hwdist", "tests", "benchmarks"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
