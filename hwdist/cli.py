"""The ``hwdist`` command: ``env``, ``check`` and ``bench``.

* ``hwdist env [--json]``: what this machine offers (drivers, detection,
  launcher, MPI, torch's backend map).
* ``hwdist check [-n N] [--backend B] [--json]``: spawn N local ranks and
  verify every public collective across dtypes; exit 1 on any failure.
* ``hwdist bench [-n N] [--backend B] [--ops ...] [--sizes 1K:256M]``: an
  nccl-tests-style sweep (time, algorithm and bus bandwidth per size).

Usage errors (unknown or unavailable backend, bad sizes) print one line with
the fix and exit 2; failed checks exit 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import sys
import time
from typing import Any, Callable, Optional, Sequence, TextIO

import torch

__all__ = ["main", "UsageError", "parse_sizes", "bus_factor", "env_report"]

PROG = "hwdist"


class UsageError(Exception):
    """A problem with how the command was called; printed as one line, exit code 2."""


# --------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _choose_backend(name: Optional[str]) -> Any:
    """The driver for ``--backend`` (default: what detection picks), available here.

    Raises:
        UsageError: unknown or unavailable backend, or a bad override variable.
    """
    import hwdist
    import hwdist.testing  # noqa: F401  (registers the emulated accelerator 'emu')

    if name is None:
        try:
            name = hwdist.detect().backend
        except hwdist.BackendError as exc:
            raise UsageError(f"{exc}. Fix: unset the variable or pass --backend NAME") from None
    try:
        driver = hwdist.get_driver(name)
    except hwdist.BackendError as exc:
        raise UsageError(f"{exc}. Fix: pass --backend with one of the registered names") from None
    why = driver.unavailable_reason()
    if why is not None:
        available = hwdist.available_backends()
        fix = f"pass --backend {available[0]}" if available else "install a backend's support package"
        raise UsageError(
            f"backend {driver.name!r} is not available here: {why}. Available: {', '.join(available)}."
            f" Fix: {fix} (`hwdist env` lists every backend)"
        )
    return driver


def _root_cause(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip().startswith("root cause:"):
            return line.strip()[len("root cause:") :].strip()
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[0].strip() if lines else type(exc).__name__


# --------------------------------------------------------------------------
# hwdist env
# --------------------------------------------------------------------------

#: Launcher environment variables, by launcher (read when hwdist has no infer_launcher).
_LAUNCHER_VARS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torchrun", ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST")),
    ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("pmi", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMIX_RANK")),
)


def _plain(obj: Any) -> Any:
    """A JSON-friendly version of ``obj`` (dataclasses, namedtuples, objects with as_dict)."""
    import dataclasses

    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "as_dict") and callable(obj.as_dict):
        return _plain(obj.as_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return _plain(obj._asdict())
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    return str(obj)


def _launcher_report() -> dict[str, Any]:
    import hwdist

    found = {
        name: {var: os.environ[var] for var in names if var in os.environ}
        for name, names in _LAUNCHER_VARS
    }
    found = {k: v for k, v in found.items() if v}
    report: dict[str, Any] = {"variables": found}
    infer = getattr(hwdist, "infer_launcher", None)
    if callable(infer):
        try:
            report["inferred"] = _plain(infer())
        except Exception as exc:  # report, never crash the environment report
            report["inferred"] = None
            report["error"] = f"{type(exc).__name__}: {exc}"
    else:  # an hwdist without launch resolvers: show the variables only
        report["inferred"] = None
    return report


def _runtime_details() -> dict[str, dict[str, Any]]:
    """Each driver's own runtime facts (``Driver.details()``), where it has any."""
    from hwdist import registry

    out = {}
    for drv in registry.drivers():
        facts = drv.details()
        if facts:
            out[drv.name] = facts
    return out


def env_report() -> dict[str, Any]:
    """Everything ``hwdist env`` shows, as plain data."""
    import numpy

    import hwdist
    import hwdist.testing  # noqa: F401  (registers the emulated accelerator 'emu')
    from hwdist import registry

    drivers = []
    for drv in registry.drivers():
        try:
            why = drv.unavailable_reason()
        except Exception as exc:  # a broken vendor install must not hide the others
            why = f"checking availability failed: {type(exc).__name__}: {exc}"
        count: Optional[int] = None
        if why is None:
            try:
                count = int(drv.device_count())
            except Exception as exc:
                why = f"counting devices failed: {type(exc).__name__}: {exc}"
        drivers.append(
            {
                "name": drv.name,
                "device_type": drv.device_type,
                "priority": drv.priority,
                "available": why is None,
                "device_count": count,
                "reason": why,
                "description": drv.description,
                "torch_name": drv.torch_name,
                "capabilities": drv.capabilities(),
            }
        )
    try:
        detection: dict[str, Any] = hwdist.detect().as_dict()
    except hwdist.BackendError as exc:
        detection = {"error": str(exc)}
    dist = torch.distributed
    torch_map: dict[str, Any] = {}
    if dist.is_available():
        torch_map = {
            "default_device_backend_map": dict(getattr(dist.Backend, "default_device_backend_map", {})),
            "backend_list": list(getattr(dist.Backend, "backend_list", [])),
        }
    return {
        "hwdist": {"version": hwdist.__version__, "path": os.path.dirname(os.path.abspath(hwdist.__file__))},
        "python": {"version": platform.python_version(), "executable": sys.executable, "platform": platform.platform()},
        "torch": {"version": torch.__version__, "distributed": bool(dist.is_available())},
        "numpy": {"version": numpy.__version__},
        "drivers": drivers,
        "detection": detection,
        "launcher": _launcher_report(),
        "runtime_details": _runtime_details(),
        "torch_backends": torch_map,
    }


def _print_env(rep: dict[str, Any], out: TextIO) -> None:
    w = out.write
    w(f"hwdist {rep['hwdist']['version']}  ({rep['hwdist']['path']})\n")
    w(f"python {rep['python']['version']}  ({rep['python']['executable']}; {rep['python']['platform']})\n")
    w(f"torch  {rep['torch']['version']}  (torch.distributed {'available' if rep['torch']['distributed'] else 'NOT available'})\n")
    w(f"numpy  {rep['numpy']['version']}\n\n")
    w("Drivers (detection order):\n")
    w(f"  {'backend':<10} {'device':<8} {'prio':>5}  {'available':<10} {'devices':>7}  note\n")
    for d in rep["drivers"]:
        avail = "yes" if d["available"] else "no"
        count = "-" if d["device_count"] is None else str(d["device_count"])
        note = d["description"] if d["available"] else d["reason"]
        w(f"  {d['name']:<10} {d['device_type']:<8} {d['priority']:>5}  {avail:<10} {count:>7}  {note}\n")
    det = rep["detection"]
    w("\nDetection:\n")
    if "error" in det:
        w(f"  error: {det['error']}\n")
    else:
        chosen = f"chosen by {det['source']}" if det["overridden"] else "auto-detected"
        w(f"  device {det['device_type']}, backend {det['backend']} ({chosen}: {det['reason']})\n")
    lau = rep["launcher"]
    w("\nLauncher:\n")
    inferred = lau["inferred"]
    if lau.get("error"):
        w(f"  infer_launcher() failed: {lau['error']}\n")
    elif inferred is None:
        w("  inferred: (this hwdist has no infer_launcher)\n")
    else:
        w(f"  inferred: {inferred}{' (a single process)' if inferred == 'none' else ''}\n")
    for name, variables in lau["variables"].items():
        w(f"  {name}: " + " ".join(f"{k}={v}" for k, v in variables.items()) + "\n")
    for name, facts in rep["runtime_details"].items():
        w(f"\n{name} runtime:\n")
        for key, value in facts.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k} ({v})" for k, v in value.items()) or "none"
            elif isinstance(value, bool):
                value = "yes" if value else "no"
            w(f"  {key}: {value if value is not None else 'not installed'}\n")
    tb = rep["torch_backends"]
    if tb:
        w("\ntorch.distributed backends:\n")
        mapping = ", ".join(f"{k} -> {v}" for k, v in tb["default_device_backend_map"].items())
        w(f"  default device map: {mapping}\n")
        w(f"  known: {', '.join(tb['backend_list'])}\n")


def cmd_env(args: argparse.Namespace, out: TextIO) -> int:
    """``hwdist env``."""
    rep = env_report()
    if args.json:
        json.dump(rep, out, indent=2, default=str)
        out.write("\n")
    else:
        _print_env(rep, out)
    return 0


# --------------------------------------------------------------------------
# hwdist check
# --------------------------------------------------------------------------


def _fmt_ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    """``hwdist check``."""
    from . import checks
    from .testing import RankFailure

    driver = _choose_backend(args.backend)
    if args.only:
        unknown = sorted(set(args.only) - set(checks.check_names()))
        if unknown:
            raise UsageError(
                f"--only: unknown check(s) {', '.join(unknown)}; expected names from: {', '.join(checks.check_names())}"
            )
    head = (
        f"hwdist check: {args.nproc} rank(s), backend '{driver.name}' (device {driver.device_type}),"
        f" torch {torch.__version__}"
    )
    if not args.json:
        out.write(head + "\n")
        out.write(f"{'CHECK':<22} {'DTYPE':<9} {'RESULT':<6} {'TIME':>10}  DETAIL\n")
        out.flush()
    rows = []
    start = time.monotonic()
    try:
        for row in checks.run_checks(
            args.nproc, driver.name, only=args.only, inject=args.inject, timeout=args.timeout, pg_timeout=args.timeout
        ):
            rows.append(row)
            if not args.json:
                out.write(f"{row.name:<22} {row.dtype:<9} {row.status:<6} {_fmt_ms(row.seconds):>10}  {row.detail}\n")
                out.flush()
    except RankFailure as exc:
        print(
            f"{PROG}: error: could not start {args.nproc} rank(s) on backend '{driver.name}': {_root_cause(exc)}",
            file=sys.stderr,
        )
        return 1
    elapsed = time.monotonic() - start
    counts = {s: sum(r.status == s for r in rows) for s in ("pass", "FAIL", "n/a", checks.REFUSED)}
    if args.json:
        json.dump(
            {
                "backend": driver.name,
                "device_type": driver.device_type,
                "world_size": args.nproc,
                "torch": torch.__version__,
                "passed": counts["pass"],
                "failed": counts["FAIL"],
                "not_available": counts["n/a"],
                "refused": counts[checks.REFUSED],
                "seconds": elapsed,
                "results": [r.as_dict() for r in rows],
            },
            out,
            indent=2,
        )
        out.write("\n")
    else:
        summary = f"{counts['pass']} passed, {counts['FAIL']} failed"
        if counts["n/a"]:
            summary += f", {counts['n/a']} not available"
        if counts[checks.REFUSED]:
            summary += f", {counts[checks.REFUSED]} {checks.REFUSED}"
        out.write(f"\n{summary} in {elapsed:.1f} s\n")
    return 1 if counts["FAIL"] else 0


# --------------------------------------------------------------------------
# hwdist bench
# --------------------------------------------------------------------------

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
    """nccl-tests' factor from algorithm to bus bandwidth for ``op`` on ``world_size`` ranks."""
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


def _sync(device: torch.device) -> None:
    mod = getattr(torch, device.type, None)
    sync = getattr(mod, "synchronize", None)
    if callable(sync):
        sync()


def _bench_call(op: str, impl: str, count: int, dtype: torch.dtype) -> Callable[[], Any]:
    """A no-argument function doing one ``op`` on ``count`` elements (the message size)."""
    import torch.distributed as tdist

    import hwdist

    from .checks import _out_first_or_returning

    n, rank = hwdist.get_world_size(), hwdist.get_rank()
    dev = hwdist.get_comm_device()
    per = count // n
    hw = impl == "hwdist"
    fn = getattr(hwdist, op, None) if hw else None
    if op == "all_reduce":
        x = torch.zeros(count, dtype=dtype, device=dev)
        return (lambda: fn(x)) if hw else (lambda: tdist.all_reduce(x))
    if op == "broadcast":
        x = torch.zeros(count, dtype=dtype, device=dev)
        return (lambda: fn(x, src=0)) if hw else (lambda: tdist.broadcast(x, 0))
    if op == "reduce":
        x = torch.zeros(count, dtype=dtype, device=dev)
        return (lambda: fn(x, dst=0)) if hw else (lambda: tdist.reduce(x, 0))
    if op == "all_gather":
        x = torch.zeros(per, dtype=dtype, device=dev)
        outs = [torch.empty_like(x) for _ in range(n)]
        return (lambda: fn(x)) if hw else (lambda: tdist.all_gather(outs, x))
    if op == "gather":
        x = torch.zeros(per, dtype=dtype, device=dev)
        outs = [torch.empty_like(x) for _ in range(n)] if rank == 0 else None
        return (lambda: fn(x, dst=0)) if hw else (lambda: tdist.gather(x, outs, dst=0))
    if op == "scatter":
        x = torch.zeros(per, dtype=dtype, device=dev)
        ins = [torch.zeros_like(x) for _ in range(n)] if rank == 0 else None
        return (lambda: fn(x, scatter_list=ins, src=0)) if hw else (lambda: tdist.scatter(x, ins, src=0))
    if op == "reduce_scatter":
        ins = [torch.zeros(per, dtype=dtype, device=dev) for _ in range(n)]
        out = torch.zeros(per, dtype=dtype, device=dev)
        if hw:
            return lambda: _out_first_or_returning(fn, out, ins)  # type: ignore[arg-type]
        return lambda: tdist.reduce_scatter(out, ins)
    if op == "all_to_all":
        ins = [torch.zeros(max(per // n, 1), dtype=dtype, device=dev) for _ in range(n)]
        outs = [torch.empty_like(t) for t in ins]
        if hw:
            return lambda: _out_first_or_returning(fn, outs, ins)  # type: ignore[arg-type]
        return lambda: tdist.all_to_all(outs, ins)
    raise ValueError(f"unknown op {op!r}")


def bench_step(op: str, impl: str, count: int, dtype_name: str, iters: int, warmup: int) -> float:
    """Time ``op`` on this rank: seconds per iteration (run on every rank)."""
    import hwdist

    dtype = getattr(torch, dtype_name)
    call = _bench_call(op, impl, count, dtype)
    dev = hwdist.get_comm_device()
    for _ in range(warmup):
        call()
    _sync(dev)
    hwdist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(dev)
    return (time.perf_counter() - start) / iters


def _elements(op: str, nbytes: int, itemsize: int, n: int) -> int:
    """Element count of the message for ``nbytes`` (a multiple of n where the op splits it)."""
    count = max(nbytes // itemsize, 1)
    if op in ("all_gather", "gather", "scatter", "reduce_scatter"):
        count = max(count // n, 1) * n
    elif op == "all_to_all":
        count = max(count // (n * n), 1) * n * n
    return count


def _progress(text: str, err: TextIO) -> None:
    if err.isatty():
        err.write("\r\033[K" + text)
    else:
        err.write(text + "\n")
    err.flush()


def cmd_bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``hwdist bench``."""
    import hwdist
    from .testing import RankFailure, RankPool

    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        raise UsageError(f"--sizes: {exc}") from None
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if args.ops.strip() == "all":
        ops = list(BENCH_OPS)
    unknown = [o for o in ops if o not in _BUS_FACTORS]
    if unknown or not ops:
        raise UsageError(f"--ops: unknown op(s) {', '.join(unknown) or '(none given)'}; expected a comma list of: {', '.join(BENCH_OPS)} (or 'all')")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed. Fix: pip install matplotlib")
    driver = _choose_backend(args.backend)
    n = args.nproc
    itemsize = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    records: list[dict[str, Any]] = []
    try:
        pool = RankPool(n, driver.name, timeout=args.timeout, pg_timeout=args.timeout)
    except RankFailure as exc:
        print(f"{PROG}: error: could not start {n} rank(s) on backend '{driver.name}': {_root_cause(exc)}", file=sys.stderr)
        return 1
    failed = False
    try:
        for op in ops:
            impl = args.impl
            if impl == "hwdist" and getattr(hwdist, op, None) is None:
                impl = "torch"
                err.write(f"bench: hwdist.{op} is not available in this version; timing torch.distributed.{op} instead\n")
            for i, nbytes in enumerate(sizes, 1):
                count = _elements(op, nbytes, itemsize, n)
                _progress(f"bench: {op} ({impl}) {_human(count * itemsize)} [{i}/{len(sizes)}]", err)
                try:
                    per_rank = pool.run(bench_step, op, impl, count, args.dtype, args.iters, args.warmup)
                except RankFailure as exc:
                    if err.isatty():
                        err.write("\n")
                    err.write(f"bench: {op} at {_human(count * itemsize)} failed: {_root_cause(exc)}\n")
                    failed = True
                    pool.close()
                    pool = RankPool(n, driver.name, timeout=args.timeout, pg_timeout=args.timeout)
                    break
                seconds = max(per_rank)
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
                    }
                )
        if err.isatty():
            err.write("\n")
    finally:
        pool.close()
    meta = {
        "backend": driver.name,
        "device_type": driver.device_type,
        "world_size": n,
        "dtype": args.dtype,
        "iters": args.iters,
        "warmup": args.warmup,
        "torch": torch.__version__,
    }
    if args.json:
        json.dump({**meta, "results": records}, out, indent=2)
        out.write("\n")
    else:
        _print_bench(meta, records, out)
    if args.plot:
        _plot(meta, records, args.plot)
        err.write(f"bench: wrote {args.plot}\n")
    return 1 if failed else 0


def _print_bench(meta: dict[str, Any], records: list[dict[str, Any]], out: TextIO) -> None:
    out.write(
        f"# hwdist bench: {meta['world_size']} rank(s), backend '{meta['backend']}' (device {meta['device_type']}),"
        f" {meta['dtype']}, {meta['iters']} iters after {meta['warmup']} warm-up, torch {meta['torch']}\n"
        "# size: bytes of the whole message (all_gather: the gathered output); time: slowest rank's mean;\n"
        "# busbw = algbw x factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n;"
        " broadcast, reduce 1), as in nccl-tests\n"
    )
    current = None
    for r in records:
        if (r["op"], r["impl"]) != current:
            current = (r["op"], r["impl"])
            out.write(f"\n# {r['op']} ({r['impl']})\n")
            out.write(f"{'size(B)':>12} {'count':>12} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}\n")
        out.write(
            f"{r['size']:>12} {r['count']:>12} {r['time_us']:>12.1f} {r['algbw_gbps']:>12.3f} {r['busbw_gbps']:>12.3f}\n"
        )


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


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="torch.distributed on any hardware: inspect this machine, verify and benchmark collectives.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{env,check,bench}")

    p_env = sub.add_parser("env", help="what this machine offers: drivers, detection, launcher, runtimes")
    p_env.add_argument("--json", action="store_true", help="machine-readable output")

    def common(p: argparse.ArgumentParser, timeout: float) -> None:
        p.add_argument("-n", "--nproc", type=_positive_int, default=2, metavar="N", help="local ranks to spawn (default 2)")
        p.add_argument("--backend", "-b", default=None, metavar="B", help="backend to use (default: what `hwdist env` detects)")
        p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        p.add_argument("--timeout", type=float, default=timeout, metavar="S", help=f"seconds per step before the ranks are declared hung (default {timeout:g})")

    p_check = sub.add_parser("check", help="spawn N ranks and verify every collective across dtypes")
    common(p_check, 60.0)
    p_check.add_argument("--only", type=lambda s: [x.strip() for x in s.split(",") if x.strip()], default=None, metavar="NAMES", help="comma list of checks to run (default: all)")
    # Hidden: make one check fail on purpose (tests of the failure path); see hwdist.checks.INJECT_ENV.
    p_check.add_argument("--inject-failure", dest="inject", default=None, help=argparse.SUPPRESS)

    p_bench = sub.add_parser("bench", help="nccl-tests-style bandwidth sweep")
    common(p_bench, 120.0)
    p_bench.add_argument("--ops", default=",".join(DEFAULT_BENCH_OPS), help=f"comma list or 'all' (default {','.join(DEFAULT_BENCH_OPS)}; known: {', '.join(BENCH_OPS)})")
    p_bench.add_argument("--sizes", default=DEFAULT_SIZES, help=f"MIN:MAX[:FACTOR] or a comma list, bytes with K/M/G (default {DEFAULT_SIZES})")
    p_bench.add_argument("--iters", type=_positive_int, default=20, metavar="K", help="timed iterations per size (default 20)")
    p_bench.add_argument("--warmup", type=int, default=5, metavar="W", help="untimed iterations first (default 5)")
    p_bench.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8"])
    p_bench.add_argument("--impl", default="hwdist", choices=["hwdist", "torch"], help="time hwdist's functions or raw torch.distributed (default hwdist)")
    p_bench.add_argument("--plot", default=None, metavar="FILE.png", help="draw bus bandwidth against size (needs matplotlib)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``hwdist`` command; returns the exit code (0 ok, 1 failures, 2 usage errors)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.command == "env":
            return cmd_env(args, sys.stdout)
        if args.command == "check":
            return cmd_check(args, sys.stdout)
        return cmd_bench(args, sys.stdout, sys.stderr)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
