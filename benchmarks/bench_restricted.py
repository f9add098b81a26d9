"""Decode time of the restricted unpickler against plain pickle, one process (no ranks).

Usage::

    python -m benchmarks.bench_restricted [--quick]

Each case is encoded once with hwdist's default serializer and decoded
(best of 5) with ``PickleSerializer`` and with ``RestrictedPickleSerializer``
from the same frame. Nothing here asserts a speed.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

import numpy as np
import torch

from hwdist import serialization as ser


def cases() -> dict[str, Any]:
    return {
        "20k result dicts (one collect_results chunk)": [
            {"idx": i, "score": i * 0.5, "label": f"c{i % 10}", "box": [1.0, 2.0, 3.0, 4.0]}
            for i in range(20_000)
        ],
        "32 MiB numpy array (out of band)": {"a": np.ones(4 << 20)},
        "1,000 small arrays (4 x 4 float32)": [np.ones((4, 4), np.float32) for _ in range(1000)],
        "1,000 small tensors (16 float32)": [torch.ones(16) for _ in range(1000)],
    }


def best_decode(data: np.ndarray, serializer: ser.Serializer, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        buf = data.copy()
        t = time.perf_counter()
        ser.decode(buf, serializer=serializer)
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    repeat = 2 if "--quick" in args else 5
    plain, restricted = ser.PickleSerializer(), ser.RestrictedPickleSerializer()
    print("| case | frame | pickle | restricted | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, obj in cases().items():
        data = ser.encode(obj).to_numpy()
        a, b = best_decode(data, plain, repeat), best_decode(data, restricted, repeat)
        print(
            f"| {name} | {data.nbytes / 2**20:.2f} MiB | {a * 1e3:.2f} ms | {b * 1e3:.2f} ms | {b / a:.1f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
