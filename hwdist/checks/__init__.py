"""The check bodies: every public collective verified on real ranks, shared by ``hwdist check``,
the distributed tests (``pytest -m dist``) and the accelerator tests (``pytest -m hardware``).

A check is a function name from hwdist's public API and a dtype. Its body runs
on every rank, builds each rank's input from its rank number, calls
``hwdist.<name>`` in several forms and compares each result with a value
computed independently from the rank numbers (never with what another hwdist
function returns). Where the group's driver declares that no correct plan
exists (the driver's ``plan`` raises [`hwdist.PlanError`][hwdist.drivers.base.PlanError], e.g. int64
reductions on the emulated accelerator), the check expects hwdist to refuse
the call with [`hwdist.PlanError`][hwdist.drivers.base.PlanError] on every rank, and counts that as
honoured. A check with no op to ask the driver about (object collectives)
counts a [`hwdist.PlanError`][hwdist.drivers.base.PlanError] from the call as the table's refusal. A row
whose every case was refused that way is ``refused (as declared)``; ``FAIL``
is only for a wrong result or an unexpected error.

The rank-side entry point is [`run_check`][hwdist.checks.run_check]; [`judge`][hwdist.checks.judge]
turns every rank's findings into one [`Row`][hwdist.checks.Row];
[`run_checks`][hwdist.checks.run_checks] drives a pool of ranks from the parent
process and yields the rows of the table. A test runs the same bodies through
its own pool::

    results = dist(run_check, world_size, backend, "all_reduce", "int32")
    row = judge("all_reduce", "int32", results, backend)
    assert row.status in ("pass", REFUSED), row.detail
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from .. import settings
from ._context import INJECT_ENV, Context
from ._data import FLOAT, MOVABLE, NUMERIC, REDUCIBLE
from ._movers import (
    check_all_gather,
    check_all_to_all,
    check_broadcast,
    check_gather,
    check_scatter,
    check_send_recv,
)
from ._objects import (
    check_all_gather_object,
    check_all_reduce_dict,
    check_all_reduce_params,
    check_broadcast_object,
    check_broadcast_object_list,
    check_collect_results,
    check_collect_results_cpu,
    check_collect_results_gpu,
    check_dist_info,
    check_gather_object,
    check_scatter_object_list,
    check_sync_random_seed,
)
from ._reductions import check_all_reduce, check_reduce, check_reduce_mean, check_reduce_scatter

__all__ = [
    "Row",
    "REFUSED",
    "CHECKS",
    "INJECT_ENV",
    "check_names",
    "dtypes_of",
    "run_check",
    "judge",
    "run_checks",
]

REFUSED = "refused (as declared)"
"""Status of a row whose every case the driver's capability table refuses."""

Body = Callable[[Context], None]

#: (check name, dtypes or (None,), body). The order is the table's order.
CHECKS: tuple[tuple[str, tuple[Optional[str], ...], Body], ...] = (
    ("dist_info", (None,), check_dist_info),
    ("all_reduce", REDUCIBLE, check_all_reduce),
    ("reduce", REDUCIBLE, check_reduce),
    ("all_gather", MOVABLE, check_all_gather),
    ("gather", MOVABLE, check_gather),
    ("broadcast", MOVABLE, check_broadcast),
    ("scatter", MOVABLE, check_scatter),
    ("reduce_scatter", NUMERIC, check_reduce_scatter),
    ("all_to_all", MOVABLE, check_all_to_all),
    ("send_recv", MOVABLE, check_send_recv),
    ("sync_random_seed", (None,), check_sync_random_seed),
    ("reduce_mean", FLOAT, check_reduce_mean),
    ("all_reduce_dict", NUMERIC, check_all_reduce_dict),
    ("all_reduce_params", FLOAT, check_all_reduce_params),
    ("all_gather_object", (None,), check_all_gather_object),
    ("gather_object", (None,), check_gather_object),
    ("broadcast_object_list", (None,), check_broadcast_object_list),
    ("broadcast_object", (None,), check_broadcast_object),
    ("scatter_object_list", (None,), check_scatter_object_list),
    ("collect_results", (None,), check_collect_results),
    ("collect_results_cpu", (None,), check_collect_results_cpu),
    ("collect_results_gpu", (None,), check_collect_results_gpu),
)

_BODIES = {name: body for name, _, body in CHECKS}
_DTYPES = {name: dtypes for name, dtypes, _ in CHECKS}


@dataclass
class Row:
    """One line of the check table.

    Attributes:
        name: the check (a hwdist function, or a group such as 'dist_info').
        dtype: the dtype checked, or '-'.
        status: 'pass', 'FAIL' or [`REFUSED`][hwdist.checks.REFUSED] (every case refused as the
            table declares).
        seconds: slowest rank's time for the check body (None when not run).
        detail: what was covered, what was refused as declared, or what failed.
    """

    name: str
    dtype: str
    status: str
    seconds: Optional[float] = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Plain-data form (for ``--json``)."""
        return asdict(self)


def check_names() -> list[str]:
    """Names of every check, in table order."""
    return [name for name, _, _ in CHECKS]


def dtypes_of(name: str) -> tuple[Optional[str], ...]:
    """The dtype names check ``name`` runs on (``(None,)`` for a check with no dtype)."""
    return _DTYPES[name]


# --------------------------------------------------------------------------
# rank side
# --------------------------------------------------------------------------


def run_check(name: str, dtype: Optional[str], inject: str = "", placement: str = "comm") -> dict[str, Any]:
    """Run check ``name`` on ``dtype`` on this rank (called on every rank of the group).

    Args:
        name: a name from [`check_names`][hwdist.checks.check_names].
        dtype: one of [`dtypes_of`][hwdist.checks.dtypes_of] ``(name)``.
        inject: ``"fail"`` makes the first comparison fail, ``"raise"`` raises on the last rank.
        placement: ``"comm"`` (inputs on the group's communication device) or ``"cpu"``
            (inputs on the CPU: hwdist moves them to the backend's device and back).

    Returns:
        ``{"seconds", "covered", "refused", "why", "problems", "values"}``: what this rank found.
    """
    ctx = Context(dtype, inject, placement)
    start = time.perf_counter()
    _BODIES[name](ctx)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "covered": ctx.covered,
        "refused": ctx.refused,
        "why": ctx.why,
        "problems": ctx.problems,
        "values": ctx.values,
    }


# --------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------


def _parse_inject(spec: Optional[str], source: str = INJECT_ENV) -> tuple[str, Optional[str], str]:
    """``NAME[:DTYPE[:MODE]]`` -> (name, dtype or None for any, mode 'fail'|'raise').

    Raises:
        ValueError: naming ``source`` (the variable or option), when NAME is no check, DTYPE is not one
            of that check's dtypes or MODE is neither 'fail' nor 'raise' (an injection that matches
            nothing would silently test nothing).
    """
    if not spec:
        return "", None, ""
    parts = spec.split(":")
    name = parts[0].strip()
    dtype = parts[1].strip() if len(parts) > 1 and parts[1].strip() else None
    mode = parts[2].strip() if len(parts) > 2 and parts[2].strip() else "fail"
    table = {n: dts for n, dts, _body in CHECKS}
    if name not in table:
        raise ValueError(
            f"{source}: {name!r} names no check; expected NAME[:DTYPE[:fail|raise]] with NAME one of"
            f" {', '.join(table)}, got {spec!r}"
        )
    dtypes = [d for d in table[name] if d is not None]
    if dtype is not None and dtype not in dtypes:
        have = ", ".join(dtypes) if dtypes else "none (leave DTYPE empty)"
        raise ValueError(f"{source}: check {name!r} has no dtype {dtype!r}; its dtypes: {have}")
    if mode not in ("fail", "raise") or len(parts) > 3:
        raise ValueError(f"{source}: mode must be 'fail' or 'raise', got {spec!r}")
    return name, dtype, mode


def parse_inject(spec: Optional[str], source: str = INJECT_ENV) -> tuple[str, Optional[str], str]:
    """Check an injection spec up front (``hwdist check`` does, before starting ranks); see ``run_checks``."""
    return _parse_inject(spec, source)


def _cross_rank(name: str, results: list[dict[str, Any]], backend: str) -> list[str]:
    """Checks that need every rank's answer (judged from rank numbers)."""
    problems: list[str] = []
    n = len(results)
    if name == "dist_info":
        for r, res in enumerate(results):
            v = res["values"]
            if v["rank"] != r or v["world_size"] != n:
                problems.append(
                    f"rank {r}: get_rank/get_world_size gave {v['rank']}/{v['world_size']}, expected {r}/{n}"
                )
            if v["local_rank"] != r or v["local_size"] != n:
                problems.append(
                    f"rank {r}: get_local_rank/get_local_size gave {v['local_rank']}/{v['local_size']},"
                    f" expected {r}/{n}"
                )
            if v["driver"] != backend:
                problems.append(
                    f"rank {r}: the default group resolves to driver {v['driver']!r}, expected {backend!r}"
                )
            if not isinstance(v["backend"], str) or not v["backend"]:
                problems.append(f"rank {r}: get_backend() gave {v['backend']!r}")
    if name == "sync_random_seed":
        seeds = [res["values"].get("seed") for res in results]
        if len(set(map(repr, seeds))) != 1:
            problems.append(f"seeds differ across ranks: {seeds}")
    first = (results[0]["covered"], results[0]["refused"])
    for r, res in enumerate(results[1:], 1):
        if (res["covered"], res["refused"]) != first and not res["problems"]:
            problems.append(
                f"rank {r} covered {res['covered']} and refused {res['refused']},"
                f" rank 0 covered {results[0]['covered']} and refused {results[0]['refused']}"
            )
    return problems


def judge(name: str, dtype: Optional[str], results: list[dict[str, Any]], backend: str) -> Row:
    """The table row for check ``name`` on ``dtype``, from what every rank's check body found.

    Args:
        name: the check.
        dtype: its dtype name, or None.
        results: [`run_check`][hwdist.checks.run_check]'s return value, one per rank, in rank order.
        backend: the driver name the group was created with.

    Returns:
        ``FAIL`` with the first problem if any rank found one (or the ranks disagree),
        [`REFUSED`][hwdist.checks.REFUSED] if every case was refused as declared, else ``pass``.
    """
    label = dtype or "-"
    seconds = max(res["seconds"] for res in results)
    problems = [p for res in results for p in res["problems"]]
    problems += _cross_rank(name, results, backend)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Row(name, label, "FAIL", seconds, problems[0] + more)
    covered = results[0]["covered"]
    refused = results[0]["refused"]
    detail = " ".join(covered)
    if refused:
        detail += ("; " if detail else "") + "refused as declared: " + " ".join(refused)
    if refused and not covered:
        why = results[0].get("why") or []
        return Row(name, label, REFUSED, seconds, detail + (f" ({why[0]})" if why else ""))
    return Row(name, label, "pass", seconds, detail)


def _root_cause(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip().startswith("root cause:"):
            return line.strip()
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[0].strip() if lines else type(exc).__name__


def run_checks(
    world_size: int,
    backend: str,
    *,
    only: Optional[Sequence[str]] = None,
    inject: Optional[str] = None,
    timeout: float = 60.0,
    pg_timeout: float = 30.0,
    pool_factory: Optional[Callable[[], Any]] = None,
) -> Iterator[Row]:
    """Run the checks on ``world_size`` local ranks of ``backend``; yield rows as they finish.

    Args:
        world_size: number of ranks to spawn.
        backend: a registered, available backend name.
        only: run just these check names (default: all).
        inject: ``NAME[:DTYPE[:raise]]`` to make one check fail on purpose
            (default: the ``HWDIST_CHECK_INJECT`` environment variable).
        timeout: hard limit for one check on all ranks, in seconds.
        pg_timeout: process-group timeout, in seconds.
        pool_factory: makes the ranks (default: a ``RankPool`` of ``world_size``
            ranks); called again when a failure broke them. ``hwdist check``
            passes one that reports progress, or runs on MPI processes.

    Raises:
        hwdist.testing.RankFailure: the ranks could not start.
    """
    from ..testing import RankFailure, RankPool

    inj_name, inj_dtype, inj_mode = _parse_inject(inject if inject is not None else settings.text(INJECT_ENV))
    wanted = set(only) if only else None
    pool: Optional[Any] = None
    try:
        for name, dtypes, _body in CHECKS:
            if wanted is not None and name not in wanted:
                continue
            for dtype in dtypes:
                mode = inj_mode if inj_name == name and inj_dtype in (None, dtype) else ""
                if pool is None or pool.broken:
                    if pool is not None:
                        pool.close()
                    if pool_factory is not None:
                        pool = pool_factory()
                    else:
                        pool = RankPool(world_size, backend, timeout=timeout, pg_timeout=pg_timeout)
                try:
                    results = pool.run(run_check, name, dtype, mode)
                except RankFailure as exc:
                    yield Row(name, dtype or "-", "FAIL", None, _root_cause(exc))
                    continue
                yield judge(name, dtype, results, backend)
    finally:
        if pool is not None:
            pool.close()
