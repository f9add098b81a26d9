"""What the hang watchdog's tick costs where it reads torch's own flight-recorder ring.

Each tick, the watchdog asks torch for its ring (``_dump_fr_trace_json``: torch writes the whole ring
out as JSON) to find a torch collective in flight for longer than ``HWDIST_HANG_TIMEOUT``
(docs/debugging-hangs.md). The cost grows with the ring, not with the job: this fills torch's ring
(2,500 one-element ``all_reduce`` calls on one rank; torch keeps the last ``TORCH_FR_BUFFER_SIZE``,
2,000 by default) and times that look, as the thread's CPU time, 7 times. The second row adds a group
of the hwdist torch backend (torch >= 2.15), whose calls torch records in a ring of its own: then
there are two rings to read.

Usage: ``python -m benchmarks.bench_torch_ring [--quick]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist


def _times(calls: int, wrapper: bool) -> list[float]:
    """CPU ms of each look, after ``calls`` calls on the default group (and on a wrapper group)."""
    import hwdist.backend
    from hwdist.flight import torch_fr

    spec = hwdist.backend.register(wraps="gloo") if wrapper else None
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            groups = [None] + ([dist.new_group(backend=spec)] if wrapper else [])
            t = torch.ones(1)
            for group in groups:
                for _ in range(calls):
                    dist.all_reduce(t, group=group)
            out = []
            for _ in range(7):
                c0 = time.thread_time()
                torch_fr.overdue(300.0, time.time(), set())
                out.append((time.thread_time() - c0) * 1e3)
            return out
        finally:
            dist.destroy_process_group()


def main(argv: list[str]) -> int:
    from hwdist.backend import unsupported_reason
    from hwdist.flight import torch_fr

    if not torch_fr.available():
        print(f"torch {torch.__version__} has no flight recorder: the tick reads no ring", file=sys.stderr)
        return 0
    calls = 500 if "--quick" in argv else 2500
    rows = [("gloo's ring", False)]
    if unsupported_reason() is None:
        rows.append(("gloo's ring and the hwdist backend's", True))
    size = os.environ.get("TORCH_FR_BUFFER_SIZE", "2000 (default)")
    head = f"torch {torch.__version__}, {os.cpu_count()} cores; {calls} calls a group"
    print(f"{head}; TORCH_FR_BUFFER_SIZE {size}")
    print()
    print("| rings read | CPU per look (min) | (median) |")
    print("|---|---:|---:|")
    for name, wrapper in rows:
        ms = _times(calls, wrapper)
        print(f"| {name} | {min(ms):.1f} ms | {statistics.median(ms):.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
