"""Check bodies of the process-group queries, the dict and parameter reductions, the object
collectives and the results functions.

As for the tensor bodies, each rank's input is built from its rank number and the
expected value from every rank's number. The object collectives have no op to
ask the driver about: a ``hwdist.PlanError`` from the call is the table's refusal
(e.g. a backend that moves no integer dtype).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import hwdist

from ._context import Context
from ._data import combine, contribution

__all__ = [
    "check_dist_info",
    "check_sync_random_seed",
    "check_all_reduce_dict",
    "check_all_reduce_params",
    "check_all_gather_object",
    "check_gather_object",
    "check_broadcast_object_list",
    "check_broadcast_object",
    "check_scatter_object_list",
    "check_collect_results",
    "check_collect_results_cpu",
    "check_collect_results_gpu",
]


def check_dist_info(ctx: Context) -> None:
    """Rank, world size, local rank and size, backend, the default group's driver, barrier.

    What needs every rank's answer (rank numbers 0..n-1, the driver's name) is
    judged in the parent from ``ctx.values``.
    """
    ctx.values["rank"] = hwdist.get_rank()
    ctx.values["world_size"] = hwdist.get_world_size()
    ctx.expect("get_dist_info", hwdist.get_dist_info(), (ctx.values["rank"], ctx.values["world_size"]))
    ctx.expect("is_distributed", hwdist.is_distributed(), True)
    ctx.expect("is_main_process", hwdist.is_main_process(), ctx.values["rank"] == 0)
    ctx.values["local_rank"] = hwdist.get_local_rank()
    ctx.values["local_size"] = hwdist.get_local_size()
    ctx.values["backend"] = hwdist.get_backend()
    ctx.values["driver"] = hwdist.resolve().name
    ctx.expect("get_comm_device type", isinstance(hwdist.get_comm_device(), torch.device), True)
    hwdist.barrier()
    ctx.covered.extend(["rank", "world_size", "local_rank", "backend", "barrier"])


def check_sync_random_seed(ctx: Context) -> None:
    """An int (the parent checks that every rank got the same one)."""
    seed = hwdist.sync_random_seed()
    ctx.values["seed"] = seed
    ctx.expect("returns an int", isinstance(seed, int), True)
    ctx.covered.append("same on every rank")


def check_all_reduce_dict(ctx: Context) -> None:
    """Unsorted keys, scalars and shapes, sum/mean (max on integers); mixed float32 + int64 lossless."""
    dt = ctx.dtype
    for rop in ("sum", "mean") if dt.is_floating_point else ("sum", "max"):
        # Keys deliberately not sorted: every rank must pair the same keys.
        shapes = {"zeta": (2,), "alpha": (3, 1), "mid": ()}
        data = {
            k: ctx.tensor(contribution(ctx.rank + i, rop, dt, s)) for i, (k, s) in enumerate(shapes.items())
        }
        want = {
            k: combine([contribution(q + i, rop, dt, s) for q in range(ctx.world)], rop, dt)
            for i, (k, s) in enumerate(shapes.items())
        }
        _dict_case(ctx, rop, data, want, rop)
    if dt == torch.float32:
        # Mixed dtypes: no key may lose precision to another key's dtype.
        mixed = {
            "f32": ctx.tensor(torch.tensor([1.0 + 2**-20 + ctx.rank]), torch.float32),
            "i64": ctx.tensor(torch.tensor([2**40 + ctx.rank]), torch.int64),
        }
        want_mixed = {
            "f32": torch.tensor([sum(1.0 + 2**-20 + q for q in range(ctx.world))], dtype=torch.float32),
            "i64": torch.tensor([sum(2**40 + q for q in range(ctx.world))], dtype=torch.int64),
        }
        _dict_case(ctx, "mixed float32+int64", mixed, want_mixed, "sum", dtype=torch.int64)


Tensors = dict[str, torch.Tensor]


def _dict_case(ctx: Context, label: str, data: Tensors, want: Tensors, rop: str, **kw: Any) -> None:
    ctx.case(
        label,
        lambda: hwdist.all_reduce_dict(data, op=rop),
        lambda _out: ctx.expect(label, dict(data), want),
        op="all_reduce",
        reduce_op=rop,
        **kw,
    )


def check_all_reduce_params(ctx: Context) -> None:
    """A generator of parameters (as from ``model.parameters()``): coalesced, one by one, small buckets."""
    variants: list[tuple[str, dict[str, Any]]] = [
        ("coalesced sum", {"coalesce": True, "op": "sum"}),
        ("one by one sum", {"coalesce": False, "op": "sum"}),
        ("small buckets mean", {"coalesce": True, "bucket_size_mb": 1e-5, "op": "mean"}),
    ]
    for label, kwargs in variants:
        _params_case(ctx, label, kwargs)


def _params_case(ctx: Context, label: str, kwargs: dict[str, Any]) -> None:
    shapes = [(4, 3), (3,), (2, 2, 2)]
    rop, dt = kwargs["op"], ctx.dtype
    params = [
        torch.nn.Parameter(ctx.tensor(contribution(ctx.rank + i, rop, dt, s)), requires_grad=False)
        for i, s in enumerate(shapes)
    ]
    want = [
        combine([contribution(q + i, rop, dt, s) for q in range(ctx.world)], rop, dt)
        for i, s in enumerate(shapes)
    ]
    ctx.case(
        label,
        lambda: hwdist.all_reduce_params((p for p in params), **kwargs),
        lambda _out: ctx.expect(label, [p.data for p in params], want),
        op="all_reduce",
        reduce_op=rop,
    )


# ---- object collectives --------------------------------------------------------------------------


def _obj(rank: int) -> dict[str, Any]:
    """A picklable object whose size and content depend on the rank."""
    return {
        "rank": rank,
        "name": f"rank-{rank}",
        "tensor": torch.arange(3) + rank,
        "nested": [rank, (rank, None), {"f": rank / 2}],
        "blob": bytes([rank % 256]) * (100 * rank),
    }


def check_all_gather_object(ctx: Context) -> None:
    """Nested objects with tensors, of different sizes per rank; 1 MiB each."""
    want = [_obj(q) for q in range(ctx.world)]
    ctx.case(
        "mixed objects",
        lambda: hwdist.all_gather_object(_obj(ctx.rank)),
        lambda out: ctx.expect("mixed objects", list(out), want),
    )
    big = bytes([ctx.rank % 256]) * (1 << 20)
    want_big = [bytes([q % 256]) * (1 << 20) for q in range(ctx.world)]
    ctx.case(
        "1 MiB each",
        lambda: hwdist.all_gather_object(big),
        lambda out: ctx.expect("1 MiB each", list(out), want_big),
    )


def check_gather_object(ctx: Context) -> None:
    """To the last rank; the others get None."""
    dst = ctx.world - 1
    want = [_obj(q) for q in range(ctx.world)] if ctx.rank == dst else None

    def verify(out: Any) -> None:
        ctx.expect(f"dst={dst}", list(out) if out is not None else None, want)

    ctx.case(f"dst={dst}", lambda: hwdist.gather_object(_obj(ctx.rank), dst=dst), verify)


def check_broadcast_object_list(ctx: Context) -> None:
    """The last rank's list, filled in place on every rank."""
    src = ctx.world - 1
    objs: list[Any] = [_obj(ctx.rank), "x" * ctx.rank, None]
    want = [_obj(src), "x" * src, None]
    ctx.case(
        f"src={src}",
        lambda: hwdist.broadcast_object_list(objs, src=src),
        lambda _out: ctx.expect(f"src={src}", objs, want),
    )


def check_broadcast_object(ctx: Context) -> None:
    """The last rank's object, returned on every rank."""
    src = ctx.world - 1
    ctx.case(
        f"src={src}",
        lambda: hwdist.broadcast_object(_obj(ctx.rank), src=src),
        lambda out: ctx.expect(f"src={src}", out, _obj(src)),
    )


def check_scatter_object_list(ctx: Context) -> None:
    """Object q of the last rank's list lands on rank q."""
    src = ctx.world - 1
    inputs = [_obj(q) for q in range(ctx.world)] if ctx.rank == src else None
    out: list[Any] = [None]
    ctx.case(
        f"src={src}",
        lambda: hwdist.scatter_object_list(out, inputs, src=src),
        lambda _out: ctx.expect(f"src={src}", out[0], _obj(ctx.rank)),
    )


# ---- results -------------------------------------------------------------------------------------


def _result_item(i: int) -> Any:
    return None if i == 1 else {"index": i, "value": torch.tensor([float(i)])}


def _collect(ctx: Context, fn: Callable[..., Any]) -> None:
    """Interleaved order restored, padding dropped, genuine None results kept (on rank 0)."""
    n = ctx.world
    size = 2 * n + 1  # not a multiple of n: the last rank's part is padded
    per_rank = -(-size // n)
    # DistributedSampler order: rank r holds items r, r+n, r+2n, ... (padded past size).
    part = [_result_item(ctx.rank + j * n) for j in range(per_rank)]
    want = [_result_item(i) for i in range(size)] if ctx.rank == 0 else None
    label = "ordered, padding dropped, None kept"
    ctx.case(label, lambda: fn(part, size), lambda out: ctx.expect(label, out, want))


def check_collect_results(ctx: Context) -> None:
    """``collect_results`` (mmengine's, device 'cpu')."""
    _collect(ctx, hwdist.collect_results)


def check_collect_results_cpu(ctx: Context) -> None:
    """``collect_results_cpu`` (through a shared temporary directory)."""
    _collect(ctx, hwdist.collect_results_cpu)


def check_collect_results_gpu(ctx: Context) -> None:
    """``collect_results_gpu`` (through the backend's device)."""
    _collect(ctx, hwdist.collect_results_gpu)
