"""Seconds from a hang to the report and to the job's end, with the hang doctor's settings as they are.

Starts the ranks of one scenario as separate processes (gloo over a file store), polls their
stderr every 0.1 s and prints, per run: when the stall began (the moment the last rank that will
ever arrive entered the collective that hangs, from the scenario's own log line), when the first
report appeared, and when each process exited, with its status. Nothing is set besides what the
command line passes, so with no option it measures the defaults (``HWDIST_HANG_TIMEOUT`` 300 s:
a run takes about 5.5 minutes).

Scenarios (programs in tests/programs): ``sleep`` (a late rank in Python; hwdist's all_reduce waits)
and ``csleep`` (the late rank in one long C call), from hang_scenarios.py; ``skip_backward`` and
``uneven`` (DDP loops that never call hwdist) from ddp_hang_programs.py. Usage::

    python -m benchmarks.hang_timing sleep [--timeout SECONDS] [--action raise|abort|report]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANG = ROOT / "tests" / "programs" / "hang_scenarios.py"
DDP = ROOT / "tests" / "programs" / "ddp_hang_programs.py"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=["sleep", "csleep", "skip_backward", "uneven"])
    p.add_argument("--timeout", help="HWDIST_HANG_TIMEOUT (default: unset, the default)")
    p.add_argument("--action", help="HWDIST_HANG_ACTION (default: unset, the default)")
    p.add_argument("--limit", type=float, default=900.0, help="kill the run after this many seconds")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="hwdist-hang-timing-"))
    (tmp / "logs").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWDIST_HANG_")}
    env.update(
        PYTHONPATH=str(ROOT), HANG_LOGS=str(tmp / "logs"), HWDIST_FLIGHT_DIR=str(tmp / "flight"),
        GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"), OMP_NUM_THREADS="1", HANG_SLEEP="100000",
        # the programs' own limits out of the way: torch's default process-group timeout for gloo, and a
        # rank that finished its loop waits as long as the run may take
        HANG_PG_TIMEOUT="1800", HANG_IDLE=str(args.limit),
    )
    if args.timeout:
        env["HWDIST_HANG_TIMEOUT"] = args.timeout
    if args.action:
        env["HWDIST_HANG_ACTION"] = args.action
    if args.scenario in ("sleep", "csleep"):
        cmd = [sys.executable, str(HANG), args.scenario, "gloo", str(tmp / "store")]
    else:
        cmd = [sys.executable, str(DDP), args.scenario, str(tmp / "store")]
    procs = [
        subprocess.Popen(cmd, env={**env, "RANK": str(r), "WORLD_SIZE": "2"}, cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for r in range(2)
    ]
    logs = [tmp / "logs" / f"rank{r}.err" for r in range(2)]
    reported: "float | None" = None
    exits: dict[int, float] = {}
    stop = time.time() + args.limit
    while len(exits) < 2 and time.time() < stop:
        now = time.time()
        if reported is None and any(f.exists() and "hwdist hang doctor: rank" in f.read_text() for f in logs):
            reported = now
        for r, proc in enumerate(procs):
            if r not in exits and proc.poll() is not None:
                exits[r] = now
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    texts = [f.read_text() if f.exists() else "" for f in logs]
    starts = [float(m.group(1)) for t in texts for m in [re.search(r"started at ([\d.]+)", t)] if m]
    stalled = max(starts) if starts else float("nan")
    print(f"scenario {args.scenario}, HWDIST_HANG_TIMEOUT={args.timeout or 'default'},"
          f" HWDIST_HANG_ACTION={args.action or 'default'}; logs in {tmp}")
    print(f"  report: {reported - stalled:.1f} s after the stall" if reported else "  no report")
    for r in sorted(exits):
        after = f", {exits[r] - reported:.1f} s after the report" if reported else ""
        status = procs[r].returncode
        print(f"  rank {r}: exit status {status}, {exits[r] - stalled:.1f} s after the stall{after}")
    for r in range(2):
        if r not in exits:
            print(f"  rank {r}: still running after {args.limit:g} s (killed)")
    diag = re.findall(r"^diagnosis: (.*)$", texts[0], re.M)
    if diag:
        print(f"  diagnosis: {diag[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
