"""``hwdist check --conformance``: the command around [`conformance`][hwdist.checks.conformance].

Runs the edge-value cases on local ranks (2 and 3 ranks, or ``-n``), prints the report or ``--json``,
and writes ``--write-driver PATH``: the driver's table corrected by what was found.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["cmd_conformance"]


def cmd_conformance(args: Any, driver: Any, out: Any, err: Any) -> int:
    """``hwdist check --conformance``: run, print the report (or ``--json``), write ``--write-driver``.
    Exit 1 when a case the table passes through was wrong or refused, or hwdist was wrong."""
    import json

    from .checks import measure
    from .checks.conformance import corrected, diff, driver_source, render, run
    from .cli_ranks import report_stream
    from .testing import RankFailure

    worlds = (args.nproc,) if args.nproc else (2, 3)

    def say(text: str) -> None:
        err.write(f"hwdist: {text}\n")
        err.flush()

    with report_stream(out) as report:
        try:
            conf = run(worlds, driver.name, imports=list(args.imports or []), timeout=args.timeout, say=say)
        except RankFailure as exc:
            err.write(
                f"hwdist check: error: the ranks could not start backend '{driver.name}':"
                f" {measure.root_cause(exc)}\n"
            )
            return 1
        findings = diff(conf, driver)
        failed = any(f.failure for f in findings)
        if args.json:
            json.dump(
                {
                    "backend": conf.backend,
                    "world_sizes": list(conf.world_sizes),
                    "torch": torch.__version__,
                    "seconds": conf.seconds,
                    "failed": failed,
                    "findings": [f.__dict__ for f in findings],
                    "corrected": corrected(conf, driver),
                    "results": [
                        {
                            "op": op,
                            "dtype": d,
                            "reduce_op": r,
                            "library": conf.worst(conf.raw, (op, d, r))[0],
                            "hwdist": conf.worst(conf.via_hwdist, (op, d, r))[0],
                        }
                        for (op, d, r) in conf.raw
                    ],
                },
                report,
                indent=2,
            )
            report.write("\n")
        else:
            report.write(render(conf, driver) + f"\n\nchecked in {conf.seconds:.1f} s\n")
        path = getattr(args, "write_driver", None)
        if path:
            with open(path, "w") as fh:
                fh.write(driver_source(conf, driver))
            say(f"wrote the corrected table to {path}")
    return 1 if failed else 0
