"""``hwdist trace DIR``: merge the ranks' flight-record dumps and print the hang diagnosis offline.


The files are what [`hwdist.dump_flight_record`][hwdist.flight.dump_flight_record], ``SIGUSR1``
or the hang watchdog wrote (``flight-rank<R>.jsonl``: a header line, then one line per
collective). The output is the watchdog's report (diagnosis, one row per rank,
stacks) followed by a Markdown table per group of the first sequence number
where the ranks' calls differ. Exit status: 0, or 2 when DIR holds no record.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Optional, TextIO

from .flight import files, report

__all__ = ["add_trace_parser", "cmd_trace", "load_records"]


def add_trace_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``trace`` subcommand to the ``hwdist`` parser's subparsers; returns it."""
    p = sub.add_parser(
        "trace",
        help="merge flight-record dumps (one per rank) and print the hang diagnosis",
        description="Merge the flight-record dumps of every rank (flight-rank<R>.jsonl, written on a hang, on"
        " SIGUSR1 or by hwdist.dump_flight_record) and print the diagnosis, each rank's last completed and"
        " pending"
        " collective, the stacks, and per group the first sequence number where the ranks' calls differ.",
    )
    p.add_argument("dir", metavar="DIR", help="directory holding the ranks' flight-rank<R>.jsonl files")
    p.add_argument("--json", action="store_true", help="print the merged diagnosis and table as JSON")
    return p


def load_records(path: str) -> tuple[dict[int, Optional[dict[str, Any]]], int, list[str]]:
    """Read every ``*.jsonl`` dump in ``path``: (rank -> record, world size, problems found).

    A file that cannot be used (not a regular file, too large, not JSON, a field of the wrong type or out
    of range) is skipped; its problem names it and says why (hwdist.flight.files). Text from the files
    is stripped of control characters.

    Raises:
        FileNotFoundError: ``path`` is not a directory or holds no dump.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{files.clean(path)!r} is not a directory")
    records: dict[int, Optional[dict[str, Any]]] = {}
    problems: list[str] = []
    world = 0
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise FileNotFoundError(f"{files.clean(path)!r} cannot be listed ({exc.strerror or exc})") from None
    for name in names:
        if not name.endswith(".jsonl"):
            continue
        shown = files.clean(name, 200)
        try:
            header = files.read_dump(os.path.join(path, name))
        except files.BadDump as exc:
            problems.append(f"{shown}: not a flight record ({exc}); skipped")
            continue
        except Exception as exc:  # never a traceback for one bad file
            why = f"{type(exc).__name__}: {files.clean(exc, 200)}"
            problems.append(f"{shown}: not a flight record ({why}); skipped")
            continue
        rank = header["rank"]
        if rank in records:
            problems.append(f"{shown}: a second record of rank {rank}; the newer one is used")
            if header["time"] < (records[rank] or {}).get("time", 0.0):
                continue
        records[rank] = header
        world = max(world, header["world_size"], rank + 1)
    if not records:
        unread = f" ({'; '.join(problems)})" if problems else ""
        where = files.clean(path)
        raise FileNotFoundError(f"no readable flight record (flight-rank<R>.jsonl) in {where!r}{unread}")
    for r in range(world):
        records.setdefault(r, None)
    return records, world, problems


def table(records: dict[int, Optional[dict[str, Any]]], world: int) -> str:
    """Markdown: one row per group with the first divergent sequence number and every rank's call there."""
    rows = report.divergence(records, world)
    ranks = sorted(r for r, rec in records.items() if rec is not None)  # a rank without a file: no column
    lines = [
        "| group | backend | first divergence | "
        + " | ".join(f"rank {r}" for r in ranks)
        + " | last seq per rank |",
        "|---|---|---|" + "---|" * len(ranks) + "---|",
    ]
    for d in rows:
        first = f"#{d['first']}" if d["first"] is not None else "none"
        calls = " | ".join(d["calls"].get(r, "(not in group)") for r in ranks)
        last = ", ".join(f"{r}:#{s}" for r, s in d["last"].items() if records.get(r) is not None)
        lines.append(f"| {d['group']} | {d['backend']} | {first} | {calls} | {last} |")
    return "\n".join(lines)


def cmd_trace(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``hwdist trace``; returns the exit status."""
    try:
        records, world, problems = load_records(args.dir)
    except FileNotFoundError as exc:
        print(f"hwdist trace: error: {exc}; write them with hwdist.dump_flight_record(DIR) on every rank,"
              " or let the hang watchdog write them (HWDIST_FLIGHT_DIR)", file=err)
        return 2
    for p in problems:
        print(f"hwdist trace: warning: {p}", file=err)
    try:
        return _print(args, records, world, out)
    except Exception as exc:  # the records passed every check; still, never a traceback
        print(f"hwdist trace: error: could not analyse the records ({type(exc).__name__}:"
              f" {files.clean(exc, 300)})", file=err)
        return 1


def _print(args: argparse.Namespace, records: report.Records, world: int, out: TextIO) -> int:
    if getattr(args, "json", False):
        json.dump({
            "world_size": world,
            "ranks": sorted(r for r, rec in records.items() if rec is not None),
            "diagnosis": report.diagnose(records, world, offline=True),
            "groups": report.divergence(records, world),
        }, out, indent=1, default=str)
        out.write("\n")
        return 0
    got = sum(rec is not None for rec in records.values())
    headline = f"{got} of {world} ranks' records from {files.clean(args.dir)}"
    print(report.render(records, world, headline, offline=True), file=out)
    print("\nper group, the first sequence number where the ranks' calls differ:", file=out)
    print(table(records, world), file=out)
    return 0
