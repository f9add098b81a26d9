"""Broken or hostile driver plug-ins (``hwdist.drivers`` entry points) never break hwdist.

The plug-ins are a real installed package (a module per plug-in and a
``*.dist-info`` with ``entry_points.txt``) put on ``sys.path``. Entry points are
listed alphabetically, so each bad one comes before the good ``zzgood``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import hwdist
from hwdist import _plugins, registry
from hwdist.testing import run_distributed

ROOT = Path(__file__).resolve().parents[2]

MODULES = {
    "hwp_good": "import hwdist\n\nclass Good(hwdist.Driver):\n    device_type = 'cpu'\n",
    "hwp_notdriver": "class NotADriver:\n    pass\n",
    "hwp_prio": (
        "import hwdist\n\nclass High(hwdist.Driver):\n    device_type = 'cpu'\n    priority = 'high'\n"
    ),
    "hwp_exit": "raise SystemExit(3)\n",
    "hwp_interrupt": "raise KeyboardInterrupt\n",
    "hwp_printer": (
        "print('hello from a plug-in')\nimport hwdist\n\nclass P(hwdist.Driver):\n    device_type = 'cpu'\n"
    ),
    "hwp_missing": "import hwdist_no_such_dependency_xyz\n",
}
ENTRY_POINTS = {
    "aanotdriver": "hwp_notdriver:NotADriver",
    "abprio": "hwp_prio:High",
    "acexit": "hwp_exit:X",
    "adinterrupt": "hwp_interrupt:X",
    "aeprinter": "hwp_printer:P",
    "afmissing": "hwp_missing:X",
    "zzgood": "hwp_good:Good",
}
BAD = ["aanotdriver", "abprio", "acexit", "adinterrupt", "afmissing"]


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    for mod, text in MODULES.items():
        (tmp_path / f"{mod}.py").write_text(text)
    info = tmp_path / "hwdist_hostile_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hwdist-hostile-plugins\nVersion: 0.1\n")
    lines = "".join(f"{k} = {v}\n" for k, v in ENTRY_POINTS.items())
    (info / "entry_points.txt").write_text(f"[hwdist.drivers]\n{lines}")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(_plugins, "_failed", {})
    yield tmp_path
    for name in ENTRY_POINTS:
        if name in registry._drivers:
            hwdist.unregister_backend(name)
    for mod in MODULES:
        sys.modules.pop(mod, None)


def test_bad_plugins_warn_by_name_and_the_good_ones_still_load(plugins, capfd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = hwdist.list_backends()
    text = "\n".join(str(w.message) for w in caught)
    assert "zzgood" in first and "aeprinter" in first, first
    assert not set(BAD) & set(first), first
    assert "'aanotdriver'" in text and "must be a hwdist.Driver subclass or instance, got NotADriver" in text
    assert "'abprio'" in text and "priority must be a number, got 'high'" in text, text
    assert "'acexit'" in text and "SystemExit: 3" in text, text
    assert "'adinterrupt'" in text and "KeyboardInterrupt" in text, text
    assert hwdist.list_backends() == first  # later calls keep every plug-in
    hwdist.detect()  # no TypeError from a bad priority
    out, err = capfd.readouterr()
    assert "hello from a plug-in" not in out and "hello from a plug-in" in err
    with pytest.raises(hwdist.BackendError) as info:
        hwdist.get_driver("afmissing")
    msg = str(info.value)
    assert msg.startswith("unknown backend 'afmissing'; registered: "), msg
    assert "driver plug-in 'afmissing' failed to load: ModuleNotFoundError: No module named" in msg
    assert "hwdist_no_such_dependency_xyz" in msg, msg


def test_a_bad_priority_is_refused_at_registration():
    class Bad(hwdist.Driver):
        device_type = "cpu"
        priority = "high"  # type: ignore[assignment]

    for prio in ("high", None, True, float("nan")):
        Bad.priority = prio  # type: ignore[assignment]
        with pytest.raises(hwdist.BackendError, match="backend 'badprio': priority must be a number"):
            hwdist.register_backend("badprio", Bad)
    assert "badprio" not in hwdist.list_backends()


def test_hwdist_env_survives_hostile_plugins(plugins):
    env = {**os.environ, "PYTHONPATH": f"{plugins}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [sys.executable, "-m", "hwdist", "env", "--json"], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env=env,
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    data = json.loads(run.stdout)  # nothing a plug-in printed is mixed in
    assert "zzgood" in json.dumps(data)
    for name in ("aanotdriver", "abprio", "acexit", "adinterrupt", "afmissing"):
        assert f"entry point {name!r}" in run.stderr, (name, run.stderr[-3000:])
    assert "hello from a plug-in" in run.stderr


def _rank_with_plugins() -> list:
    import hwdist

    return [hwdist.get_rank(), "zzgood" in hwdist.list_backends(), hwdist.detect().backend]


@pytest.mark.slow
def test_ranks_start_and_detect_with_hostile_plugins_installed(plugins):
    ws = 2  # plug-ins load per process: two ranks show it, a third adds nothing
    env = {"PYTHONPATH": f"{plugins}{os.pathsep}{ROOT}"}
    results = run_distributed(_rank_with_plugins, ws, "gloo", timeout=90, env=env)
    assert [r[:2] for r in results] == [[q, True] for q in range(ws)], results
