"""The Python path of a pass-through collective: hwdist's per-call CPU time over raw torch.distributed.

One gloo rank (hwdist.testing.RankPool), so there is no communication noise:
each pass-through case (``all_reduce``, ``broadcast``, ``all_gather(same_shape=True)``
on a 4 KiB tensor) is timed interleaved against the raw torch.distributed call,
in four modes: torch's call as it is ("real") or replaced by a no-op ("stub":
what is left is pure Python, hwdist's and the raw call's own argument
handling), each
with the flight recorder on (the default) and off. The rows give
the medians and minimums per call and the overhead (hwdist - raw) in
microseconds.

A fifth mode, "cold" (``all_reduce`` and ``broadcast``), is the real call
with the caches evicted between calls (a 2 MiB tensor, about one core's L2
cache, is written before each call) and each call's own thread CPU time read
around it. That is what the call costs in a
training loop, where the backend's threads and the model run between two
collectives: the per-call Python costs two to three times what the warm loop
says, and close to what a 2-rank loop on a quiet 16-core host measures
(docs/benchmarks.md). Its overhead is the median of the paired per-sample
differences. Nothing here asserts a speed.

The cold mode also times ``all_reduce_dict`` of 20 scalar metrics
(``verify=True`` and ``verify=False``) on two gloo ranks (on one rank it
communicates nothing) against the hand-flattened ``torch.stack`` +
``all_reduce`` + ``unbind``, with the hand-flattened code against itself as
the control row, and the hand-flattened code after a 10-integer
``all_reduce`` (what one more small collective costs by itself, the size of
the check ``verify=True`` adds); ``--dict`` runs only those rows.
``--against CHECKOUT`` adds the same two calls of another version (the
``hwdist`` package of a checkout, loaded in the same rank processes under
another name), interleaved with this version's: a comparison of two
versions without the drift between two separate runs.

Usage::

    python -m benchmarks.bench_entry [--quick] [--dict] [--against CHECKOUT] [--json PATH]
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as tdist

import hwdist
from hwdist import registry
from hwdist.collectives import call_entry

from ._common import bench_main, fmt_us


def _local(cases: dict[str, Callable[[], Any]], iters: int, samples: int) -> dict[str, list[float]]:
    """Per-call seconds of each case, interleaved (the order alternates each sample; one warm-up round)."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for s in range(samples + 1):
        for name in cases if s % 2 == 0 else reversed(list(cases)):
            fn = cases[name]
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            if s:
                times[name].append((time.perf_counter() - t0) / iters)
    return times


def bench_rank(quick: bool) -> list[dict[str, Any]]:
    """Every (op, mode) row on this one-rank group."""
    t = torch.ones(1024)
    ws = tdist.get_world_size()
    iters, samples = (500, 7) if quick else (2000, 31)
    ops = {
        "all_reduce": (lambda: hwdist.all_reduce(t), lambda: tdist.all_reduce(t)),
        "broadcast": (lambda: hwdist.broadcast(t, 0), lambda: tdist.broadcast(t, 0)),
        "all_gather same_shape=True": (
            lambda: hwdist.all_gather(t, same_shape=True),
            lambda: tdist.all_gather([torch.empty_like(t) for _ in range(ws)], t),
        ),
    }
    patched = ("all_reduce", "broadcast", "all_gather", "get_world_size")
    real = {name: getattr(tdist, name) for name in patched}
    recorder = call_entry.recorder()
    rows = []
    for stub in (False, True):
        for flight in (True, False):
            if stub:  # torch's collective a no-op; a world of 2 so that all_gather takes its 2-rank path
                for name in ("all_reduce", "broadcast", "all_gather"):
                    setattr(tdist, name, lambda *a, **k: None)
                tdist.get_world_size = lambda group=None: 2  # type: ignore[assignment]
                ws = 2
            call_entry.set_recorder(recorder if flight else None)
            try:
                if stub:  # a new registry generation: a fresh default-group view, whose cached size reads 2
                    registry.clear_cache()
                for op, (hw, raw) in ops.items():
                    times = _local({"hw": hw, "raw": raw}, iters, samples)
                    a, b = times["hw"], times["raw"]
                    rows.append({
                        "case": f"{op}, torch {'stubbed' if stub else 'real'},"
                                f" flight recorder {'on' if flight else 'off'}",
                        "hwdist_median_us": statistics.median(a) * 1e6,
                        "hwdist_min_us": min(a) * 1e6,
                        "raw_median_us": statistics.median(b) * 1e6,
                        "raw_min_us": min(b) * 1e6,
                        "overhead_median_us": (statistics.median(a) - statistics.median(b)) * 1e6,
                        "overhead_min_us": (min(a) - min(b)) * 1e6,
                    })
            finally:
                call_entry.set_recorder(recorder)
    for name, fn in real.items():
        setattr(tdist, name, fn)
    registry.clear_cache()
    return rows


#: Bytes written between two calls in the cold mode (about one core's L2 cache on the hosts we measure).
COLD_BYTES = 2 << 20


def _cold(cases: dict[str, Callable[[], Any]], iters: int, samples: int) -> dict[str, list[float]]:
    """Per-call thread CPU seconds of each case, the caches evicted before each call (interleaved)."""
    junk = torch.zeros(COLD_BYTES // 4)
    clock = time.thread_time_ns
    times: dict[str, list[float]] = {k: [] for k in cases}
    for s in range(samples + 1):
        for name in cases if s % 2 == 0 else reversed(list(cases)):
            fn, spent = cases[name], 0
            for _ in range(iters):
                junk.add_(1.0)
                t0 = clock()
                fn()
                spent += clock() - t0
            if s:
                times[name].append(spent / iters * 1e-9)
    return times


def bench_cold(quick: bool) -> list[dict[str, Any]]:
    """The real one-rank calls with cold caches: hwdist (recorder on and off) against raw, paired."""
    t = torch.ones(1024)
    iters, samples = (100, 7) if quick else (200, 31)
    recorder = call_entry.recorder()

    def recorder_off(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            call_entry.set_recorder(None)
            try:
                return fn()
            finally:
                call_entry.set_recorder(recorder)

        return call

    # no all_gather: on one rank hwdist returns [data] without calling torch, so its row would compare
    # nothing with a real call
    ops = {
        "all_reduce": (lambda: hwdist.all_reduce(t), lambda: tdist.all_reduce(t)),
        "broadcast": (lambda: hwdist.broadcast(t, 0), lambda: tdist.broadcast(t, 0)),
    }
    rows = []
    for op, (hw, raw) in ops.items():
        times = _cold({"raw": raw, "raw again": raw, "hw": hw, "hw off": recorder_off(hw)}, iters, samples)
        base = times["raw"]
        for label, key in (("control: raw again", "raw again"), ("flight recorder on", "hw"),
                           ("flight recorder off", "hw off")):
            rows.append(_paired_row(f"{op}, torch real, cold caches, {label}", times[key], base))
    return rows


def bench_cold_dict(quick: bool) -> list[dict[str, Any]]:
    """all_reduce_dict of 20 scalar metrics with cold caches against the hand-flattened raw code, paired."""
    rank = tdist.get_rank()
    metrics = {f"metric_{i:02d}": torch.tensor(float(i + rank)) for i in range(20)}

    def raw() -> None:
        keys = sorted(metrics)
        flat = torch.stack([metrics[k] for k in keys])
        tdist.all_reduce(flat)
        for k, v in zip(keys, flat.unbind(0)):
            metrics[k] = v

    words = torch.zeros(10, dtype=torch.int32)

    def raw_checked() -> None:  # what one more small collective costs by itself (a 10-int MAX first)
        tdist.all_reduce(words, tdist.ReduceOp.MAX)
        raw()

    iters, samples = (50, 7) if quick else (100, 31)
    cases = {
        "raw": raw,
        "raw again": lambda: raw(),
        "raw checked": raw_checked,
        "verify=True": lambda: hwdist.all_reduce_dict(metrics),
        "verify=False": lambda: hwdist.all_reduce_dict(metrics, verify=False),
    }
    labels = {
        "raw again": "control: hand-flattened again",
        "raw checked": "control: hand-flattened after a 10-int all_reduce",
        "verify=True": "verify=True",
        "verify=False": "verify=False",
    }
    other = _against()
    if other is not None:  # the other version's calls, interleaved with this one's in the same ranks
        cases["against True"] = lambda: other.all_reduce_dict(metrics)
        cases["against False"] = lambda: other.all_reduce_dict(metrics, verify=False)
        labels["against True"] = "--against's version, verify=True"
        labels["against False"] = "--against's version, verify=False"
    times = _cold(cases, iters, samples)
    base = times["raw"]
    case = "all_reduce_dict 20 metrics, 2 ranks, cold caches, "
    rows = [_paired_row(case + text, times[label], base) for label, text in labels.items()]
    for mine, theirs in (("verify=True", "against True"), ("verify=False", "against False")):
        if theirs in times:  # this version's calls against the other's, paired sample by sample
            text = f"{mine}: this version against --against's (raw columns: --against's)"
            rows.append(_paired_row(case + text, times[mine], times[theirs]))
    return rows


def _paired_row(case: str, a: list[float], base: list[float]) -> dict[str, Any]:
    """A table row: ``a``'s and ``base``'s medians and minimums, and the paired median of their
    per-sample differences (seconds in, microseconds out)."""
    return {
        "case": case,
        "hwdist_median_us": statistics.median(a) * 1e6,
        "hwdist_min_us": min(a) * 1e6,
        "raw_median_us": statistics.median(base) * 1e6,
        "raw_min_us": min(base) * 1e6,
        "overhead_median_us": statistics.median(x - y for x, y in zip(a, base)) * 1e6,
        "overhead_min_us": (min(a) - min(base)) * 1e6,
    }


def bench_all(quick: bool) -> list[dict[str, Any]]:
    """The warm modes, then the cold one."""
    return bench_rank(quick) + bench_cold(quick)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| case | hwdist median | hwdist min | raw median | raw min | overhead (medians; cold: paired) |"
        " overhead (mins) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {fmt_us(r['hwdist_median_us'])} | {fmt_us(r['hwdist_min_us'])} |"
            f" {fmt_us(r['raw_median_us'])} | {fmt_us(r['raw_min_us'])} |"
            f" {r['overhead_median_us']:.2f} us | {r['overhead_min_us']:.2f} us |"
        )
    return "\n".join(lines)


#: Where ``--against``'s renamed copy lies (set in the parent, read in the ranks).
AGAINST_ENV = "HWDIST_BENCH_AGAINST"


def _against() -> Any:
    """The ``--against`` version's package (``hwdist_against``) in this rank, or None."""
    where = os.environ.get(AGAINST_ENV)
    if not where:
        return None
    sys.path.insert(0, where)
    return importlib.import_module("hwdist_against")


def _renamed_copy(checkout: str, into: str) -> None:
    """``checkout``'s ``hwdist`` package copied into ``into`` as ``hwdist_against`` (every whole-word
    ``hwdist`` in its sources renamed), so that both versions load in one process."""
    src = os.path.join(checkout, "hwdist")
    if not os.path.isfile(os.path.join(src, "__init__.py")):
        raise SystemExit(f"--against: {checkout!r} holds no hwdist package (expected {src}/__init__.py)")
    dst = os.path.join(into, "hwdist_against")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for root, _, files in os.walk(dst):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                with open(path, "w", encoding="utf-8") as f:
                    f.write(re.sub(r"\bhwdist\b", "hwdist_against", text))


def main(argv: list[str]) -> int:
    """Run the benchmark and print the table (and write JSON if asked)."""
    if "--against" in argv:  # --against CHECKOUT: the --dict rows of another version, in the same ranks
        i = argv.index("--against")
        if i + 1 >= len(argv):
            raise SystemExit("--against needs a checkout's directory (one that holds hwdist/)")
        checkout, argv = argv[i + 1], argv[:i] + argv[i + 2 :] + ["--dict"]
        with tempfile.TemporaryDirectory(prefix="hwdist-against-") as tmp:
            _renamed_copy(checkout, tmp)
            os.environ[AGAINST_ENV] = tmp
            try:
                return main(argv)
            finally:
                del os.environ[AGAINST_ENV]
    if "--dict" in argv:
        argv = [a for a in argv if a != "--dict"]
        return bench_main(argv, __doc__.splitlines()[0], [(2, bench_cold_dict)], format_table)
    return bench_main(argv, __doc__.splitlines()[0], [(1, bench_all), (2, bench_cold_dict)], format_table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
