"""``hwdist check --measure`` / ``--write-driver``: a backend's real table, measured on local ranks.

The default of ``hwdist check --backend NAME`` for a backend torch knows and hwdist does not (a vendor
extension registered with ``torch.distributed.Backend.register_backend``): hwdist has no table for it
but a conservative generic one, so it measures the real one
([`hwdist.checks.measure`][hwdist.checks.measure]) and can write it out as a driver to register.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Optional, TextIO

import torch

__all__ = ["cmd_measure", "render_measurement"]


def render_measurement(m: Any) -> str:
    """The measurement as the report ``hwdist check --measure`` prints: per op (and reduce op) the
    dtypes that worked and those that did not (with the first reason), then the derived table."""
    from .checks import measure

    lines = []
    generic = " (known to torch only)" if m.info.get("generic") else ""
    lines.append(
        f"hwdist check --measure: backend '{m.backend}'{generic}, device {m.info.get('device_type')},"
        f" {m.world_size} rank(s), torch {torch.__version__}"
    )
    lines.append(f"{'OP':<20} {'REDUCE':<7} {'WORKS ON':<44} NOT (first reason)")
    for op in measure.OPS:
        keys = [(d, r) for d, r in measure.cases(op)]
        for rop in dict.fromkeys(r for _, r in keys):
            rows = [(d, m.results.get((op, d, rop), ("hung", "not run"))) for d, r in keys if r == rop]
            good = [d or "yes" for d, (s, _) in rows if s == "ok"]
            bad = [(d or "no", s, why) for d, (s, why) in rows if s != "ok"]
            first = f" ({bad[0][1]}: {bad[0][2][:90]})" if bad else ""
            lines.append(
                f"{op:<20} {rop or '-':<7} {' '.join(good) or '-':<44}"
                f" {' '.join(d for d, _, _ in bad) or '-'}{first}"
            )
    t = m.table
    lines.append("")
    lines.append("measured table (what a driver for it declares):")
    for key in ("native_ops", "flat_ops", "reduce_ops", "dtypes", "reduce_dtypes", "avg_dtypes"):
        lines.append(f"  {key:<26} {', '.join(t[key]) or '(none)'}")
    for key in ("supports_async", "native_object_collectives"):
        lines.append(f"  {key:<26} {t[key]}")
    return "\n".join(lines)


def cmd_measure(args: argparse.Namespace, driver: Any, out: TextIO, err: TextIO) -> int:
    """Measure ``driver``'s backend on ``args.nproc`` local ranks; print it, write the driver if asked.

    The arguments were checked by ``hwdist.cli.cmd_check`` (at least 2 ranks, not under mpiexec, the
    folder of ``--write-driver`` exists).
    """
    from .checks import driver_file, measure
    from .cli_ranks import report_stream
    from .testing import RankFailure

    n = args.nproc or 2
    path: Optional[str] = args.write_driver

    def say(text: str) -> None:
        err.write(f"hwdist: {text}\n")
        err.flush()

    with report_stream(out) as report:
        try:
            imports = list(args.imports or [])
            m = measure.measure(n, driver.name, imports=imports, timeout=args.timeout, say=say)
        except RankFailure as exc:
            root = next(
                (ln.strip()[len("root cause:") :].strip() for ln in str(exc).splitlines()
                 if ln.strip().startswith("root cause:")),
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            what = f"could not start {n} rank(s) on backend '{driver.name}': {root}"
            err.write(f"hwdist check: error: {what}\n")
            return 1
        written = None
        if path is not None:
            written = driver_file.write_driver(m, path)
        if args.json:
            json.dump({**m.as_dict(), "driver_file": path, "driver_class": written}, report, indent=2)
            report.write("\n")
        else:
            report.write(render_measurement(m) + "\n")
            if written is not None and path is not None:
                module = os.path.splitext(os.path.basename(path))[0]
                report.write(
                    f"\nwrote {path}: class {written}. Register it in every process before hwdist uses the"
                    f" backend:\n    from {module} import {written}\n"
                    f"    hwdist.register_backend({m.backend!r}, {written})\n"
                    "or declare it as an entry point of your package (group 'hwdist.drivers').\n"
                )
            report.write(f"\nmeasured in {m.seconds:.1f} s\n")
        report.flush()
    return 0

