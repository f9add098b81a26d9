"""Measuring a backend's real capability table on real ranks (the driver file: ``driver_file.py``).

``hwdist check --backend NAME --measure`` (the default for a backend torch knows and hwdist does not)
runs every op x dtype x reduce op with raw ``torch.distributed`` calls on the backend's group, checks
each result against values computed here from the rank numbers, and derives the capability table a
driver declares: what the backend does right, nothing it refuses or gets wrong. ``--write-driver PATH``
writes that table as a Python file with a ``hwdist.Driver`` class to register
(docs/writing-a-driver.md).

Rank side: [`measure_init`][hwdist.checks.measure.measure_init] creates the group (through hwdist's
start-up, so a driver's factory or a torch-only backend start the way they do for a user), then one
[`measure_op`][hwdist.checks.measure.measure_op] call per op runs its cases. After each case the
ranks meet on the group's store (never on the backend being measured), so a case one rank refuses
cannot leave another rank a case ahead; a case that times out ends the op, and the parent starts
fresh ranks for the next one. Parent side: [`measure`][hwdist.checks.measure.measure] drives the
ranks and returns a [`Measurement`][hwdist.checks.measure.Measurement].
"""

from __future__ import annotations

import datetime
import functools
import importlib
import operator
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = [
    "OPS",
    "DTYPE_NAMES",
    "Measurement",
    "measure",
    "measure_init",
    "measure_op",
    "derive",
    "rank_state",
    "meet",
    "root_cause",
]

#: Every dtype measured, by name.
DTYPE_NAMES = (
    "bool uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64 complex64 complex128".split()
)
_ARITH = ("sum", "product", "min", "max")
_BITWISE = ("band", "bor", "bxor")
#: What is measured: torch's call forms hwdist issues (an op's list and flat forms apart), the async
#: form of all_reduce and torch's own object collectives (all four: all_gather_object,
#: broadcast_object_list, gather_object, scatter_object_list).
REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_flat")
MOVES = (
    "all_gather", "broadcast", "all_gather_flat", "gather", "scatter", "all_to_all", "all_to_all_single",
    "send_recv",
)
OTHERS = ("barrier", "async_all_reduce", "object_collectives")
OPS = REDUCTIONS + MOVES + OTHERS
#: How long the ranks meet on the store after a case, beyond the group's own timeout, in seconds.
_SYNC_GRACE_S = 5.0


def reduce_ops_of(dtype: str) -> tuple[str, ...]:
    """The reduce ops measured on ``dtype``: those hwdist's planner can issue on it."""
    if dtype == "bool":
        return ("max", "min", "bxor")  # every reduce op on bool is one of these on 0/1 values
    if dtype.startswith("complex"):
        return ("sum", "avg")
    if dtype.startswith(("float", "bfloat")):
        return _ARITH + ("avg",)
    return _ARITH + _BITWISE


def cases(op: str) -> list[tuple[Optional[str], Optional[str]]]:
    """The (dtype, reduce op) cases of ``op``."""
    if op in REDUCTIONS:
        return [(d, r) for d in DTYPE_NAMES for r in reduce_ops_of(d)]
    if op in MOVES:
        return [(d, None) for d in DTYPE_NAMES]
    if op == "async_all_reduce":
        return [("float32", "sum")]
    return [(None, None)]


# --------------------------------------------------------------------------- values


def _values(rank: int, n: int, dtype: str, rop: Optional[str]) -> torch.Tensor:
    """Rank ``rank``'s ``n`` input values for ``rop`` on ``dtype``, wide (int64/float64/complex128/bool)
    on the CPU; small enough that every result is exact in every dtype for up to 8 ranks."""
    i = torch.arange(n, dtype=torch.int64)
    if dtype == "bool":
        return (rank + i) % 3 == 0
    if rop == "product":
        base = 1 + (rank + i) % 2
    elif rop in _BITWISE:
        base = (rank * 5 + i * 3) % 16
    else:
        base = rank + 1 + i % 3
    if dtype.startswith("complex"):
        return torch.complex(base.double(), -base.double())
    return base.double() if dtype.startswith(("float", "bfloat")) else base


def _combine(rop: str, rows: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(rows)
    if stacked.dtype == torch.bool:
        ints = stacked.to(torch.int64)
        if rop == "max":
            return ints.amax(0).bool()
        if rop == "min":
            return ints.amin(0).bool()
        return (ints.sum(0) % 2).bool()  # bxor
    if rop in ("sum", "avg"):
        total = stacked.sum(0)
        return total / len(rows) if rop == "avg" else total
    if rop == "product":
        return stacked.prod(0)
    if rop in ("min", "max"):
        return stacked.amin(0) if rop == "min" else stacked.amax(0)
    fn = {"band": operator.and_, "bor": operator.or_, "bxor": operator.xor}[rop]
    return functools.reduce(fn, rows)


def _torch_op(rop: str) -> Any:
    import torch.distributed as dist

    return getattr(dist.ReduceOp, rop.upper())


# --------------------------------------------------------------------------- rank side

_STATE: dict[str, Any] = {}


def measure_init(backend: str, imports: Sequence[str], store_path: str, timeout: float) -> dict[str, Any]:
    """Create the group of ``backend`` on this rank (after importing ``imports``), as hwdist starts one."""
    import torch.distributed as dist

    from .. import registry
    from ..launch.core import init_backend

    for module in imports:
        importlib.import_module(module)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(store_path, world)
    driver = init_backend(
        backend,
        rank=rank,
        world_size=world,
        local_rank=int(os.environ.get("LOCAL_RANK", rank)),
        store=dist.PrefixStore("group/", store),
        timeout=timeout,
    )
    _STATE.clear()
    _STATE.update(
        rank=rank,
        world=world,
        device=driver.comm_device(),
        sync=dist.PrefixStore("hwdist-measure/", store),
        timeout=timeout,
        count=0,
    )
    creator = getattr(driver, "creator_module", None)
    if creator is None:
        from .. import _compat

        creator = getattr(_compat.torch_backend_creator(driver.torch_name), "__module__", None)
    return {
        "device": str(driver.comm_device()),
        "device_type": driver.device_type,
        "driver": driver.name,
        "torch_backend": driver.torch_name,
        "generic": registry.is_generic(driver),
        "creator_module": creator,
        "accelerator": driver.device_type != "cpu",
    }


def _meet(status: str) -> None:
    """Wait until every rank has finished the current case (on the store, not the backend)."""
    st = _STATE
    key = f"{st['count']}/"
    st["sync"].set(f"{key}{st['rank']}", status)
    st["sync"].wait(
        [f"{key}{r}" for r in range(st["world"])], datetime.timedelta(seconds=st["timeout"] + _SYNC_GRACE_S)
    )
    st["count"] += 1


def measure_op(op: str) -> dict[str, Any]:
    """Run every case of ``op`` on this rank; ``{"results": [(dtype, rop, status, detail)], "broken": bool}``.

    ``status``: ``ok``, ``refused`` (the call raised) or ``wrong`` (a result differs from the value
    computed from the rank numbers). A case that took the group's whole timeout ends the op
    (``broken``): the parent starts fresh ranks.
    """
    from ._context import describe, same

    st = _STATE
    results: list[tuple[Optional[str], Optional[str], str, str]] = []
    for dtype, rop in cases(op):
        start = time.monotonic()
        try:
            got, want = _run(op, dtype, rop)
            if want is not None and not same(got, want):
                status, detail = "wrong", f"got {describe(got)[:120]}, expected {describe(want)[:120]}"
            else:
                status, detail = "ok", ""
        except Exception as exc:  # the backend refused it: what it said
            text = " ".join(str(exc).split())
            status, detail = "refused", f"{type(exc).__name__}: {text[:200]}"
        results.append((dtype, rop, status, detail))
        if time.monotonic() - start >= 0.8 * st["timeout"]:
            return {"results": results, "broken": True}  # a timed-out group is not trusted further
        _meet(status)
    return {"results": results, "broken": False}


def _cast(values: torch.Tensor, dtype: str) -> torch.Tensor:
    return values.to(getattr(torch, dtype)).to(_STATE["device"])


def _run(op: str, dtype: Optional[str], rop: Optional[str]) -> tuple[Any, Any]:
    """Issue one case with raw torch.distributed calls: (what this rank got, what it must be) or
    (None, None) where this rank has nothing to check."""
    import torch.distributed as dist

    st = _STATE
    rank, world = st["rank"], st["world"]
    if op == "barrier":
        dist.barrier()
        return None, None
    if op == "object_collectives":
        return _run_objects(rank, world)
    return _run_tensors(op, dtype, rop, rank, world)


def _run_objects(rank: int, world: int) -> tuple[Any, Any]:
    """torch's four object collectives, each checked."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "text": "x" * rank})
    sent: list[Any] = [{"from": 0}] if rank == 0 else [None]
    dist.broadcast_object_list(sent, src=0)
    at_root: Optional[list[Any]] = [None] * world if rank == 0 else None
    dist.gather_object(rank * 10, at_root, dst=0)
    mine: list[Any] = [None]
    dist.scatter_object_list(mine, [f"to {r}" for r in range(world)] if rank == 0 else None, src=0)
    want = [{"rank": r, "text": "x" * r} for r in range(world)]
    got = (gathered, sent[0], at_root, mine[0])
    return got, (want, {"from": 0}, [r * 10 for r in range(world)] if rank == 0 else None, f"to {rank}")


def _run_tensors(op: str, dtype: Optional[str], rop: Optional[str], rank: int, world: int) -> tuple[Any, Any]:
    """One tensor case: (what this rank got, what it must be), or (None, None) with nothing to check."""
    import torch.distributed as dist

    from .. import _compat

    st = _STATE
    want: Any
    mine: Any
    outs: Any
    out: Any
    assert dtype is not None
    wide = getattr(torch, dtype)
    n, piece = 3, 2
    if op in ("all_reduce", "async_all_reduce", "reduce"):
        assert rop is not None
        t = _cast(_values(rank, n, dtype, rop), dtype)
        want = _combine(rop, [_values(q, n, dtype, rop) for q in range(world)]).to(wide)
        if op == "reduce":
            dist.reduce(t, 0, op=_torch_op(rop))
            return (t, want) if rank == 0 else (None, None)
        work = dist.all_reduce(t, op=_torch_op(rop), async_op=op == "async_all_reduce")
        if work is not None:
            work.wait()
        return t, want
    if op in ("reduce_scatter", "reduce_scatter_flat"):
        assert rop is not None
        mine = _values(rank, piece * world, dtype, rop)
        want = _combine(rop, [_values(q, piece * world, dtype, rop) for q in range(world)])
        want = want[rank * piece : (rank + 1) * piece].to(wide)
        out = torch.empty(piece, dtype=wide, device=st["device"])
        if op == "reduce_scatter":
            dist.reduce_scatter(out, list(_cast(mine, dtype).chunk(world)), op=_torch_op(rop))
        else:
            fn = _compat.reduce_scatter_tensor
            if fn is None:
                raise RuntimeError("this torch has no flat reduce_scatter")
            fn(out, _cast(mine, dtype), op=_torch_op(rop))
        return out, want
    rows = [_values(q, n, dtype, None).to(wide) for q in range(world)]
    t = _cast(_values(rank, n, dtype, None), dtype)
    if op == "all_gather":
        outs = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(outs, t)
        return outs, rows
    if op == "all_gather_flat":
        flat = torch.empty(n * world, dtype=wide, device=st["device"])
        fn = _compat.all_gather_into_tensor
        if fn is None:
            raise RuntimeError("this torch has no flat all_gather")
        fn(flat, t)
        return flat, torch.cat(rows)
    if op == "broadcast":
        dist.broadcast(t, 0)
        return t, rows[0]
    if op == "gather":
        outs = [torch.empty_like(t) for _ in range(world)] if rank == 0 else None
        dist.gather(t, outs, dst=0)
        return (outs, rows) if rank == 0 else (None, None)
    if op == "scatter":
        out = torch.empty_like(t)
        pieces = [_cast(_values(0, n, dtype, None) + j, dtype) for j in range(world)] if rank == 0 else None
        dist.scatter(out, pieces, src=0)
        return out, (_values(0, n, dtype, None) + rank).to(wide)
    if op in ("all_to_all", "all_to_all_single"):
        mine = _cast(_values(rank, piece * world, dtype, None), dtype)
        want = torch.cat(
            [_values(q, piece * world, dtype, None)[rank * piece : (rank + 1) * piece] for q in range(world)]
        ).to(wide)
        if op == "all_to_all":
            outs = [torch.empty(piece, dtype=wide, device=st["device"]) for _ in range(world)]
            dist.all_to_all(outs, list(mine.chunk(world)))
            return torch.cat(outs), want
        out = torch.empty(piece * world, dtype=wide, device=st["device"])
        dist.all_to_all_single(out, mine)
        return out, want
    if op == "send_recv":
        if world < 2:
            raise RuntimeError("point to point needs 2 ranks")
        if rank == 0:
            dist.send(t, 1)
            return None, None
        if rank == 1:
            received = torch.empty_like(t)
            dist.recv(received, 0)
            return received, rows[0]
        return None, None
    raise ValueError(f"unknown op {op!r}")


# --------------------------------------------------------------------------- parent side


@dataclass
class Measurement:
    """What ``hwdist check --measure`` found for one backend.

    Attributes:
        backend: the backend name measured.
        world_size: ranks it ran on.
        info: the rank's account of the group (device, driver, whether it is generic, the creator's module).
        results: ``(op, dtype, reduce op) -> (status, detail)``; status ``ok``, ``refused``, ``wrong`` or
            ``hung`` (the op did not finish on every rank).
        table: the derived capability table ([`derive`][hwdist.checks.measure.derive]).
    """

    backend: str
    world_size: int
    info: dict[str, Any]
    results: dict[tuple[str, Optional[str], Optional[str]], tuple[str, str]] = field(default_factory=dict)
    table: dict[str, Any] = field(default_factory=dict)
    torch_version: str = torch.__version__
    seconds: float = 0.0

    def ok(self, op: str, dtype: Optional[str], rop: Optional[str] = None) -> bool:
        """Whether the case worked on every rank."""
        return self.results.get((op, dtype, rop), ("", ""))[0] == "ok"

    def as_dict(self) -> dict[str, Any]:
        """Plain data (``--json``)."""
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "torch": self.torch_version,
            "seconds": self.seconds,
            **self.info,
            "table": self.table,
            "results": [
                {"op": op, "dtype": d, "reduce_op": r, "status": s, "detail": why}
                for (op, d, r), (s, why) in self.results.items()
            ],
        }


def _defined(dtype: str, rop: str) -> bool:
    return rop in reduce_ops_of(dtype)


def derive(m: Measurement) -> dict[str, Any]:
    """The capability table the measurement supports (names, sorted): a driver declares these.

    * a move op is native when it moves uint8 right (``all_to_all``: its list and single forms, point
      to point: ``send`` and ``recv``), and all_gather and broadcast are (every other move falls back
      on them); ``dtypes``: those every native move op moves right (any other travels as its bytes);
    * ``reduce_dtypes``: all_reduce's ``sum`` right (``max`` for bool);
    * ``reduce_ops``: right on every reduce dtype it is defined on, in all_reduce;
      ``avg_dtypes``: the floating reduce dtypes whose ``avg`` is right (``avg`` then is a reduce op);
    * ``reduce`` and ``reduce_scatter`` are native when right for every reduce dtype and reduce op
      above; ``flat_ops`` the same for the flat forms;
    * ``supports_async`` and ``native_object_collectives`` as measured.

    A reduction right on only some dtypes or reduce ops is left out whole (hwdist then emulates it
    with one that is right, or refuses it): the table never claims a case that was refused or wrong.
    """
    # A move op is native when it moves uint8 right (any dtype can travel as its bytes); the dtypes
    # are those every native move op moves right (the others travel as bytes, which costs no
    # correctness).
    forms = {
        "all_gather": ("all_gather",),
        "broadcast": ("broadcast",),
        "gather": ("gather",),
        "scatter": ("scatter",),
        "all_to_all": ("all_to_all", "all_to_all_single"),
        "send": ("send_recv",),
    }
    native: set[str] = set()
    moving = [op for op, measured in forms.items() if all(m.ok(f, "uint8") for f in measured)]
    dtypes: list[str] = []
    if "all_gather" in moving and "broadcast" in moving:  # what every other move falls back on
        dtypes = [d for d in DTYPE_NAMES if all(m.ok(f, d) for op in moving for f in forms[op])]
        native |= set(moving) | ({"recv"} if "send" in moving else set())
    if m.ok("barrier", None):
        native.add("barrier")
    reduce_dtypes = [d for d in DTYPE_NAMES if m.ok("all_reduce", d, "max" if d == "bool" else "sum")]
    reduce_ops = []
    for rop in ("sum", "product", "min", "max") + _BITWISE:
        on = [d for d in reduce_dtypes if _defined(d, rop)]
        if on and all(m.ok("all_reduce", d, rop) for d in on):
            reduce_ops.append(rop)
    avg_dtypes = [
        d for d in reduce_dtypes if d.startswith(("float", "bfloat")) and m.ok("all_reduce", d, "avg")
    ]
    if avg_dtypes:
        reduce_ops.append("avg")

    def all_right(op: str) -> bool:
        needed = [
            (d, r) for d in reduce_dtypes for r in reduce_ops
            if _defined(d, r) and (r != "avg" or d in avg_dtypes)
        ]
        return bool(needed) and all(m.ok(op, d, r) for d, r in needed)

    if reduce_dtypes:
        native.add("all_reduce")
        for op in ("reduce", "reduce_scatter"):
            if all_right(op):
                native.add(op)
    flat = []
    if dtypes and all(m.ok("all_gather_flat", d) for d in dtypes):
        flat.append("all_gather")
    if reduce_dtypes and all_right("reduce_scatter_flat"):
        flat.append("reduce_scatter")
    return {
        "native_ops": sorted(native),
        "flat_ops": sorted(flat),
        "reduce_ops": sorted(reduce_ops),
        "dtypes": dtypes,
        "reduce_dtypes": reduce_dtypes,
        "avg_dtypes": avg_dtypes,
        "supports_async": m.ok("async_all_reduce", "float32", "sum"),
        "native_object_collectives": m.ok("object_collectives", None),
    }


def _root_cause(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip().startswith("root cause:"):
            return line.strip()[len("root cause:") :].strip()
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def measure(
    world_size: int,
    backend: str,
    *,
    imports: Sequence[str] = (),
    timeout: float = 60.0,
    say: Optional[Callable[[str], None]] = None,
) -> Measurement:
    """Measure ``backend``'s table on ``world_size`` spawned local ranks.

    Args:
        world_size: ranks (at least 2: point to point needs two).
        backend: a backend name hwdist can start (a registered driver, or a backend torch knows).
        imports: modules every rank imports first (a package that registers its backend with torch).
        timeout: seconds for the ranks to start, for the group's operations and for one op's cases.
        say: progress lines (``hwdist check`` writes them to stderr).

    Raises:
        hwdist.testing.RankFailure: the ranks could not create the group (its report names why).
        ValueError: ``world_size`` below 2.
    """
    from ..testing import RankFailure, RankPool

    if world_size < 2:
        raise ValueError(f"measuring needs at least 2 ranks (point to point), got {world_size}")
    tell = say or (lambda text: None)
    begin = time.monotonic()
    where = tempfile.mkdtemp(prefix="hwdist-measure-")
    starts = 0
    pool: Any = None
    m = Measurement(backend, world_size, {})

    def start() -> Any:
        nonlocal starts
        starts += 1
        tell(f"{'restarting' if starts > 1 else 'starting'} {world_size} rank(s) for backend '{backend}'...")
        fresh = RankPool(world_size, None, timeout=timeout, pg_timeout=timeout)
        try:
            store = os.path.join(where, f"store{starts}")
            info = fresh.run(measure_init, backend, tuple(imports), store, timeout)
        except BaseException:
            fresh.close()
            raise
        return fresh, info[0]

    try:
        for op in OPS:
            if pool is None:
                pool, info = start()
                if not m.info:
                    m.info = info
            try:
                outs = pool.run(measure_op, op, timeout=timeout + 30)
            except RankFailure as exc:
                why = _root_cause(exc)
                for d, r in cases(op):
                    m.results.setdefault((op, d, r), ("hung", why))
                tell(f"{op}: the ranks failed ({why}); the next op starts on fresh ranks")
                pool.close()
                pool = None
                continue
            for case in zip(*(o["results"] for o in outs)):
                dtype, rop = case[0][0], case[0][1]
                statuses = [c[2] for c in case]
                bad = next((c for c in case if c[2] == "wrong"), None) or next(
                    (c for c in case if c[2] != "ok"), None
                )
                status = "ok" if bad is None else ("wrong" if "wrong" in statuses else bad[2])
                m.results[(op, dtype, rop)] = (status, "" if bad is None else bad[3])
            if any(o["broken"] for o in outs):
                for d, r in cases(op):
                    m.results.setdefault((op, d, r), ("hung", "a case timed out; not run"))
                tell(f"{op}: a case timed out; the next op starts on fresh ranks")
                pool.close()
                pool = None
    finally:
        if pool is not None:
            pool.close()
        shutil.rmtree(where, ignore_errors=True)
    m.table = derive(m)
    m.seconds = time.monotonic() - begin
    return m


def rank_state() -> dict[str, Any]:
    """This rank's measuring state after [`measure_init`][hwdist.checks.measure.measure_init]: rank,
    world, comm device, the store the ranks meet on, timeout (the conformance run shares it)."""
    return _STATE


def meet(status: str) -> None:
    """Wait until every rank has finished the current case (on the store, not the backend)."""
    _meet(status)


def root_cause(exc: BaseException) -> str:
    """The root-cause line of a rank failure report, or its first words."""
    return _root_cause(exc)
