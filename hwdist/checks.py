"""The checks ``hwdist check`` runs: every public collective, verified on real ranks.

Each check is a function name from hwdist's public API and a dtype. The body
runs on every rank of a [`hwdist.testing.RankPool`][hwdist.testing.harness.RankPool], builds each rank's
input from its rank number, calls ``hwdist.<name>`` and compares the result
with a value computed independently from the rank numbers (never with what
another hwdist function returns). Where the backend's driver declares that no
correct plan exists (``Driver.plan`` raises [`hwdist.PlanError`][hwdist.drivers.base.PlanError], e.g.
int64 reductions on the emulated accelerator), the check expects hwdist to
refuse the call with an error on every rank, and counts that as honoured. A
check with no op to ask the driver about (object collectives) counts a
[`hwdist.PlanError`][hwdist.drivers.base.PlanError] from the call as the table's refusal. A row whose
every case was refused that way is ``refused (as declared)``; ``FAIL`` is only
for a wrong result or an unexpected error.

A function that hwdist does not (yet) provide gives a "n/a" row, not a failure.

The rank-side entry point is [`run_check`][hwdist.checks.run_check]; [`run_checks`][hwdist.checks.run_checks] drives a
pool of ranks from the parent process and yields one [`Row`][hwdist.checks.Row] per check.
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

__all__ = [
    "Row",
    "REFUSED",
    "CHECKS",
    "INJECT_ENV",
    "check_names",
    "run_check",
    "run_checks",
]

#: Environment variable that makes one check fail on purpose (tests of the
#: failure path): ``NAME`` or ``NAME:DTYPE`` corrupts the expected value,
#: ``NAME:DTYPE:raise`` raises on the last rank.
INJECT_ENV = "HWDIST_CHECK_INJECT"

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_ALL = ("float32", "float16", "bfloat16", "int32", "int64", "bool")
_NUMERIC = ("float32", "float16", "bfloat16", "int32", "int64")
_FLOAT = ("float32", "float16", "bfloat16")

REFUSED = "refused (as declared)"
"""Status of a row whose every case the driver's capability table refuses."""


@dataclass
class Row:
    """One line of the check table.

    Attributes:
        name: the hwdist function checked (or a group such as 'dist info').
        dtype: the dtype checked, or '-'.
        status: 'pass', 'FAIL', 'n/a' or [`REFUSED`][hwdist.checks.REFUSED] (every case refused as the table declares).
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


# --------------------------------------------------------------------------
# rank side
# --------------------------------------------------------------------------


class _Ctx:
    """What a check body needs on one rank, and where it records its findings."""

    def __init__(self, hw: Any, name: str, dtype: Optional[str], inject: str) -> None:
        self.hw = hw
        self.fn: Callable[..., Any] = getattr(hw, name)
        self.name = name
        self.rank: int = hw.get_rank()
        self.world: int = hw.get_world_size()
        self.device: torch.device = hw.get_comm_device()
        self.dtype_name = dtype
        self.dtype: torch.dtype = _DTYPES[dtype] if dtype else torch.float32
        self.covered: list[str] = []
        self.refused: list[str] = []
        self.why: list[str] = []
        self.problems: list[str] = []
        self.values: dict[str, Any] = {}
        self._inject = inject

    # -- data ---------------------------------------------------------------
    def tensor(self, values: Any, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``values`` (numbers or a float64/int64 tensor) as ``dtype`` on the comm device."""
        dt = dtype or self.dtype
        src = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.float64)
        if dt == torch.bool:
            src = src != 0
        return src.to(dt).to(self.device)

    def refusal(self, op: str, reduce_op: Optional[str] = None, dtype: Optional[torch.dtype] = None) -> Optional[str]:
        """The driver's reason why ``op`` cannot run on this dtype, or None if it has a plan."""
        from .drivers.base import PlanError

        driver = self.hw.resolve(None, self.device)
        try:
            driver.plan(op, dtype or self.dtype, reduce_op)
        except PlanError as exc:
            return str(exc)
        return None

    # -- verdicts -----------------------------------------------------------
    def case(
        self,
        label: str,
        call: Callable[[], Any],
        verify: Callable[[Any], None],
        *,
        op: Optional[str] = None,
        reduce_op: Optional[str] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        """Run one sub-case: expect a refusal if the driver declares none, else verify."""
        from .drivers.base import PlanError

        why = self.refusal(op, reduce_op, dtype) if op is not None else None
        if why is not None:
            try:
                out = call()
            except Exception:  # every rank refuses: the declared limit is honoured
                self.refused.append(label)
                self.why.append(why)
                return
            if self.world > 1:
                self.problems.append(f"{label}: the driver declares no plan ({why}) but the call returned")
                return
            # One rank: hwdist moves nothing (as for objects), so there is nothing to refuse; check the result.
            before = len(self.problems)
            verify(out)
            if len(self.problems) == before:
                self.covered.append(label)
            return
        try:
            out = call()
        except PlanError as exc:
            if op is not None:  # the driver declared a plan: refusing is a failure
                raise
            self.refused.append(label)  # no op to ask about (objects): the table's refusal
            self.why.append(str(exc))
            return
        before = len(self.problems)
        verify(out)
        if len(self.problems) == before:
            self.covered.append(label)

    def expect(self, label: str, got: Any, want: Any) -> None:
        """Record a problem unless ``got`` equals ``want`` (tensors by value, dtype-exact for bool)."""
        if self._inject == "fail":
            self._inject = ""
            want = _corrupt(want)
        if not _same(got, want):
            self.problems.append(f"rank {self.rank}: {label}: got {_short(got)}, expected {_short(want)}")

    def inject_raise(self) -> None:
        """Raise on the last rank when asked to (failure-path tests)."""
        if self._inject == "raise" and self.rank == self.world - 1:
            raise RuntimeError(f"failure injected by {INJECT_ENV}")


def _corrupt(want: Any) -> Any:
    if isinstance(want, torch.Tensor):
        bad = want.clone()
        flat = bad.view(-1)
        if flat.numel():
            flat[0] = ~flat[0] if bad.dtype == torch.bool else flat[0] + 1
        return bad
    if isinstance(want, list):
        return [_corrupt(want[0]), *want[1:]] if want else [None]
    if isinstance(want, dict):
        return {**want, "__injected__": True}
    return ("injected", want)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape:
            return False
        a, b = a.detach().cpu(), b.detach().cpu()
        if b.dtype == torch.bool or a.dtype == torch.bool:
            # Byte-exact: a bool holding 3 prints as True but breaks later arithmetic.
            return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        if b.is_floating_point() or a.is_floating_point():
            tol = 1e-2 if torch.finfo(b.dtype if b.is_floating_point() else a.dtype).bits <= 16 else 1e-6
            return bool(torch.allclose(a.double(), b.double(), rtol=tol, atol=0.0, equal_nan=True))
        return torch.equal(a.long(), b.long())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _fmt(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        text = f"{str(t.dtype).replace('torch.', '')}{t.tolist()}"
        if t.dtype == torch.bool and bool((t.view(torch.uint8) > 1).any()):
            text += f" (non-canonical bool bytes {t.view(torch.uint8).tolist()})"
        return text
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        inner = ", ".join(_fmt(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    return repr(x)


def _short(x: Any, limit: int = 160) -> str:
    text = _fmt(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- inputs and independently computed expectations -----------------------

_ARITH = ("sum", "mean", "product", "min", "max")
_BITWISE = ("band", "bor", "bxor")


def _reduce_ops(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return ("sum", "max", "min")  # on bool: sum/max = any, min = all
    if dtype.is_floating_point:
        return _ARITH
    return ("sum", "product", "min", "max") + _BITWISE


def _input(rank: int, rop: str, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    """Rank ``rank``'s contribution for reduce op ``rop`` (float64/int64 on CPU)."""
    k = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    if rop == "product":
        return (1 + (k + rank) % 2).double()  # 1s and 2s: exact products in every dtype
    if rop in _BITWISE:
        return ((k + 1) * 5 + (1 << rank % 20)).long()
    return (k % 3 + rank + 1).double()


def _bool_input(rank: int, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    k = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    return ((k == rank) | (k == 5)).long()  # 5: true everywhere; rank position: one rank


def _combine(parts: Sequence[torch.Tensor], rop: str, dtype: torch.dtype) -> torch.Tensor:
    """What reducing ``parts`` with ``rop`` must give, computed in 64 bits, then cast."""
    stack = torch.stack(list(parts))
    if dtype == torch.bool:
        out = stack.amin(0) if rop == "min" else stack.amax(0)
        return out.bool()
    if rop == "sum":
        out = stack.sum(0)
    elif rop == "mean":
        out = stack.double().mean(0)
    elif rop == "product":
        out = stack.prod(0)
    elif rop == "min":
        out = stack.amin(0)
    elif rop == "max":
        out = stack.amax(0)
    else:
        bit = {"band": operator.and_, "bor": operator.or_, "bxor": operator.xor}[rop]
        out = functools.reduce(bit, [p.long() for p in parts])
    return out.to(dtype)


def _contribution(ctx: _Ctx, rank: int, rop: str, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    return _bool_input(rank, shape) if ctx.dtype == torch.bool else _input(rank, rop, shape)


def _moved(rank: int, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    """Rank ``rank``'s data for ops that only move data (distinct per rank)."""
    n = int(torch.tensor(shape).prod())
    return (torch.arange(n).reshape(shape) + 10 * rank).double()


def _moved_for(ctx: _Ctx, rank: int, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    if ctx.dtype == torch.bool:
        n = int(torch.tensor(shape).prod())
        return ((torch.arange(n).reshape(shape) + rank) % 2).long()
    return _moved(rank, shape)


def _cpu(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (t != 0) if dtype == torch.bool else t.to(dtype)


# ---- bodies ------------------------------------------------------------------


def _body_dist_info(ctx: _Ctx) -> None:
    hw = ctx.hw
    ctx.values["rank"] = hw.get_rank()
    ctx.values["world_size"] = hw.get_world_size()
    ctx.expect("get_dist_info", hw.get_dist_info(), (ctx.values["rank"], ctx.values["world_size"]))
    ctx.expect("is_distributed", hw.is_distributed(), True)
    ctx.expect("is_main_process", hw.is_main_process(), ctx.values["rank"] == 0)
    ctx.values["local_rank"] = hw.get_local_rank()
    ctx.values["local_size"] = hw.get_local_size()
    ctx.values["backend"] = hw.get_backend()
    ctx.values["driver"] = hw.resolve().name
    ctx.expect("get_comm_device type", isinstance(hw.get_comm_device(), torch.device), True)
    hw.barrier()
    ctx.covered.extend(["rank", "world_size", "local_rank", "backend", "barrier"])


def _body_all_reduce(ctx: _Ctx) -> None:
    for rop in _reduce_ops(ctx.dtype):
        data = ctx.tensor(_contribution(ctx, ctx.rank, rop))
        want = _combine([_contribution(ctx, q, rop) for q in range(ctx.world)], rop, ctx.dtype)
        ctx.case(
            rop,
            lambda: ctx.fn(data, op=rop),
            lambda _out: ctx.expect(rop, data, want),
            op="all_reduce",
            reduce_op=rop,
        )


def _body_reduce(ctx: _Ctx) -> None:
    dst = ctx.world - 1
    for rop in ("sum", "max"):
        data = ctx.tensor(_contribution(ctx, ctx.rank, rop))
        want = _combine([_contribution(ctx, q, rop) for q in range(ctx.world)], rop, ctx.dtype)

        def verify(_out: Any, data: torch.Tensor = data, want: torch.Tensor = want, rop: str = rop) -> None:
            if ctx.rank == dst:
                ctx.expect(f"{rop} on dst", data, want)

        ctx.case(rop, lambda: ctx.fn(data, dst=dst, op=rop), verify, op="reduce", reduce_op=rop)


def _body_all_gather(ctx: _Ctx) -> None:
    data = ctx.tensor(_moved_for(ctx, ctx.rank))
    want = [_cpu(_moved_for(ctx, q), ctx.dtype) for q in range(ctx.world)]
    ctx.case("equal shapes", lambda: ctx.fn(data), lambda out: ctx.expect("equal shapes", list(out), want), op="all_gather")
    # Shapes that differ across ranks (hwdist pads, gathers and trims).
    uneven = ctx.tensor(_moved_for(ctx, ctx.rank, (ctx.rank + 1, 2)))
    want_uneven = [_cpu(_moved_for(ctx, q, (q + 1, 2)), ctx.dtype) for q in range(ctx.world)]
    ctx.case(
        "uneven shapes",
        lambda: ctx.fn(uneven),
        lambda out: ctx.expect("uneven shapes", list(out), want_uneven),
        op="all_gather",
    )


def _body_gather(ctx: _Ctx) -> None:
    dst = ctx.world - 1
    data = ctx.tensor(_moved_for(ctx, ctx.rank))
    want = [_cpu(_moved_for(ctx, q), ctx.dtype) for q in range(ctx.world)] if ctx.rank == dst else []
    ctx.case(f"dst={dst}", lambda: ctx.fn(data, dst=dst), lambda out: ctx.expect(f"dst={dst}", list(out), want), op="gather")


def _body_broadcast(ctx: _Ctx) -> None:
    src = ctx.world - 1
    data = ctx.tensor(_moved_for(ctx, ctx.rank))
    want = _cpu(_moved_for(ctx, src), ctx.dtype)
    ctx.case(f"src={src}", lambda: ctx.fn(data, src=src), lambda _o: ctx.expect(f"src={src}", data, want), op="broadcast")
    # A non-contiguous view must be filled in place too.
    base = ctx.tensor(_moved_for(ctx, ctx.rank, (3, 2)))
    view = base.t()
    want_view = _cpu(_moved_for(ctx, src, (3, 2)), ctx.dtype).t()
    ctx.case(
        "non-contiguous",
        lambda: ctx.fn(view, src=src),
        lambda _o: ctx.expect("non-contiguous", view, want_view),
        op="broadcast",
    )


def _body_scatter(ctx: _Ctx) -> None:
    src = ctx.world - 1
    chunks = [ctx.tensor(_moved_for(ctx, q)) for q in range(ctx.world)] if ctx.rank == src else None
    out = ctx.tensor(torch.zeros(2, 3))
    want = _cpu(_moved_for(ctx, ctx.rank), ctx.dtype)

    def call() -> Any:
        if "scatter_list" in _params(ctx.fn):  # torch's form: scatter(out, scatter_list, src)
            return ctx.fn(out, scatter_list=chunks, src=src)
        return ctx.fn(chunks, src=src)  # input-first form returning this rank's chunk

    def verify(ret: Any) -> None:
        ctx.expect(f"src={src}", ret if isinstance(ret, torch.Tensor) else out, want)

    ctx.case(f"src={src}", call, verify, op="scatter")


def _body_reduce_scatter(ctx: _Ctx) -> None:
    n = ctx.world
    for rop in ("sum", "max"):
        # Rank q contributes chunk c built from q*n + c; rank r keeps the reduction of chunk r.
        chunks = [ctx.tensor(_contribution(ctx, ctx.rank * n + c, rop, (3,))) for c in range(n)]
        want = _combine([_contribution(ctx, q * n + ctx.rank, rop, (3,)) for q in range(n)], rop, ctx.dtype)
        out = ctx.tensor(torch.zeros(3))

        def call(chunks: list[torch.Tensor] = chunks, out: torch.Tensor = out, rop: str = rop) -> Any:
            return _out_first_or_returning(ctx.fn, out, chunks, op=rop)

        def verify(ret: Any, out: torch.Tensor = out, want: torch.Tensor = want, rop: str = rop) -> None:
            ctx.expect(rop, ret if isinstance(ret, torch.Tensor) else out, want)

        ctx.case(rop, call, verify, op="reduce_scatter", reduce_op=rop)


def _body_all_to_all(ctx: _Ctx) -> None:
    n = ctx.world
    # Rank r sends chunk c (built from r*n + c) to rank c and receives chunk r of every rank.
    send = [ctx.tensor(_moved_for(ctx, ctx.rank * n + c, (2,))) for c in range(n)]
    want = [_cpu(_moved_for(ctx, q * n + ctx.rank, (2,)), ctx.dtype) for q in range(n)]
    outs = [ctx.tensor(torch.zeros(2)) for _ in range(n)]

    def verify(ret: Any) -> None:
        ctx.expect("chunks", list(ret) if isinstance(ret, (list, tuple)) else outs, want)

    ctx.case("chunks", lambda: _out_first_or_returning(ctx.fn, outs, send), verify, op="all_to_all")


def _params(fn: Callable[..., Any]) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _out_first_or_returning(fn: Callable[..., Any], out: Any, inp: Any, **kwargs: Any) -> Any:
    """Call ``fn`` in torch's output-first form, or input-first when it returns the result.

    ``reduce_scatter`` and ``all_to_all`` have no mmengine signature: hwdist
    may take the output first (torch.distributed's order) or return it. The
    first parameter's name decides.
    """
    params = _params(fn)
    if params and params[0].startswith("out"):
        return fn(out, inp, **kwargs)
    return fn(inp, **kwargs)


def _body_send_recv(ctx: _Ctx) -> None:
    n, r = ctx.world, ctx.rank
    if n == 1:
        ctx.covered.append("(one rank: nothing to send)")
        return
    # A ring: rank r sends its data to r+1 and receives from r-1, with non-blocking calls.
    dst, src = (r + 1) % n, (r - 1) % n
    data = ctx.tensor(_moved_for(ctx, r))
    box = ctx.tensor(torch.zeros(2, 3))
    want = _cpu(_moved_for(ctx, src), ctx.dtype)
    isend, irecv = getattr(ctx.hw, "isend", None), getattr(ctx.hw, "irecv", None)

    def call() -> Any:
        if isend is not None and irecv is not None:
            handles = [irecv(box, src=src), isend(data, dst=dst)] if r % 2 else [isend(data, dst=dst), irecv(box, src=src)]
            for h in handles:
                h.wait()
            return "isend/irecv"
        if r % 2 == 0:  # even ranks send first, odd ranks receive first: no cycle of blocking sends
            ctx.fn(data, dst=dst)
            ctx.hw.recv(box, src=src)
        else:
            ctx.hw.recv(box, src=src)
            ctx.fn(data, dst=dst)
        return "send/recv"

    def verify(how: Any) -> None:
        ctx.expect(f"{how} ring", box, want)

    ctx.case("ring", call, verify, op="send")


def _body_reduce_mean(ctx: _Ctx) -> None:
    data = ctx.tensor(_input(ctx.rank, "mean"))
    want = _combine([_input(q, "mean") for q in range(ctx.world)], "mean", ctx.dtype)

    def verify(out: Any) -> None:
        ctx.expect("mean", out if isinstance(out, torch.Tensor) else data, want)

    ctx.case("mean", lambda: ctx.fn(data), verify, op="all_reduce", reduce_op="mean")


def _body_sync_random_seed(ctx: _Ctx) -> None:
    seed = ctx.fn()
    ctx.values["seed"] = seed
    ctx.expect("returns an int", isinstance(seed, int), True)
    ctx.covered.append("same on every rank")


def _body_all_reduce_dict(ctx: _Ctx) -> None:
    ops = ("sum", "mean") if ctx.dtype.is_floating_point else ("sum", "max")
    for rop in ops:
        # Keys deliberately not sorted: every rank must pair the same keys.
        shapes = {"zeta": (2,), "alpha": (3, 1), "mid": ()}
        data = {k: ctx.tensor(_contribution(ctx, ctx.rank + i, rop, s)) for i, (k, s) in enumerate(shapes.items())}
        want = {
            k: _combine([_contribution(ctx, q + i, rop, s) for q in range(ctx.world)], rop, ctx.dtype)
            for i, (k, s) in enumerate(shapes.items())
        }
        ctx.case(
            rop,
            lambda data=data, rop=rop: ctx.fn(data, op=rop),
            lambda _o, data=data, want=want, rop=rop: ctx.expect(rop, dict(data), want),
            op="all_reduce",
            reduce_op=rop,
        )
    if ctx.dtype == torch.float32:
        # Mixed dtypes: no key may lose precision to another key's dtype.
        mixed = {
            "f32": ctx.tensor([1.0 + 2**-20 + ctx.rank], torch.float32),
            "i64": ctx.tensor(torch.tensor([2**40 + ctx.rank]), torch.int64),
        }
        want_mixed = {
            "f32": torch.tensor([sum(1.0 + 2**-20 + q for q in range(ctx.world))], dtype=torch.float32),
            "i64": torch.tensor([sum(2**40 + q for q in range(ctx.world))], dtype=torch.int64),
        }
        ctx.case(
            "mixed float32+int64",
            lambda: ctx.fn(mixed, op="sum"),
            lambda _o: ctx.expect("mixed float32+int64", dict(mixed), want_mixed),
            op="all_reduce",
            reduce_op="sum",
            dtype=torch.int64,
        )


def _body_all_reduce_params(ctx: _Ctx) -> None:
    shapes = [(4, 3), (3,), (2, 2, 2)]
    variants: list[tuple[str, dict[str, Any]]] = [
        ("coalesced sum", {"coalesce": True, "op": "sum"}),
        ("one by one sum", {"coalesce": False, "op": "sum"}),
        ("small buckets mean", {"coalesce": True, "bucket_size_mb": 1e-5, "op": "mean"}),
    ]
    for label, kwargs in variants:
        rop = kwargs["op"]
        params = [
            torch.nn.Parameter(ctx.tensor(_input(ctx.rank + i, rop, s)), requires_grad=False)
            for i, s in enumerate(shapes)
        ]
        want = [_combine([_input(q + i, rop, s) for q in range(ctx.world)], rop, ctx.dtype) for i, s in enumerate(shapes)]
        ctx.case(
            label,
            lambda params=params, kwargs=kwargs: ctx.fn((p for p in params), **kwargs),  # a generator, as from model.parameters()
            lambda _o, params=params, want=want, label=label: ctx.expect(label, [p.data for p in params], want),
            op="all_reduce",
            reduce_op=rop,
        )


def _obj(rank: int) -> dict[str, Any]:
    """A picklable object whose size and content depend on the rank."""
    return {
        "rank": rank,
        "name": f"rank-{rank}",
        "tensor": torch.arange(3) + rank,
        "nested": [rank, (rank, None), {"f": rank / 2}],
        "blob": bytes([rank % 256]) * (100 * rank),
    }


def _body_all_gather_object(ctx: _Ctx) -> None:
    want = [_obj(q) for q in range(ctx.world)]
    ctx.case("mixed objects", lambda: ctx.fn(_obj(ctx.rank)), lambda out: ctx.expect("mixed objects", list(out), want))
    big = bytes([ctx.rank % 256]) * (1 << 20)
    want_big = [bytes([q % 256]) * (1 << 20) for q in range(ctx.world)]
    ctx.case("1 MiB each", lambda: ctx.fn(big), lambda out: ctx.expect("1 MiB each", list(out), want_big))


def _body_gather_object(ctx: _Ctx) -> None:
    dst = ctx.world - 1
    want = [_obj(q) for q in range(ctx.world)] if ctx.rank == dst else None

    def verify(out: Any) -> None:
        ctx.expect(f"dst={dst}", list(out) if out is not None else None, want)

    ctx.case(f"dst={dst}", lambda: ctx.fn(_obj(ctx.rank), dst=dst), verify)


def _body_broadcast_object_list(ctx: _Ctx) -> None:
    src = ctx.world - 1
    objs: list[Any] = [_obj(ctx.rank), "x" * ctx.rank, None]
    want = [_obj(src), "x" * src, None]
    ctx.case(f"src={src}", lambda: ctx.fn(objs, src=src), lambda _o: ctx.expect(f"src={src}", objs, want))


def _body_broadcast_object(ctx: _Ctx) -> None:
    src = ctx.world - 1
    ctx.case(f"src={src}", lambda: ctx.fn(_obj(ctx.rank), src=src), lambda out: ctx.expect(f"src={src}", out, _obj(src)))


def _body_scatter_object_list(ctx: _Ctx) -> None:
    src = ctx.world - 1
    inputs = [_obj(q) for q in range(ctx.world)] if ctx.rank == src else None
    out: list[Any] = [None]
    ctx.case(f"src={src}", lambda: ctx.fn(out, inputs, src=src), lambda _o: ctx.expect(f"src={src}", out[0], _obj(ctx.rank)))


def _result_item(i: int) -> Any:
    return None if i == 1 else {"index": i, "value": torch.tensor([float(i)])}


def _body_collect(ctx: _Ctx, **kwargs: Any) -> None:
    n = ctx.world
    size = 2 * n + 1  # not a multiple of n: the last rank's part is padded
    per_rank = -(-size // n)
    # DistributedSampler order: rank r holds items r, r+n, r+2n, ... (padded past size).
    part = [_result_item(ctx.rank + j * n) for j in range(per_rank)]
    want = [_result_item(i) for i in range(size)] if ctx.rank == 0 else None
    label = "ordered, padding dropped, None kept"
    ctx.case(label, lambda: ctx.fn(part, size, **kwargs), lambda out: ctx.expect(label, out, want))


def _body_collect_results(ctx: _Ctx) -> None:
    _body_collect(ctx)


#: (function name, dtypes or (None,), body). The order is the table's order.
CHECKS: tuple[tuple[str, tuple[Optional[str], ...], Callable[[_Ctx], None]], ...] = (
    ("dist_info", (None,), _body_dist_info),
    ("all_reduce", _ALL, _body_all_reduce),
    ("reduce", _ALL, _body_reduce),
    ("all_gather", _ALL, _body_all_gather),
    ("gather", _ALL, _body_gather),
    ("broadcast", _ALL, _body_broadcast),
    ("scatter", _ALL, _body_scatter),
    ("reduce_scatter", _NUMERIC, _body_reduce_scatter),
    ("all_to_all", _ALL, _body_all_to_all),
    ("send_recv", _ALL, _body_send_recv),
    ("sync_random_seed", (None,), _body_sync_random_seed),
    ("reduce_mean", _FLOAT, _body_reduce_mean),
    ("all_reduce_dict", _NUMERIC, _body_all_reduce_dict),
    ("all_reduce_params", _FLOAT, _body_all_reduce_params),
    ("all_gather_object", (None,), _body_all_gather_object),
    ("gather_object", (None,), _body_gather_object),
    ("broadcast_object_list", (None,), _body_broadcast_object_list),
    ("broadcast_object", (None,), _body_broadcast_object),
    ("scatter_object_list", (None,), _body_scatter_object_list),
    ("collect_results", (None,), _body_collect_results),
    ("collect_results_cpu", (None,), _body_collect_results),
    ("collect_results_gpu", (None,), _body_collect_results),
)

_BODIES = {name: body for name, _, body in CHECKS}
# Checks that are not one hwdist function.
_GROUPS = {"dist_info": "get_rank", "send_recv": "send"}


def check_names() -> list[str]:
    """Names of every check, in table order."""
    return [name for name, _, _ in CHECKS]


def run_check(name: str, dtype: Optional[str], inject: str = "") -> dict[str, Any]:
    """Run check ``name`` on ``dtype`` on this rank (called on every rank).

    Returns:
        ``{"seconds", "covered", "refused", "problems", "values"}``.
    """
    import hwdist

    ctx = _Ctx(hwdist, _GROUPS.get(name, name), dtype, inject)
    ctx.inject_raise()
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


def _parse_inject(spec: Optional[str]) -> tuple[str, Optional[str], str]:
    """``NAME[:DTYPE[:MODE]]`` -> (name, dtype or None for any, mode 'fail'|'raise')."""
    if not spec:
        return "", None, ""
    parts = spec.split(":")
    name = parts[0]
    dtype = parts[1] if len(parts) > 1 and parts[1] else None
    mode = parts[2] if len(parts) > 2 and parts[2] else "fail"
    if mode not in ("fail", "raise"):
        raise ValueError(f"{INJECT_ENV}: mode must be 'fail' or 'raise', got {mode!r}")
    return name, dtype, mode


def _cross_rank(name: str, results: list[dict[str, Any]], backend: str) -> list[str]:
    """Checks that need every rank's answer (run in the parent, from rank numbers)."""
    problems: list[str] = []
    n = len(results)
    if name == "dist_info":
        for r, res in enumerate(results):
            v = res["values"]
            if v["rank"] != r or v["world_size"] != n:
                problems.append(f"rank {r}: get_rank/get_world_size gave {v['rank']}/{v['world_size']}, expected {r}/{n}")
            if v["local_rank"] != r or v["local_size"] != n:
                problems.append(
                    f"rank {r}: get_local_rank/get_local_size gave {v['local_rank']}/{v['local_size']}, expected {r}/{n}"
                )
            if v["driver"] != backend:
                problems.append(f"rank {r}: the default group resolves to driver {v['driver']!r}, expected {backend!r}")
            if not isinstance(v["backend"], str) or not v["backend"]:
                problems.append(f"rank {r}: get_backend() gave {v['backend']!r}")
    if name == "sync_random_seed":
        seeds = [res["values"].get("seed") for res in results]
        if len(set(map(repr, seeds))) != 1:
            problems.append(f"seeds differ across ranks: {seeds}")
    return problems


def _summarise(name: str, results: list[dict[str, Any]], backend: str) -> tuple[str, str]:
    problems = [p for res in results for p in res["problems"]]
    problems += _cross_rank(name, results, backend)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return "FAIL", problems[0] + more
    covered = results[0]["covered"]
    refused = results[0]["refused"]
    detail = " ".join(covered)
    if refused:
        detail += ("; " if detail else "") + "refused as declared: " + " ".join(refused)
    if refused and not covered:
        why = results[0].get("why") or []
        return REFUSED, detail + (f" ({why[0]})" if why else "")
    return "pass", detail


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
    import hwdist
    from hwdist.testing import RankFailure, RankPool

    inj_name, inj_dtype, inj_mode = _parse_inject(inject if inject is not None else os.environ.get(INJECT_ENV))
    wanted = set(only) if only else None
    pool: Optional[RankPool] = None
    try:
        for name, dtypes, _body in CHECKS:
            if wanted is not None and name not in wanted:
                continue
            fn_name = _GROUPS.get(name, name)
            if getattr(hwdist, fn_name, None) is None:
                label = "all" if len(dtypes) > 1 else (dtypes[0] or "-")
                yield Row(name, label, "n/a", None, f"hwdist.{fn_name} is not available in this version")
                continue
            for dtype in dtypes:
                label = dtype or "-"
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
                    yield Row(name, label, "FAIL", None, _root_cause(exc))
                    continue
                status, detail = _summarise(name, results, backend)
                seconds = max(res["seconds"] for res in results)
                yield Row(name, label, status, seconds, detail)
    finally:
        if pool is not None:
            pool.close()
