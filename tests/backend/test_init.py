"""hwdist.backend's switch: the spellings, registration on first use only, and the error on older torch.

Runs on every torch: before 2.15 the clear error naming the torch needed, from 2.15 registration.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

import hwdist
from hwdist import _compat
from hwdist import backend as hwbackend
from hwdist.errors import BackendError

ROOT = Path(__file__).resolve().parents[2]
NEED = ".".join(map(str, _compat.PYTHON_BACKENDS_TORCH))


@pytest.mark.parametrize(
    ("spelled", "wraps"),
    [
        ("hwdist", ""),
        ("hwdist:emu", "emu"),
        (" HWDIST : gloo ", "gloo"),
        ("gloo", None),
        ("cpu:hwdist", None),
    ],
)
def test_wrapped_name_reads_the_spelling(spelled, wraps):
    assert hwbackend.wrapped_name(spelled) == wraps


def test_importing_hwdist_registers_nothing_with_torch():
    code = (
        "import torch.distributed as d; before = set(d.Backend.backend_list);"
        " import hwdist, hwdist.backend;"
        " assert set(d.Backend.backend_list) == before, d.Backend.backend_list;"
        " assert hwdist.backend.registered_wraps() == {}; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@pytest.mark.skipif(_compat.PYTHON_BACKENDS, reason=f"torch {torch.__version__} has Python backends")
@pytest.mark.parametrize("how", ["register", "init_dist", "init_backend"])
def test_older_torch_raises_naming_the_torch_needed(how, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(BackendError) as info:
        if how == "register":
            hwbackend.register(wraps="gloo")
        elif how == "init_dist":
            hwdist.init_dist("pytorch", backend="hwdist:gloo")
        else:
            hwdist.init_backend("hwdist", rank=0, world_size=1, store=torch_dist.HashStore())
    text = str(info.value)
    assert f"torch >= {NEED}" in text and torch.__version__ in text and "HINT" in text, text
    assert not torch_dist.is_initialized()
    assert hwbackend.NAME not in torch_dist.Backend.backend_list


@pytest.mark.skipif(not _compat.PYTHON_BACKENDS, reason=f"needs torch >= {NEED} (Python backends)")
def test_unknown_wrapped_backend_raises_before_any_rendezvous():
    with pytest.raises(BackendError) as info:
        hwbackend.register(wraps="no-such-backend")
    assert "no-such-backend" in str(info.value) and "gloo" in str(info.value)  # the available ones listed
    with pytest.raises(BackendError, match="cannot wrap itself"):
        hwbackend.register(wraps="hwdist:gloo")


@pytest.mark.skipif(not _compat.PYTHON_BACKENDS, reason=f"needs torch >= {NEED} (Python backends)")
def test_register_returns_torch_backend_string_and_records_what_it_wraps():
    assert hwbackend.register(wraps="gloo") == "cpu:hwdist"
    assert hwbackend.registered_wraps()["cpu"] == "gloo"
    assert hwbackend.NAME in torch_dist.Backend.backend_list
    assert torch_dist.Backend.backend_capability[hwbackend.NAME] == ["cpu"]
