"""Packaging: no working directory can shadow the installed package (issue 19).

The reported failure: from the parent of a clone named ``hwdist``, ``import
hwdist`` found the clone directory (a namespace package) instead of the
editable install, and ``hwdist.register_backend`` was missing. With the ``src/``
layout the clone directory holds no ``hwdist`` package at its top, so the
installed one is found. The test reproduces the situation: a directory named
``hwdist`` shaped like a clone (``src/hwdist/__init__.py`` inside it), and the
interpreter started in its parent with no PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _installed(cwd: Path) -> bool:
    code = "import hwdist, sys; sys.exit(0 if getattr(hwdist, '__file__', None) else 3)"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=_clean_env()).returncode == 0


def test_the_package_lives_under_src():
    assert (ROOT / "src" / "hwdist" / "__init__.py").is_file()
    assert not (ROOT / "hwdist").exists(), "a top-level hwdist/ shadows the install from the parent directory"
    assert 'where = ["src"]' in (ROOT / "pyproject.toml").read_text()


def test_a_clone_named_hwdist_does_not_shadow_the_install(tmp_path):
    if not _installed(tmp_path):
        pytest.skip("hwdist is not installed in this interpreter (pip install -e .); nothing to shadow")
    clone = tmp_path / "hwdist"
    (clone / "src" / "hwdist").mkdir(parents=True)
    (clone / "src" / "hwdist" / "__init__.py").write_text("raise SystemExit('the clone was imported')\n")
    (clone / "README.md").write_text("a clone\n")
    code = "import hwdist; print(hwdist.__file__); hwdist.register_backend; print(hwdist.__version__)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_clean_env(),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert not proc.stdout.startswith(str(clone)), proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "hwdist", "--help"], cwd=tmp_path, env=_clean_env(),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), proc.stderr
