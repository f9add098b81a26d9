"""Fuzzing the restricted unpickler for about a minute: no signal, no code run, no global changed.

The fuzzer (tests/unit/restricted_fuzz.py, hypothesis) runs in a child
process, so a crash fails this test instead of killing the suite, and the
child writes each payload to a file before loading it, so a crash names the
payload. ``HWDIST_FUZZ_SECONDS`` sets the budget (default 45 s of fuzzing;
the child's start-up and the last round come on top).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = pytest.mark.slow

FUZZ_SECONDS = float(os.environ.get("HWDIST_FUZZ_SECONDS", "45"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(FUZZ_SECONDS + 180)
def test_fuzzed_payloads_never_crash_run_code_or_change_globals(tmp_path):
    pytest.importorskip("hypothesis", reason="the fuzzer needs hypothesis (in the test extra)")
    marker, current = str(tmp_path / "pwned"), str(tmp_path / "current.bin")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.restricted_fuzz", marker, str(FUZZ_SECONDS), current],
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS + 150,
        cwd=ROOT,
    )
    if proc.returncode < 0:
        payload = (
            open(current, "rb").read() if os.path.exists(current) else "(none yet: it died while starting)"
        )
        pytest.fail(
            f"the restricted unpickler died by {signal.Signals(-proc.returncode).name} on payload"
            f" {payload!r}\n{proc.stderr[-3000:]}"
        )
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert not os.path.exists(marker)
    examples = int(proc.stdout.split("fuzzed ")[1].split()[0])
    assert examples >= 300, proc.stdout  # at least one round of each kind
