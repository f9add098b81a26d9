"""Run every benchmark module ``benchmarks/bench_*.py``, one after the other.

Usage (from the repository root)::

    python -m benchmarks.run            # all benchmarks, full size
    python -m benchmarks.run --quick    # smaller sizes, fewer samples
    python -m benchmarks.run tensor     # only bench_tensor.py (names filter)

Each module runs in its own Python process (``python -m benchmarks.bench_X``)
with the remaining arguments; a module must accept ``--quick``. The runner
is generic: a new ``bench_*.py`` file is picked up without changes here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover() -> list[str]:
    """Module names of every ``bench_*.py`` next to this file, sorted."""
    return sorted(p.stem for p in HERE.glob("bench_*.py"))


def main(argv: list[str]) -> int:
    """Run the selected benchmarks; returns the number of failed modules."""
    flags = [a for a in argv if a.startswith("-")]
    names = [a for a in argv if not a.startswith("-")]
    modules = [m for m in discover() if not names or any(n in m for n in names)]
    if not modules:
        print(f"no benchmark matches {names}; available: {', '.join(discover())}", file=sys.stderr)
        return 1
    root = HERE.parent
    env = dict(os.environ)
    paths = [str(root), env.get("PYTHONPATH", "")]  # the package and the benchmarks
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    failed = 0
    for mod in modules:
        print(f"\n=== {mod} {' '.join(flags)} ===", flush=True)
        start = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{mod}", *flags], cwd=root, env=env)
        print(
            f"=== {mod}: {'ok' if code == 0 else f'FAILED (exit {code})'}"
            f" in {time.perf_counter() - start:.1f}s ==="
        )
        failed += code != 0
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
