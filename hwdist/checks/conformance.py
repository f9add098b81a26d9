"""``hwdist check --conformance``: does the backend compute what its table claims, on edge values?

The usual checks feed ordinary values (positive, distinct), which a library computing MIN as SUM
can pass by luck of the values. This mode issues every reduction (all_reduce, reduce, the flat
reduce_scatter) for every dtype x reduce op, and the moves all_gather and broadcast, on edge values:
ties, negatives, +/-inf, NaN, -0.0, integer extremes, as a 0-d tensor, an empty one and an odd size
(9 elements), at 2 and 3 ranks. Each case runs twice: with a raw ``torch.distributed`` call on the
backend's group (what the library itself does) and through hwdist (what the driver's plan makes of
it). Each result is compared with an exact local computation from every rank's inputs
(bit-exact: NaN where NaN, the sign of zero, no tolerance: every edge value and result is exact in
its dtype).

The report prints what the library got right, wrong or refused per op and reduce op, then diffs it
with the driver's declared table: a case the table passes through natively that the library gets
wrong or refuses is a failure (exit 1), as is any wrong result through hwdist. ``--write-driver
PATH`` writes the corrected table as a driver file (a subclass of the driver with the wrong pairs
declared ``inexact_reductions``, so hwdist plans around them). docs/writing-a-driver.md shows a
vendor how to run it and send the table.

The rank side reuses ``measure``'s start-up and its meeting on the store after each case, so a case
one rank refuses cannot leave another a case ahead.
"""

from __future__ import annotations

import functools
import operator
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from . import measure

__all__ = [
    "OPS",
    "SIZES",
    "edge_values",
    "exact",
    "identical",
    "conformance_op",
    "Conformance",
    "run",
    "diff",
    "corrected",
    "render",
]

#: The ops checked: the reductions, and the moves a wrong byte path would corrupt.
OPS = ("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast")
_REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter")
#: Positions of the edge pattern; every case also runs as a 0-d tensor (position 0) and an empty one.
SIZES = 9
_NAN = float("nan")
_INF = float("inf")


# --------------------------------------------------------------------------- values


def _float_row(r: int, w: int, rop: str) -> list[float]:
    if rop == "product":
        return [
            2.0,
            -1.0 if r % 2 == 0 else 1.0,
            _INF if r == 0 else 1.0,
            -_INF if r == w - 1 else -1.0,
            _NAN,
            -0.0,
            float(2 * r - (w - 1)),
            _INF if r == 0 else (-_INF if r == 1 else 1.0),
            1.0,
        ]
    return [
        3.0,
        -(r + 1.0),
        _INF if r == 0 else r + 1.0,
        -_INF if r == w - 1 else -(r + 1.0),
        _NAN,
        -0.0,
        float(2 * r - (w - 1)),
        _INF if r == 0 else (-_INF if r == 1 else 1.0),
        r + 1.0,
    ]


def _int_row(r: int, w: int, rop: str, info: Any) -> list[int]:
    lo, hi = int(info.min), int(info.max)
    signed = lo < 0
    if rop in ("min", "max"):
        if signed:
            return [
                5,
                -(r + 1),
                hi if r == 0 else 0,
                lo if r == w - 1 else -1,
                hi,
                lo,
                2 * r - (w - 1),
                r,
                (r + 1) * 7 % 11,
            ]
        return [5, r + 1, hi if r == 0 else 0, 0 if r == w - 1 else 1, hi, 0, 2 * r, r, (r + 1) * 7 % 11]
    if rop == "sum":
        b = hi // w
        if signed:
            return [5, -(r + 1), b, -b, 0, b if r == 0 else -b, 2 * r - (w - 1), r, -1]
        return [5, r + 1, b, 0, 0, b if r == 0 else 0, 2 * r, r, 1]
    if rop == "product":  # |product| <= 2**3 at 3 ranks: fits int8
        neg = -1 if signed else 1
        return [
            2,
            neg if r % 2 == 0 else 1,
            0 if r == 0 else 3,
            neg,
            1,
            2 if r == 0 else neg,
            1,
            -2 if signed and r == w - 1 else 1,
            1,
        ]
    if signed:  # bitwise
        return [-1, lo, hi, r, 1 << r, 0, -(r + 1), 0x55 if r % 2 else 0x2A, lo if r == 0 else hi]
    return [hi, (hi + 1) // 2, hi // 2, r, 1 << r, 0, hi - r, 0x55 if r % 2 else 0xAA, 0 if r == 0 else hi]


def edge_values(rank: int, world: int, dtype: str, rop: Optional[str]) -> torch.Tensor:
    """Rank ``rank``'s ``SIZES`` edge values for ``rop`` on ``dtype``, wide (int64, float64, complex128,
    bool) on the CPU; chosen so that the exact result of ``rop`` over ``world`` ranks (at most 3) is
    exact in ``dtype``. ``rop`` None: the values a move carries (the float pattern holds NaN, -0.0, inf).
    """
    r, w = rank, world
    if dtype == "bool":
        return torch.tensor([True, False, r == 0, r != w - 1, r % 2 == 0, r % 2 == 1, True, r == 1, False])
    if dtype.startswith("complex"):  # sum and avg of finite values (inf and NaN have no one complex form)
        real = torch.tensor(
            [3.0, -(r + 1.0), r + 1.0, float(2 * r - (w - 1)), -0.0, 1.0, 2.0, -(r + 1.0), r + 1.0],
            dtype=torch.float64,
        )  # every sum a multiple of w / 2: avg exact
        return torch.complex(real, -real)
    if dtype.startswith(("float", "bfloat")):
        return torch.tensor(_float_row(r, w, rop or "sum"), dtype=torch.float64)
    info = torch.iinfo(getattr(torch, dtype))
    return torch.tensor(_int_row(r, w, rop or "bor", info), dtype=torch.int64)


def exact(rop: str, rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """``rop`` over ``rows`` (one per rank, in rank order), exactly, element by element, in the wide dtype:
    IEEE arithmetic two values at a time, so -0.0 + -0.0 stays -0.0 and inf - inf is NaN."""
    if rows[0].dtype == torch.bool:
        ints = torch.stack(list(rows)).to(torch.int64)
        fold = {"max": ints.amax(0), "min": ints.amin(0), "bxor": ints.sum(0) % 2}[rop]
        return fold.bool()
    fns: dict[str, Callable[[Any, Any], Any]] = {
        "sum": operator.add,
        "avg": operator.add,
        "product": operator.mul,
        "min": torch.minimum,
        "max": torch.maximum,
        "band": operator.and_,
        "bor": operator.or_,
        "bxor": operator.xor,
    }
    total = functools.reduce(fns[rop], rows)
    if rop != "avg":
        return total
    if total.is_complex():  # part by part: a complex division by (n + 0j) can lose the sign of a zero
        return torch.complex(total.real / len(rows), total.imag / len(rows))
    return total / len(rows)


def identical(got: Any, want: Any) -> bool:
    """Bit-for-bit agreement of two results: same shape and dtype, NaN where NaN, equal values with the
    same sign of zero; bool byte-exact; lists item by item."""
    if isinstance(got, (list, tuple)) or isinstance(want, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and isinstance(want, (list, tuple))
            and len(got) == len(want)
            and all(identical(a, b) for a, b in zip(got, want))
        )
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)):
        return False
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    a, b = got.detach().cpu(), want.detach().cpu()
    if b.dtype == torch.bool:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if b.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if not b.is_floating_point():
        return torch.equal(a, b)
    a, b = a.double(), b.double()
    nan = torch.isnan(b)
    if not torch.equal(torch.isnan(a), nan):
        return False
    a, b = a[~nan], b[~nan]
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


# --------------------------------------------------------------------------- rank side


def _shapes(op: str) -> list[tuple[str, slice, bool]]:
    """(label, positions, 0-d) of each form a case runs in."""
    forms = [("9", slice(0, SIZES), False), ("empty", slice(0, 0), False)]
    if op != "reduce_scatter":  # its output is a piece of a flat input: no 0-d form
        forms.insert(0, ("0-d", slice(0, 1), True))
    return forms


def _hwdist_rop(rop: str) -> str:
    return "mean" if rop == "avg" else rop


def _one(op: str, dtype: str, rop: Optional[str], via: str) -> Optional[str]:
    """Run ``op`` on ``dtype`` in every form, with raw torch (``via='torch'``) or hwdist; None if right,
    else what went wrong first. Every form runs on every rank whatever this rank found (a rank that
    stopped early would leave the others a collective ahead). Raises what the call raised."""
    import torch.distributed as dist

    import hwdist

    from .. import _compat

    st = measure.rank_state()
    rank, world, device = st["rank"], st["world"], st["device"]
    real = getattr(torch, dtype)
    rows = [edge_values(q, world, dtype, rop) for q in range(world)]
    first: Optional[str] = None
    for label, part, scalar in _shapes(op):

        def local(q: int) -> torch.Tensor:
            t = rows[q][part]
            return t.reshape(()) if scalar else t

        mine = local(rank).to(real).to(device).clone()  # the call works in place: never on ``rows``
        want: Any
        got: Any
        if op in ("all_reduce", "reduce"):
            assert rop is not None
            want = exact(rop, [local(q) for q in range(world)]).to(real)
            if via == "torch":
                redop = getattr(dist.ReduceOp, rop.upper())
                dist.all_reduce(mine, op=redop) if op == "all_reduce" else dist.reduce(mine, 0, op=redop)
            elif op == "all_reduce":
                hwdist.all_reduce(mine, op=_hwdist_rop(rop))
            else:
                hwdist.reduce(mine, dst=0, op=_hwdist_rop(rop))
            got = mine
            if op == "reduce" and rank != 0:
                continue
        elif op == "reduce_scatter":
            assert rop is not None
            flat = [torch.cat([rows[q][part]] * world) for q in range(world)]  # every piece: the pattern
            want = exact(rop, [rows[q][part] for q in range(world)]).to(real)
            got = torch.empty(want.shape, dtype=real, device=device)
            data = flat[rank].to(real).to(device).clone()
            if via == "torch":
                fn = _compat.reduce_scatter_tensor
                if fn is None:
                    raise RuntimeError("this torch has no flat reduce_scatter")
                fn(got, data, op=getattr(dist.ReduceOp, rop.upper()))
            else:
                hwdist.reduce_scatter(got, data, op=_hwdist_rop(rop))
        elif op == "all_gather":
            want = [local(q).to(real) for q in range(world)]
            if via == "torch":
                got = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(got, mine)
            else:
                got = hwdist.all_gather(mine)
        else:  # broadcast
            want = local(0).to(real)
            if via == "torch":
                dist.broadcast(mine, 0)
            else:
                hwdist.broadcast(mine, src=0)
            got = mine
        if first is None and not identical(got, want):
            from ._context import describe

            first = f"{label}: got {describe(got)[:100]}, expected {describe(want)[:100]}"
    return first


def _cases(op: str) -> list[tuple[str, Optional[str]]]:
    if op in _REDUCTIONS:
        return [(d, r) for d in measure.DTYPE_NAMES for r in measure.reduce_ops_of(d)]
    return [(d, None) for d in measure.DTYPE_NAMES]


def conformance_op(op: str) -> dict[str, Any]:
    """Every case of ``op`` on this rank, raw and through hwdist:
    ``{"results": [(dtype, rop, raw, raw_detail, hw, hw_detail)], "broken": bool}``; a status is
    ``ok``, ``wrong`` or ``refused`` (the call raised; through hwdist, a ``PlanError`` is the table's own
    refusal: ``planned-refusal``)."""
    from ..errors import PlanError

    st = measure.rank_state()
    out: list[tuple[str, Optional[str], str, str, str, str]] = []
    for dtype, rop in _cases(op):
        start = time.monotonic()
        statuses = []
        for via in ("torch", "hwdist"):
            try:
                why = _one(op, dtype, rop, via)
                statuses += ["ok", ""] if why is None else ["wrong", why]
            except PlanError as exc:
                statuses += ["planned-refusal", " ".join(str(exc).split())[:200]]
            except Exception as exc:
                statuses += ["refused", f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"]
        measure.meet(statuses[0])
        out.append((dtype, rop, *statuses))  # type: ignore[arg-type]
        if time.monotonic() - start >= 0.8 * st["timeout"]:
            return {"results": out, "broken": True}
    return {"results": out, "broken": False}


# --------------------------------------------------------------------------- parent side

Key = tuple[str, str, Optional[str]]


@dataclass
class Conformance:
    """What ``hwdist check --conformance`` found.

    Attributes:
        backend: the backend checked.
        world_sizes: the rank counts it ran at.
        info: the ranks' account of the group (device type, driver, creator module).
        raw: ``(op, dtype, reduce op) -> {world: (status, detail)}`` of the raw torch calls.
        via_hwdist: the same through hwdist (``planned-refusal``: the driver's plan refused it).
    """

    backend: str
    world_sizes: tuple[int, ...]
    info: dict[str, Any] = field(default_factory=dict)
    raw: dict[Key, dict[int, tuple[str, str]]] = field(default_factory=dict)
    via_hwdist: dict[Key, dict[int, tuple[str, str]]] = field(default_factory=dict)
    seconds: float = 0.0

    def worst(self, table: dict[Key, dict[int, tuple[str, str]]], key: Key) -> tuple[str, str]:
        """The worst status of ``key`` over the rank counts (wrong, refused, planned-refusal, ok)."""
        found = list(table.get(key, {}).values()) or [("hung", "not run")]
        order = {"wrong": 0, "hung": 1, "refused": 2, "planned-refusal": 3, "ok": 4}
        return min(found, key=lambda sd: order.get(sd[0], 1))


def run(
    world_sizes: Sequence[int],
    backend: str,
    *,
    imports: Sequence[str] = (),
    timeout: float = 60.0,
    say: Optional[Callable[[str], None]] = None,
) -> Conformance:
    """Run every conformance case of ``backend`` at each of ``world_sizes`` (each at least 2) on spawned
    local ranks.

    Raises:
        hwdist.testing.RankFailure: the ranks could not create the group (its report names why).
        ValueError: a world size below 2.
    """
    from ..testing import RankFailure, RankPool

    if not world_sizes or min(world_sizes) < 2:
        raise ValueError(f"the conformance run needs at least 2 ranks, got {list(world_sizes)}")
    tell = say or (lambda text: None)
    begin = time.monotonic()
    conf = Conformance(backend, tuple(world_sizes))
    where = tempfile.mkdtemp(prefix="hwdist-conformance-")
    try:
        for world in world_sizes:
            tell(f"starting {world} rank(s) for backend '{backend}'...")
            pool = RankPool(world, None, timeout=timeout, pg_timeout=timeout)
            try:
                store = os.path.join(where, f"store{world}")
                info = pool.run(measure.measure_init, backend, tuple(imports), store, timeout)[0]
                conf.info = conf.info or info
                for op in OPS:
                    try:
                        outs = pool.run(conformance_op, op, timeout=timeout + 30)
                    except RankFailure as exc:
                        why = measure.root_cause(exc)
                        for d, r in _cases(op):
                            conf.raw.setdefault((op, d, r), {})[world] = ("hung", why)
                        tell(f"{op} at {world} ranks: the ranks failed ({why})")
                        pool.close()
                        pool = RankPool(world, None, timeout=timeout, pg_timeout=timeout)
                        store = os.path.join(where, f"store{world}-{op}")
                        pool.run(measure.measure_init, backend, tuple(imports), store, timeout)
                        continue
                    for case in zip(*(o["results"] for o in outs)):
                        d, r = case[0][0], case[0][1]
                        conf.raw.setdefault((op, d, r), {})[world] = _merge([(c[2], c[3]) for c in case])
                        conf.via_hwdist.setdefault((op, d, r), {})[world] = _merge(
                            [(c[4], c[5]) for c in case]
                        )
            finally:
                pool.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    conf.seconds = time.monotonic() - begin
    return conf


def _merge(per_rank: list[tuple[str, str]]) -> tuple[str, str]:
    for status in ("wrong", "refused", "planned-refusal"):
        for s, why in per_rank:
            if s == status:
                return s, why
    return "ok", ""


def declared(driver: Any, op: str, dtype: str, rop: Optional[str]) -> str:
    """What ``driver``'s table makes of a case: ``native`` (passed to the library as it is), ``planned``
    (cast, emulated or divided), ``refused`` (``PlanError``)."""
    from ..errors import PlanError

    try:
        found = driver.plan(op, getattr(torch, dtype), None if rop is None else _hwdist_rop(rop))
    except PlanError:
        return "refused"
    if found.passthrough and (rop != "avg" or found.reduce_op == "avg"):
        return "native"
    return "planned"


@dataclass(frozen=True)
class Finding:
    """One disagreement between the table and what was found."""

    op: str
    dtype: str
    rop: Optional[str]
    table: str  # what the table does with the case
    found: str  # the library's status (raw), or 'hwdist wrong'
    detail: str
    failure: bool  # the table passes a wrong or refused case through, or hwdist got it wrong


def diff(conf: Conformance, driver: Any) -> list[Finding]:
    """Every case where the declared table and the results disagree, failures first."""
    out = []
    for key in conf.raw:
        op, dtype, rop = key
        raw, why = conf.worst(conf.raw, key)
        hw, hw_why = conf.worst(conf.via_hwdist, key)
        table = declared(driver, op, dtype, rop)
        if hw in ("wrong", "refused", "hung"):
            out.append(Finding(op, dtype, rop, table, f"through hwdist: {hw}", hw_why, True))
        elif table == "native" and raw != "ok":
            out.append(Finding(op, dtype, rop, table, raw, why, True))
        elif table != "native" and raw == "ok" and op == "all_reduce":
            out.append(
                Finding(op, dtype, rop, table, "library right", "the table could pass it through", False)
            )
    return sorted(out, key=lambda f: (not f.failure, f.op, f.dtype, f.rop or ""))


def corrected(conf: Conformance, driver: Any) -> dict[str, Any]:
    """The driver's declarations, corrected by what was found: a reduction the library got wrong or
    refused on a dtype joins ``inexact_reductions`` (hwdist then never issues it: it widens or refuses);
    a dtype a move got wrong leaves ``dtypes`` (it travels as bytes)."""
    caps = driver.caps
    inexact = set(caps.inexact)
    dtypes = None if caps.dtypes is None else set(caps.dtypes)
    native = set(caps.native_ops)
    for (op, dtype, rop), _ in conf.raw.items():
        raw, _ = conf.worst(conf.raw, (op, dtype, rop))
        if raw == "ok" or declared(driver, op, dtype, rop) != "native":
            continue
        real = getattr(torch, dtype)
        if op in _REDUCTIONS and rop is not None:
            if rop == "avg":
                inexact.add(("avg", real))
            else:
                inexact.add((rop, real))
        elif dtypes is not None:
            dtypes.discard(real)
        elif dtypes is None and op in ("all_gather", "broadcast"):
            dtypes = {getattr(torch, d) for d in measure.DTYPE_NAMES} - {real}
    return {
        "native_ops": sorted(native),
        "dtypes": None if dtypes is None else sorted(str(d).replace("torch.", "") for d in dtypes),
        "inexact_reductions": sorted((op, str(d).replace("torch.", "")) for op, d in inexact),
    }


def render(conf: Conformance, driver: Any) -> str:
    """The report: per op and reduce op the dtypes the library got right, wrong and refused, then the
    diff with the declared table."""
    import torch as _torch

    worlds = ",".join(map(str, conf.world_sizes))
    lines = [
        f"hwdist check --conformance: backend '{conf.backend}', device {conf.info.get('device_type')},"
        f" {worlds} ranks, torch {_torch.__version__}; edge values (ties, negatives, +/-inf, NaN, -0.0,"
        " integer extremes; 0-d, empty, 9 elements), compared bit for bit",
        f"{'OP':<15} {'REDUCE':<8} {'LIBRARY RIGHT ON':<58} WRONG / REFUSED",
    ]
    for op in OPS:
        for rop in dict.fromkeys(r for _, r in _cases(op)):
            keys = [(op, d, r) for d, r in _cases(op) if r == rop]
            status = {k[1]: conf.worst(conf.raw, k)[0] for k in keys}
            good = " ".join(d for d, s in status.items() if s == "ok")
            bad = " ".join(f"{d}({s})" for d, s in status.items() if s != "ok")
            lines.append(f"{op:<15} {rop or '-':<8} {good or '-':<58} {bad or '-'}")
    findings = diff(conf, driver)
    lines += ["", f"against the declared table of driver '{driver.name}' ({type(driver).__name__}):"]
    if not any(f.failure for f in findings):
        lines.append(
            "  no case the table passes through natively was wrong or refused; hwdist was right on all"
        )
    for f in findings:
        mark = "FAIL" if f.failure else "note"
        lines.append(
            f"  {mark} {f.op} {f.rop or '-'} {f.dtype}: table {f.table}, found {f.found}"
            + (f" ({f.detail[:140]})" if f.detail else "")
        )
    return "\n".join(lines)


def driver_source(conf: Conformance, driver: Any) -> str:
    """A driver module declaring ``driver``'s table corrected by ``conf``: a subclass of its class (imported
    from its module), with the wrong pairs in ``inexact_reductions``; the findings kept as data."""
    import datetime

    from .driver_file import class_name

    fixed = corrected(conf, driver)
    base = type(driver)
    cls = class_name(conf.backend).replace("Driver", "ConformedDriver")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    pairs = ", ".join(f"({op!r}, torch.{d})" for op, d in fixed["inexact_reductions"])
    lines = [
        f'"""hwdist driver for backend {conf.backend!r}, corrected by `hwdist check --conformance`.',
        "",
        f"Checked at {', '.join(map(str, conf.world_sizes))} ranks, device {conf.info.get('device_type')},"
        f" torch {torch.__version__}, {when}: edge values",
        "through raw torch.distributed calls, compared bit for bit with an exact local computation.",
        "The reduce op and dtype pairs the library got wrong or refused are declared inexact: hwdist",
        "widens them losslessly or refuses them. Register it in every process before hwdist uses the",
        "backend:",
        "",
        "    import hwdist",
        f"    from <this module> import {cls}",
        f"    hwdist.register_backend({conf.backend!r}, {cls}, override=True)",
        '"""',
        "",
        "import torch",
        "",
        f"from {base.__module__} import {base.__name__}",
        "",
        "",
        f"class {cls}({base.__name__}):",
        f'    """{base.__name__} with what the conformance run found wrong declared inexact."""',
        "",
        f"    inexact_reductions = frozenset({{{pairs}}})",
    ]
    was = (
        None
        if driver.caps.dtypes is None
        else sorted(str(d).replace("torch.", "") for d in driver.caps.dtypes)
    )
    if fixed["dtypes"] != was:
        moved = ", ".join(f"torch.{d}" for d in fixed["dtypes"])
        lines.append(f"    dtypes = frozenset({{{moved}}})")
    lines += [
        "",
        "",
        "#: Every disagreement found: (op, reduce op, dtype) -> what the table did, what was found.",
        "CONFORMANCE_FINDINGS = {",
    ]
    for f in diff(conf, driver):
        lines.append(
            f"    ({f.op!r}, {f.rop!r}, {f.dtype!r}): ({f.table!r}, {f.found!r}, {f.detail[:120]!r}),"
        )
    lines += ["}", ""]
    return "\n".join(lines)

