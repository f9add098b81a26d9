"""hwdist on a torch it does not support: importing works, the first call needing torch.distributed says why.

The real below-floor torch is not installed here, so these tests start a fresh interpreter that
pretends to be one (``torch.__version__`` or ``torch.distributed.is_available`` replaced before hwdist
is imported): that is the one fake, for a torch build we do not have. Every supported version is
run for real by ci/versions.sh.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = """
import torch, torch.distributed
{pretend}
import hwdist  # must work
print("imported")
try:
    hwdist.init_dist("pytorch", backend="gloo")
except Exception as exc:
    print(type(exc).__name__ + ": " + str(exc))
else:
    print("no error")
"""


def _run(pretend: str) -> list[str]:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    code = _SCRIPT.format(pretend=textwrap.dedent(pretend))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**_base_env(), **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


def _base_env() -> dict[str, str]:
    import os

    return {
        k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))
    }


def test_torch_older_than_the_floor_imports_and_init_names_version_and_floor():
    out = _run('torch.__version__ = "2.0.1+cpu"')
    assert out[0] == "imported"
    assert out[-1].startswith("BackendError: backend 'gloo' is not available here"), out
    assert "torch 2.0.1+cpu is older than hwdist's floor (torch >= 2.1)" in out[-1], out


def test_torch_without_distributed_imports_and_init_says_so():
    out = _run("torch.distributed.is_available = lambda: False")
    assert out[0] == "imported"
    assert "was built without torch.distributed" in out[-1] and "torch >= 2.1" in out[-1], out
