"""``hwdist bench``: an nccl-tests-style sweep with a correctness column, on hwdist, raw torch, or both.

For each op and size every rank times ``--iters`` calls on zero-filled
buffers, then runs the op once more on fresh data built from the rank
numbers (each element 0, 1 or 2) and counts the elements that differ from
the value computed independently (``#wrong``, as nccl-tests reports it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import time
from typing import Any, Callable, Sequence, TextIO

import torch

from . import settings
from .cli_ranks import UsageError, choose_backend
from .cli_ranks import report_stream, startup_failure

__all__ = [
    "BENCH_OPS",
    "DEFAULT_BENCH_OPS",
    "DEFAULT_SIZES",
    "INJECT_ENV",
    "bus_factor",
    "parse_sizes",
    "bench_step",
    "cmd_bench",
]

#: Test hook: ``OP`` makes the last rank corrupt one element of OP's checked result (``#wrong`` must show it).
INJECT_ENV = "HWDIST_BENCH_INJECT"

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)

#: Ops ``hwdist bench`` knows, with nccl-tests' bus-bandwidth factor as a function of n.
_BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
BENCH_OPS = tuple(_BUS_FACTORS)
DEFAULT_BENCH_OPS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
DEFAULT_SIZES = "1K:4M:4"


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for ``op`` on ``world_size`` ranks.

    Examples:
        >>> bus_factor("all_reduce", 4)
        1.5
    """
    return _BUS_FACTORS[op](world_size)


def _parse_size(text: str) -> int:
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}; expected a number with an optional K, M or G suffix, e.g. 64K")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1 or value != int(value):
        raise ValueError(f"bad size {text!r}: must be a whole number of bytes >= 1")
    return int(value)


def parse_sizes(spec: str) -> list[int]:
    """Byte sizes from ``MIN:MAX[:FACTOR]`` (geometric, factor 2 by default) or ``A,B,C``.

    Examples:
        >>> parse_sizes("1K:8K")
        [1024, 2048, 4096, 8192]
    """
    spec = spec.strip()
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"bad size range {spec!r}; expected MIN:MAX or MIN:MAX:FACTOR, e.g. 1K:256M")
        lo, hi = _parse_size(parts[0]), _parse_size(parts[1])
        try:
            factor = float(parts[2]) if len(parts) == 3 else 2.0
        except ValueError:
            raise ValueError(f"bad size factor {parts[2]!r}; expected a number > 1") from None
        if factor <= 1:
            raise ValueError(f"bad size factor {parts[2]!r}; expected a number > 1")
        if lo > hi:
            raise ValueError(f"bad size range {spec!r}: MIN is larger than MAX")
        sizes = []
        size = float(lo)
        while size <= hi * (1 + 1e-9):
            sizes.append(int(round(size)))
            size *= factor
        return sizes
    sizes = [_parse_size(p) for p in spec.split(",") if p.strip()]
    if not sizes:
        raise ValueError("no sizes given; expected e.g. 1K:256M or 1K,1M")
    return sizes


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}" if unit == "B" else f"{nbytes:.4g} {unit}"
        nbytes /= 1024
    return f"{nbytes} B"


# --------------------------------------------------------------------------
# rank side
# --------------------------------------------------------------------------


def _pattern(rank: int, count: int, shift: int = 0) -> torch.Tensor:
    """Rank ``rank``'s data: 0, 1, 2, 0, ... starting at ``rank + shift`` (float64, CPU)."""
    return ((torch.arange(count, dtype=torch.int64) + rank + shift) % 3).to(torch.float64)


Case = tuple[Callable[[], Any], Callable[[Any], list[torch.Tensor]], Callable[[], list[torch.Tensor]]]


def _case(op: str, impl: str, count: int, dtype: torch.dtype, fill: bool) -> Case:
    """``(call, outputs(ret), expected())`` for one ``op`` on ``count`` elements (the message size).

    ``fill``: inputs from [`_pattern`][hwdist.cli_bench._pattern] (the correctness pass), else zeros (the
    timed calls).
    """
    import torch.distributed as tdist

    import hwdist

    n, rank = hwdist.get_world_size(), hwdist.get_rank()
    dev = hwdist.get_comm_device()
    per = count // n
    fn = getattr(hwdist, op) if impl == "hwdist" else None

    def data(r: int, k: int, shift: int = 0) -> torch.Tensor:
        src = _pattern(r, k, shift) if fill else torch.zeros(k, dtype=torch.float64)
        return src.to(dtype).to(dev)

    def total(k: int, shift: int = 0) -> torch.Tensor:
        return sum((_pattern(q, k, shift) for q in range(n)), torch.zeros(k, dtype=torch.float64))

    if op in ("all_reduce", "broadcast", "reduce"):
        x = data(rank, count)
        if op == "all_reduce":
            call = (lambda: fn(x)) if fn else (lambda: tdist.all_reduce(x))
            return call, lambda _r: [x], lambda: [total(count)]
        if op == "broadcast":
            call = (lambda: fn(x, src=0)) if fn else (lambda: tdist.broadcast(x, 0))
            return call, lambda _r: [x], lambda: [_pattern(0, count)]
        call = (lambda: fn(x, dst=0)) if fn else (lambda: tdist.reduce(x, 0))
        return call, lambda _r: [x] if rank == 0 else [], lambda: [total(count)] if rank == 0 else []
    if op in ("all_gather", "gather"):
        x = data(rank, per)
        root = op == "all_gather" or rank == 0
        outs = [torch.empty_like(x) for _ in range(n)] if root else None
        if op == "all_gather":
            call = (lambda: fn(x)) if fn else (lambda: tdist.all_gather(outs, x))
        else:
            call = (lambda: fn(x, dst=0)) if fn else (lambda: tdist.gather(x, outs, dst=0))
        got = (lambda ret: list(ret or [])) if fn else (lambda _r: list(outs or []))
        return call, got, lambda: [_pattern(q, per) for q in range(n)] if root else []
    if op == "scatter":
        x = data(rank, per) * 0
        ins = [data(j, per) for j in range(n)] if rank == 0 else None
        call = (lambda: fn(x, scatter_list=ins, src=0)) if fn else (lambda: tdist.scatter(x, ins, src=0))
        return call, lambda _r: [x], lambda: [_pattern(rank, per)]
    if op == "reduce_scatter":
        ins = [data(rank, per, shift=j) for j in range(n)]
        out = torch.zeros(per, dtype=dtype, device=dev)
        call = (lambda: fn(out, ins)) if fn else (lambda: tdist.reduce_scatter(out, ins))
        return call, lambda _r: [out], lambda: [total(per, shift=rank)]
    if op == "all_to_all":
        m = max(per // n, 1)
        ins = [data(rank, m, shift=2 * j) for j in range(n)]
        outs = [torch.empty_like(t) for t in ins]
        call = (lambda: fn(outs, ins)) if fn else (lambda: tdist.all_to_all(outs, ins))
        return call, lambda _r: outs, lambda: [_pattern(j, m, shift=2 * rank) for j in range(n)]
    raise ValueError(f"unknown op {op!r}")


def _wrong(got: list[torch.Tensor], want: list[torch.Tensor], dtype: torch.dtype) -> int:
    """Elements of ``got`` that differ from ``want`` (a missing or misshapen tensor counts whole)."""
    rtol = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    bad = 0
    for i, w in enumerate(want):
        g = got[i].detach().to("cpu", torch.float64).reshape(-1) if i < len(got) else None
        if g is None or g.numel() != w.numel():
            bad += w.numel()
            continue
        bad += int(((g - w).abs() > rtol * w.abs()).sum())
    return bad + sum(t.numel() for t in got[len(want) :])


def _synchronize() -> None:
    import hwdist

    hwdist.resolve().synchronize()


def bench_step(op: str, impl: str, count: int, dtype_name: str, iters: int, warmup: int) -> tuple[float, int]:
    """Time ``op`` on this rank, then check it once: ``(seconds per call, wrong elements)``.

    Run on every rank.
    """
    import hwdist

    dtype = getattr(torch, dtype_name)
    call, _, _ = _case(op, impl, count, dtype, fill=False)
    for _ in range(warmup):
        call()
    _synchronize()
    hwdist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _synchronize()
    seconds = (time.perf_counter() - start) / iters
    call, outputs, expected = _case(op, impl, count, dtype, fill=True)
    got = outputs(call())
    _synchronize()
    if settings.text(INJECT_ENV) == op and hwdist.get_rank() == hwdist.get_world_size() - 1 and got:
        got[0].view(-1)[0] += 1  # the test hook: one wrong element
    return seconds, _wrong(got, expected(), dtype)


def _elements(op: str, nbytes: int, itemsize: int, n: int) -> int:
    """Element count of the message for ``nbytes`` (a multiple of n where the op splits it)."""
    count = max(nbytes // itemsize, 1)
    if op in ("all_gather", "gather", "scatter", "reduce_scatter"):
        count = max(count // n, 1) * n
    elif op == "all_to_all":
        count = max(count // (n * n), 1) * n * n
    return count


# --------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------


def _progress(text: str, err: TextIO) -> None:
    if err.isatty():
        err.write("\r\033[K" + text)
    else:
        err.write(text + "\n")
    err.flush()


def _ops(spec: str) -> list[str]:
    ops = list(BENCH_OPS) if spec.strip() == "all" else [o.strip() for o in spec.split(",") if o.strip()]
    unknown = [o for o in ops if o not in _BUS_FACTORS]
    if unknown or not ops:
        raise UsageError(
            f"--ops: unknown op(s) {', '.join(unknown) or '(none given)'}; expected a comma list of:"
            f" {', '.join(BENCH_OPS)} (or 'all')"
        )
    return ops


def cmd_bench(args: argparse.Namespace, out: TextIO, err: TextIO, argv: Sequence[str] = ()) -> int:
    """``hwdist bench`` (``argv``: the command line, for a re-run under mpiexec)."""
    from .cli_ranks import ranks_for
    from .testing import RankFailure

    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        raise UsageError(f"--sizes: {exc}") from None
    ops = _ops(args.ops)
    injected = settings.text(INJECT_ENV)
    if injected is not None and injected not in ops:  # it would silently inject nothing
        raise UsageError(
            f"{INJECT_ENV} must name one of the ops this run benchmarks ({', '.join(ops)}), got {injected!r}"
        )
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed. Fix: pip install matplotlib")
    driver = choose_backend(args.backend)
    make, done = ranks_for(args, driver, argv, err)
    if make is None:
        return int(done or 0)
    n = args.nproc
    itemsize = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    impls = ["hwdist", "torch"] if args.compare else [args.impl]
    records: list[dict[str, Any]] = []
    with report_stream(out) as report:
        try:
            pool = make()
        except RankFailure as exc:
            err.write(f"hwdist bench: error: {startup_failure(exc, n, driver.name, args.timeout)}\n")
            return 1
        n = pool.world_size
        failed = False
        try:
            for op in ops:
                for i, nbytes in enumerate(sizes, 1):
                    count = _elements(op, nbytes, itemsize, n)
                    for impl in impls:
                        _progress(f"bench: {op} ({impl}) {_human(count * itemsize)} [{i}/{len(sizes)}]", err)
                        try:
                            per_rank = pool.run(
                                bench_step, op, impl, count, args.dtype, args.iters, args.warmup
                            )
                        except RankFailure as exc:
                            err.write(
                                f"{chr(10) if err.isatty() else ''}bench: {op} ({impl}) at"
                                f" {_human(count * itemsize)} failed: {_first(exc)}\n"
                            )
                            failed = True
                            if getattr(pool, "broken", False):
                                pool.close()
                                pool = make()
                            continue
                        seconds = max(s for s, _ in per_rank)
                        size = count * itemsize
                        algbw = size / seconds / 1e9
                        records.append(
                            {
                                "op": op,
                                "impl": impl,
                                "size": size,
                                "count": count,
                                "dtype": args.dtype,
                                "time_us": seconds * 1e6,
                                "algbw_gbps": algbw,
                                "busbw_gbps": algbw * bus_factor(op, n),
                                "wrong": sum(w for _, w in per_rank),
                            }
                        )
            if err.isatty():
                err.write("\n")
        finally:
            pool.close()
        if getattr(pool, "rank", 0) != 0:  # under mpiexec: rank 0 reports
            return 1 if failed or any(r["wrong"] for r in records) else 0
        meta = {
            "backend": driver.name,
            "device_type": driver.device_type,
            "world_size": n,
            "dtype": args.dtype,
            "iters": args.iters,
            "warmup": args.warmup,
            "torch": torch.__version__,
        }
        summary = _summary(records)
        if args.json:
            json.dump({**meta, **summary, "results": records}, report, indent=2)
            report.write("\n")
        else:
            _print_bench(meta, records, summary, report)
    if args.plot:
        _plot(meta, records, args.plot)
        err.write(f"bench: wrote {args.plot}\n")
    return 1 if failed or summary["wrong"] else 0


def _first(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip().startswith("root cause:"):
            return line.strip()[len("root cause:") :].strip()
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[0].strip() if lines else type(exc).__name__


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Average bus bandwidth per (op, impl) and per impl, the wrong total, and hwdist/torch time ratios."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["op"], r["impl"]), []).append(r)
    per_op = [
        {
            "op": op,
            "impl": impl,
            "sizes": len(rs),
            "avg_busbw_gbps": sum(r["busbw_gbps"] for r in rs) / len(rs),
            "wrong": sum(r["wrong"] for r in rs),
        }
        for (op, impl), rs in groups.items()
    ]
    by_impl: dict[str, list[float]] = {}
    for r in records:
        by_impl.setdefault(r["impl"], []).append(r["busbw_gbps"])
    torch_time = {(r["op"], r["size"]): r["time_us"] for r in records if r["impl"] == "torch"}
    comparison = [
        {
            "op": r["op"],
            "size": r["size"],
            "hwdist_us": r["time_us"],
            "torch_us": torch_time[(r["op"], r["size"])],
            "ratio": r["time_us"] / torch_time[(r["op"], r["size"])],
        }
        for r in records
        if r["impl"] == "hwdist" and (r["op"], r["size"]) in torch_time
    ]
    return {
        "wrong": sum(r["wrong"] for r in records),
        "avg_busbw_gbps": {impl: sum(v) / len(v) for impl, v in by_impl.items()},
        "summary": per_op,
        "comparison": comparison,
    }


def _print_bench(
    meta: dict[str, Any], records: list[dict[str, Any]], summary: dict[str, Any], out: TextIO
) -> None:
    w = out.write
    w(
        f"# hwdist bench: {meta['world_size']} rank(s), backend '{meta['backend']}' (device"
        f" {meta['device_type']}),"
        f" {meta['dtype']}, {meta['iters']} iters after {meta['warmup']} warm-up, torch {meta['torch']}\n"
        "# size: bytes of the whole message (all_gather: the gathered output); time: slowest rank's mean;\n"
        "# busbw = algbw x factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather,"
        " scatter (n-1)/n;"
        " broadcast, reduce 1), as in nccl-tests\n"
        "# #wrong: elements differing from the expected result in one more call on fresh data, summed over"
        " ranks\n"
    )
    footers = {(s["op"], s["impl"]): s for s in summary["summary"]}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["op"], r["impl"]), []).append(r)
    for (op, impl), rows in groups.items():
        w(f"\n# {op} ({impl})\n")
        w(
            f"{'size(B)':>12} {'count':>12} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"
            f" {'#wrong':>7}\n"
        )
        for r in rows:
            w(
                f"{r['size']:>12} {r['count']:>12} {r['time_us']:>12.1f} {r['algbw_gbps']:>12.3f}"
                f" {r['busbw_gbps']:>12.3f} {r['wrong']:>7}\n"
            )
        s = footers[(op, impl)]
        w(f"# avg busbw {s['avg_busbw_gbps']:.3f} GB/s over {s['sizes']} size(s); #wrong {s['wrong']}\n")
    if summary["comparison"]:
        w("\n# hwdist against raw torch.distributed, same run (ratio = hwdist time / torch time)\n")
        w(f"{'op':<16} {'size(B)':>12} {'hwdist(us)':>12} {'torch(us)':>12} {'ratio':>7}\n")
        for c in summary["comparison"]:
            w(
                f"{c['op']:<16} {c['size']:>12} {c['hwdist_us']:>12.1f} {c['torch_us']:>12.1f}"
                f" {c['ratio']:>7.2f}\n"
            )
    w("\n")
    verdict = "OK" if summary["wrong"] == 0 else "WRONG RESULTS"
    w(f"# Out of bounds values : {summary['wrong']} {verdict}\n")
    for impl, avg in summary["avg_busbw_gbps"].items():
        w(f"# Avg bus bandwidth    : {avg:.3f} GB/s ({impl})\n")


def _plot(meta: dict[str, Any], records: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        series.setdefault(f"{r['op']} ({r['impl']})", []).append(r)
    for label, rs in series.items():
        ax.plot([r["size"] for r in rs], [r["busbw_gbps"] for r in rs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"hwdist bench: {meta['world_size']} ranks, {meta['backend']}, {meta['dtype']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
