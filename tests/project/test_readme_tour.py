"""The README tour's code block, as written, in both modes; every print is checked against its comment.

A ``print(...)  # TEXT`` line must print exactly ``TEXT`` (``...`` in the
comment stands for any text). ``python tour.py`` runs the spawned-ranks branch
(``run_distributed(work, 2, "mycl")``), ``torchrun`` the launcher branch, where
each of the 2 ranks prints every line.
"""

from __future__ import annotations

import pytest

import os
import re
import subprocess
import sys
from pathlib import Path

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TORCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
)


def _tour() -> str:
    text = (ROOT / "README.md").read_text()
    return re.search(r"## A short tour\n\n```python\n(.*?)```", text, flags=re.S).group(1)


CPU_ONLY = "on a CPU-only machine: "


def _as_detected_here(text: str) -> str:
    """The comment's CPU-only detection, rewritten for this machine's (a GPU host detects nccl/cuda)."""
    code = "import hwdist; d = hwdist.detect(); print(d.device_type, d.backend)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120
    )
    device_type, backend = out.stdout.split()
    return text.replace("device_type='cpu'", f"device_type={device_type!r}").replace(
        "backend='gloo'", f"backend={backend!r}"
    )


def _env() -> dict[str, str]:
    """The tour's environment: no launcher variables, no HWDIST_* overrides, the checkout importable."""
    env = {k: v for k, v in os.environ.items() if k not in TORCH_VARS and not k.startswith("HWDIST_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _expected(code: str) -> list[tuple[str, re.Pattern]]:
    """(print call, pattern of what it prints) for every commented print line, in order."""
    out = []
    for line in code.splitlines():
        m = re.match(r"\s*(print\(.*\))\s+# (.*)$", line)
        if m:
            text = m.group(2).strip()
            if text.startswith(CPU_ONLY):  # what a CPU-only machine prints; this machine may differ
                text = _as_detected_here(text[len(CPU_ONLY) :])
            pattern = ".*".join(re.escape(part) for part in text.split("..."))
            out.append((m.group(1), re.compile(pattern + r"\Z")))
    return out


def _run(tmp_path: Path, argv: list[str]) -> list[str]:
    (tmp_path / "tour.py").write_text(_tour())
    proc = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("*")]


def test_tour_block_has_commented_prints_for_both_branches():
    prints = [call for call, _ in _expected(_tour())]
    assert 'print(run_distributed(work, 2, "mycl"))' in prints
    assert "print(dist.get_backend(), work())" in prints
    assert 'backend="mycl"' in _tour()


def test_tour_spawned_ranks_print_what_the_comments_say(tmp_path):
    expected = _expected(_tour())
    lines = _run(tmp_path, [sys.executable, "tour.py"])
    # every print but the torchrun branch's, in order
    wanted = [(call, pat) for call, pat in expected if call != "print(dist.get_backend(), work())"]
    assert len(lines) == len(wanted), lines
    for line, (call, pat) in zip(lines, wanted):
        assert pat.match(line), f"{call} printed {line!r}, its comment says {pat.pattern!r}"


def test_tour_under_torchrun_prints_what_the_comments_say(tmp_path):
    expected = _expected(_tour())
    logs = tmp_path / "logs"
    _run(
        tmp_path,
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--redirects", "3", "--log-dir", str(logs), "tour.py"],
    )  # fmt: skip
    wanted = [(call, pat) for call, pat in expected if "run_distributed" not in call]
    outputs = sorted(logs.rglob("stdout.log"))
    assert len(outputs) == 2, outputs  # one per rank, so the ranks' lines cannot interleave
    for out in outputs:
        lines = [ln for ln in out.read_text().splitlines() if ln.strip()]
        assert len(lines) == len(wanted), lines
        for line, (call, pat) in zip(lines, wanted):
            assert pat.match(line), f"{out}: {call} printed {line!r}, its comment says {pat.pattern!r}"
