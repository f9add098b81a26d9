"""Packaging: the top-level layout, and the README's advice for the one directory that shadows it.

The package sits at ``hwdist/`` at the top of the checkout. A script started
from the folder that holds a clone named ``hwdist`` sees the clone as a
namespace package before an editable install's import hook is asked, so
``hwdist.register_backend`` is missing there. The README gives one line of
advice (start the script elsewhere, or install the editable package in
``compat`` mode); these tests reproduce the situation and check that advice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROBE = "import hwdist; print(hwdist.__file__); hwdist.register_backend; print(hwdist.__version__)"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(python: str, cwd: Path, code: str = PROBE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-c", code], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=120
    )


def _installed(cwd: Path) -> bool:
    code = "import hwdist, sys; sys.exit(0 if hwdist.__file__ else 3)"
    return _run(sys.executable, cwd, code).returncode == 0


def test_the_package_sits_at_the_top_of_the_checkout():
    for name in ("pyproject.toml", "hwdist/__init__.py", "tests", "ci", "docs", "README.md"):
        assert (ROOT / name).exists(), name
    assert not (ROOT / "src").exists()
    assert 'where = ["."]' in (ROOT / "pyproject.toml").read_text()


def test_the_readme_names_the_advice_for_the_clones_parent():
    readme = (ROOT / "README.md").read_text()
    assert "editable_mode=compat" in readme
    assert "folder that holds the clone" in readme


def test_a_script_started_elsewhere_imports_the_install(tmp_path):
    if not _installed(tmp_path):
        pytest.skip("hwdist is not installed in this interpreter (pip install -e .); nothing to check")
    proc = _run(sys.executable, tmp_path)
    assert proc.returncode == 0, proc.stderr  # the probe reads hwdist.register_backend: the real package
    assert proc.stdout.splitlines()[0].endswith("__init__.py"), proc.stdout


def test_compat_mode_imports_the_real_package_from_the_clones_parent(tmp_path):
    """The README's advice for that folder: a compat-mode editable install puts the checkout on sys.path."""
    if not _installed(tmp_path):
        pytest.skip("hwdist is not installed in this interpreter (pip install -e .); torch is needed")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    # The venv has no pip of its own: the running interpreter's pip installs into it (--python).
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-build-isolation",
         "-e", str(ROOT), "--config-settings", "editable_mode=compat"],
        env=_clean_env(), capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0 and "no such option: --python" in proc.stderr:
        pytest.skip("this pip cannot install into another environment (--python needs pip >= 22.3)")
    assert proc.returncode == 0, proc.stderr
    parent = tmp_path / "parent"
    clone = parent / "hwdist"
    (clone / "hwdist").mkdir(parents=True)
    (clone / "hwdist" / "__init__.py").write_text("raise SystemExit('the clone was imported')\n")
    # Started in the clone's parent, a default editable install's hook comes after the namespace package.
    proc = _run(py, parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(ROOT / "hwdist")), proc.stdout
