"""The ``hwdist`` command: ``env``, ``check`` and ``bench``.

* ``hwdist env [--json | --issue]``: what this machine offers (system,
  drivers, detection, launcher, runtimes, relevant environment variables).
* ``hwdist check [-n N] [--backend B] [--json]``: spawn N local ranks (or,
  under ``mpiexec``, use the MPI processes) and verify every public
  collective across dtypes; exit 1 on any failure.
* ``hwdist bench [-n N] [--backend B] [--ops ...] [--sizes 1K:256M]``: an
  nccl-tests-style sweep (time, bandwidths, ``#wrong`` per size).

Usage errors (unknown or unavailable backend, bad sizes) print one line with
the fix and exit 2; every error line has argparse's form for a command,
``hwdist COMMAND: error: ...`` ([`error_line`][hwdist.cli.error_line]). Failed
checks exit 1; a closed stdout (``| head``) ends the command quietly with
141, as a process killed by SIGPIPE. The report is the only thing on
stdout: what ranks, torch or gloo print goes to stderr (see
[`hwdist.cli_ranks`][hwdist.cli_ranks]). The command's parts live in
[`hwdist.cli_env`][hwdist.cli_env], [`hwdist.cli_bench`][hwdist.cli_bench] and
[`hwdist.cli_ranks`][hwdist.cli_ranks].
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import textwrap
import time
from typing import Any, Optional, Sequence, TextIO

import torch

from .cli_ranks import PROG, UsageError, choose_backend, error_line, ranks_for

__all__ = ["main", "error_line", "UsageError", "MIN_TIMEOUT", "render_row", "choose_backend", "ranks_for"]

#: Smallest ``--timeout`` accepted, in seconds: a rank is a fresh interpreter importing torch (1-5 s).
MIN_TIMEOUT = 5.0
#: Exit status on a closed stdout: 128 + SIGPIPE, what a shell shows for ``cmd | head`` with Unix tools.
EXIT_PIPE = 141


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


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < MIN_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"expected seconds >= {MIN_TIMEOUT:g} (each rank starts a fresh interpreter that imports torch),"
            f" got {text!r}"
        )
    return value


# --------------------------------------------------------------------------
# hwdist check
# --------------------------------------------------------------------------


def _fmt_ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


#: Width of the RESULT column: the longest word a row's status is shown as (``refused``).
RESULT_WIDTH = 7
CHECK_HEADER = f"{'CHECK':<22} {'DTYPE':<10} {'RESULT':<{RESULT_WIDTH}} {'TIME':>10}  DETAIL"


def render_row(row: Any) -> str:
    """One check row as a table line (the one place a row's status is rendered).

    Every status fits the RESULT column; a row refused as its driver declares reads ``refused``
    there, and its detail says ``refused as declared`` (the JSON keeps the full status).
    """
    from . import checks

    status, detail = row.status, row.detail
    if status == checks.REFUSED:
        status = "refused"
        if "as declared" not in detail:
            detail = f"refused as declared: {detail}"
    return f"{row.name:<22} {row.dtype:<10} {status:<{RESULT_WIDTH}} {_fmt_ms(row.seconds):>10}  {detail}"


def _check_epilog() -> str:
    from . import checks

    names = checks.check_names()
    lines, line = [], " "
    for name in names:
        if len(line) + len(name) > 76:
            lines.append(line)
            line = " "
        line += f" {name}"
    lines.append(line)
    return (
        "checks (--only takes a comma list of these):\n" + "\n".join(lines) + "\n\n"
        "Exit status: 0 all passed, 1 a check failed or the ranks did not start, 2 usage error.\n"
        "Under `mpiexec -n N`, every process of the job is one rank; a backend that needs mpiexec starts it."
    )


def _import_modules(modules: Sequence[str]) -> None:
    """``--import``: import each module here (a package that registers its backend with torch on import)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise UsageError(f"--import {name}: {type(exc).__name__}: {exc}") from None


def _check_measure_args(args: argparse.Namespace) -> None:
    """``--measure``'s usage errors, before any rank starts."""
    from .testing import mpi_ranks as job

    if job.job_size() is not None:
        what = "--conformance" if getattr(args, "conformance", False) else "--measure"
        raise UsageError(f"{what} starts its own local ranks: run it outside mpiexec")
    if args.only or args.inject:
        raise UsageError("--only and --inject-failure apply to the usual checks, not to --measure")
    if args.nproc is not None and args.nproc < 2:
        raise UsageError(f"--measure needs at least 2 ranks (point to point), got -n {args.nproc}")
    path = getattr(args, "write_driver", None)
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UsageError(f"--write-driver {path}: folder {folder} does not exist")


def _generic(driver: Any) -> bool:
    from . import registry

    return registry.is_generic(driver)


def cmd_check(args: argparse.Namespace, out: TextIO, err: TextIO, argv: Sequence[str] = ()) -> int:
    """``hwdist check``."""
    from . import checks
    from .cli_ranks import report_stream, startup_failure
    from .testing import RankFailure

    _import_modules(getattr(args, "imports", None) or [])
    try:
        driver = choose_backend(args.backend)
    except UsageError as exc:
        if args.backend and not getattr(args, "imports", None) and "unknown backend" in str(exc):
            raise UsageError(
                f"{exc}; for a backend a package registers with torch when imported, add --import MODULE"
            ) from None
        raise
    if getattr(args, "conformance", False):
        if args.only or args.inject or getattr(args, "measure", False):
            raise UsageError(
                "--conformance runs its own cases: not with --only, --measure or --inject-failure"
            )
        if args.nproc is not None and args.nproc < 2:
            raise UsageError(f"--conformance needs at least 2 ranks, got -n {args.nproc}")
        _check_measure_args(args)
        from .cli_conformance import cmd_conformance

        return cmd_conformance(args, driver, out, err)
    if getattr(args, "measure", False) or getattr(args, "write_driver", None) or _generic(driver):
        _check_measure_args(args)
        from .cli_measure import cmd_measure  # the backend's own table, measured with raw torch calls

        return cmd_measure(args, driver, out, err)
    if getattr(args, "imports", None):
        raise UsageError(
            "--import applies to --measure and --write-driver: the ranks of the usual checks find their"
            " backend through hwdist's registry (a driver package's entry point, group 'hwdist.drivers')"
        )
    if args.only:
        unknown = sorted(set(args.only) - set(checks.check_names()))
        if unknown:
            raise UsageError(
                f"--only: unknown check(s) {', '.join(unknown)}; expected names from:"
                f" {', '.join(checks.check_names())}"
            )
    from . import settings

    source = "--inject-failure" if args.inject is not None else checks.INJECT_ENV
    spec = args.inject if args.inject is not None else settings.text(source)
    try:  # an injection that matches no check would silently test nothing
        injected = checks.parse_inject(spec, source)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if injected[0] and args.only and injected[0] not in args.only:
        raise UsageError(f"{source}: check {injected[0]!r} is not among --only {','.join(args.only)}")
    make, code = ranks_for(args, driver, argv, err)
    if make is None:
        return int(code or 0)
    pools: list[Any] = []

    def factory() -> Any:
        pools.append(make())
        return pools[-1]

    with report_stream(out) as report:
        lead = True  # whether this process writes the report (rank 0 under mpiexec)
        rows: list[Any] = []
        start = time.monotonic()
        try:
            for row in checks.run_checks(
                args.nproc,
                driver.name,
                only=args.only,
                inject=args.inject,
                timeout=args.timeout,
                pg_timeout=args.timeout,
                pool_factory=factory,
            ):
                lead = getattr(pools[-1], "rank", 0) == 0 if pools else True
                if not rows and lead and not args.json:
                    report.write(
                        f"hwdist check: {args.nproc} rank(s), backend '{driver.name}' (device"
                        f" {driver.device_type}),"
                        f" torch {torch.__version__}\n{CHECK_HEADER}\n"
                    )
                rows.append(row)
                if lead and not args.json:
                    report.write(render_row(row) + "\n")
                    report.flush()
        except RankFailure as exc:
            err.write(error_line("check", startup_failure(exc, args.nproc, driver.name, args.timeout)) + "\n")
            return 1
        elapsed = time.monotonic() - start
        counts = collections.Counter(r.status for r in rows)
        if not lead:
            return 1 if counts["FAIL"] else 0
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
                report,
                indent=2,
            )
            report.write("\n")
        else:
            summary = f"{counts['pass']} passed, {counts['FAIL']} failed"
            summary += "".join(
                f", {k} {'not available' if s == 'n/a' else s}"
                for s, k in counts.items()
                if s not in ("pass", "FAIL")
            )
            report.write(f"\n{summary} in {elapsed:.1f} s\n")
    return 1 if counts["FAIL"] else 0


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from . import __version__
    from .cli_bench import BENCH_OPS, DEFAULT_BENCH_OPS, DEFAULT_SIZES

    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="torch.distributed on any hardware: inspect this machine, verify and benchmark"
        " collectives.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{env,check,bench,trace}")

    p_env = sub.add_parser(
        "env",
        help="what this machine offers: system, drivers, detection, launcher, runtimes",
        description="What this machine offers: OS, CPU, RAM, /dev/shm; every driver, what detection picks,"
        " the launcher, runtime versions, and the environment variables that matter (secrets masked).",
    )
    mode = p_env.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="machine-readable output (keys are identifiers)")
    mode.add_argument(
        "--issue", action="store_true", help="a compact plain-text block to paste into a bug report"
    )

    def common(p: argparse.ArgumentParser, timeout: float) -> None:
        p.add_argument(
            "-n",
            "--nproc",
            type=_positive_int,
            default=None,
            metavar="N",
            help="local ranks to spawn (default 2; under mpiexec: the job's size)",
        )
        p.add_argument(
            "--backend",
            "-b",
            default=None,
            metavar="B",
            help="backend to use (default: what `hwdist env` detects)",
        )
        p.add_argument(
            "--json",
            action="store_true",
            help="machine-readable output on stdout (nothing else is written there)",
        )
        p.add_argument(
            "--timeout",
            type=_timeout,
            default=timeout,
            metavar="S",
            help=f"seconds for the ranks to start, and for each step, before they are declared hung"
            f" (default {timeout:g}, at least {MIN_TIMEOUT:g})",
        )

    p_check = sub.add_parser(
        "check",
        help="spawn N ranks and verify every collective across dtypes",
        description=textwrap.fill(
            "Spawn N local ranks on backend B and verify every public collective, object collective and"
            " results function of hwdist across dtypes, against values computed independently from the"
            " rank numbers."
        ),
        epilog=_check_epilog(),
        formatter_class=raw,
    )
    common(p_check, 60.0)
    p_check.add_argument(
        "--only",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=None,
        metavar="NAMES",
        help="comma list of checks to run (default: all; names below)",
    )
    p_check.add_argument(
        "--measure",
        action="store_true",
        help="measure the backend's real table instead (every op x dtype x reduce op with raw"
        " torch.distributed calls); the default for a backend torch knows and hwdist does not",
    )
    p_check.add_argument(
        "--conformance",
        action="store_true",
        help="check the backend on edge values (ties, negatives, +/-inf, NaN, -0.0, integer extremes; 0-d,"
        " empty, odd sizes) with raw calls and through hwdist, at 2 and 3 ranks (or -n), against an exact"
        " local computation; print the table and its diff with the driver's declared table",
    )
    p_check.add_argument(
        "--write-driver",
        dest="write_driver",
        default=None,
        metavar="PATH",
        help="measure, then write the table as a Python file with a hwdist.Driver class to register; with"
        " --conformance, the driver's table corrected by what it found",
    )
    p_check.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="with --measure or --conformance: import MODULE first, here and in every rank (a package that"
        " registers its backend with torch when imported); repeatable",
    )
    # Hidden: make one check fail on purpose (tests of the failure path); see hwdist.checks.INJECT_ENV.
    p_check.add_argument("--inject-failure", dest="inject", default=None, help=argparse.SUPPRESS)

    p_bench = sub.add_parser(
        "bench",
        help="nccl-tests-style bandwidth sweep with a correctness column",
        description="An nccl-tests-style sweep: per op and size the slowest rank's time, algorithm and bus"
        " bandwidth, and #wrong (elements that differ from the expected result); an average bus bandwidth"
        " per op.",
    )
    common(p_bench, 120.0)
    p_bench.add_argument(
        "--ops",
        default=",".join(DEFAULT_BENCH_OPS),
        help=f"comma list or 'all' (default {','.join(DEFAULT_BENCH_OPS)}; known: {', '.join(BENCH_OPS)})",
    )
    p_bench.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"MIN:MAX[:FACTOR] or a comma list, bytes with K/M/G (default {DEFAULT_SIZES})",
    )
    p_bench.add_argument(
        "--iters", type=_positive_int, default=20, metavar="K", help="timed iterations per size (default 20)"
    )
    p_bench.add_argument(
        "--warmup", type=int, default=5, metavar="W", help="untimed iterations first (default 5)"
    )
    p_bench.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8"],
    )
    which = p_bench.add_mutually_exclusive_group()
    which.add_argument(
        "--impl",
        default="hwdist",
        choices=["hwdist", "torch"],
        help="time hwdist's functions or raw torch.distributed (default hwdist)",
    )
    which.add_argument(
        "--compare",
        action="store_true",
        help="time both, size by size, and add a hwdist/torch time ratio table",
    )
    p_bench.add_argument(
        "--plot", default=None, metavar="FILE.png", help="draw bus bandwidth against size (needs matplotlib)"
    )
    from .cli_trace import add_trace_parser

    return parser, {"env": p_env, "check": p_check, "bench": p_bench, "trace": add_trace_parser(sub)}


def _silence_stdout() -> None:
    """Point descriptor 1 at /dev/null so that the interpreter's last flush of a closed pipe stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _open_closed_std_fds() -> None:
    """Put /dev/null on a closed descriptor 0, 1 or 2 (``hwdist check >&-``), so that no file the command
    or its ranks open lands there and receives what they print."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``hwdist`` command; returns the exit code.

    0 ok, 1 failures, 2 usage errors, 141 stdout closed.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _open_closed_std_fds()
    parser, commands = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage and error, not the top-level one
        (commands.get(args.command) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.command == "env":
            from .cli_env import cmd_env

            code = cmd_env(args, sys.stdout)
        elif args.command == "check":
            code = cmd_check(args, sys.stdout, sys.stderr, argv)
        elif args.command == "trace":
            from .cli_trace import cmd_trace

            code = cmd_trace(args, sys.stdout, sys.stderr)
        else:
            from .cli_bench import cmd_bench

            code = cmd_bench(args, sys.stdout, sys.stderr, argv)
        sys.stdout.flush()
        return int(code or 0)
    except UsageError as exc:
        print(error_line(args.command, str(exc)), file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
