"""One device type of a group through the wrapper: the driver, the wrapped backend, and its call routes.

A [`Target`][hwdist.backend._target.Target] answers, per call, what the driver's plan says for
(op, dtype, reduce op, device): the first call of a combination asks the driver's planner; later ones
are one look-up in the target's route table (``passes`` for a pass-through, ``routes`` for a planned
reduction), so a pass-through costs a set look-up on top of the wrapped backend's own call.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as torch_dist

from ..collectives import wire
from ..drivers.base import Plan
from ..errors import PlanError
from ._ops import GATHER_REDUCE
from ._table import NAME

__all__ = ["Target", "op_key", "reduce_op"]

Tensor = torch.Tensor
_RedOp: Any = torch_dist.ReduceOp.RedOpType
_REDUCE_NAMES = {
    _RedOp.SUM: "sum",
    _RedOp.AVG: "mean",
    _RedOp.PRODUCT: "product",
    _RedOp.MIN: "min",
    _RedOp.MAX: "max",
    _RedOp.BAND: "band",
    _RedOp.BOR: "bor",
    _RedOp.BXOR: "bxor",
}
_PREMUL = _RedOp.PREMUL_SUM


def _same_op(op: Any) -> Any:
    return op


def _kind_hashes() -> bool:
    """Whether every kind of ``ReduceOp`` hashes to a number of its own."""
    try:
        return len({hash(torch_dist.ReduceOp(k)) for k in _REDUCE_NAMES}) == len(_REDUCE_NAMES)
    except Exception:  # a ReduceOp that cannot be made from its kind, or does not hash
        return False


#: A route key's reduce op part: ``hash`` of torch's ``ReduceOp`` where that is its kind's own number
#: (checked here, once, over every kind), else the ``ReduceOp`` itself. A ``ReduceOp`` in a key costs
#: its pybind ``__eq__`` on every look-up (measured: 1.9 us a look-up against 0.7 us with the number);
#: the number is enough because a key stands for one kind (a PREMUL_SUM's factor is never cached).
op_key: Any = hash if _kind_hashes() else _same_op


def reduce_op(op: Any) -> tuple[str, Any]:
    """The hwdist name of torch's reduce op and PREMUL_SUM's factor (None for the others)."""
    kind = getattr(op, "op", op)
    if kind == _PREMUL:
        return "sum", op.factor
    try:
        return _REDUCE_NAMES[kind], None
    except KeyError:
        raise PlanError(f"op must be a torch.distributed.ReduceOp hwdist knows, got {op!r}") from None


class Target:
    """The driver and the wrapped backend serving one device type of a group, and its route table.

    ``passes`` holds the keys ``(method, dtype, device[, reduce op])`` whose call goes to the wrapped
    backend as it is (a pass-through plan, the tensor on the comm device, the one-tensor form where the
    method needs it); ``routes`` maps a reduction's other keys to ``(plan, reduce op name, passes)``.
    torch's ``ReduceOp`` hashes and compares by its kind alone, so a PREMUL_SUM (whose factor differs
    per call) is never cached: its key is left out of both. Keys are kept only once the driver's comm
    device is known to be fixed (no device index: ``set_device`` cannot move it); otherwise every call
    asks again.
    """

    __slots__ = ("driver", "inner", "size", "rank", "caps", "passes", "routes", "silent")

    def __init__(self, driver: Any, inner: Any, size: int, rank: int) -> None:
        self.driver, self.inner, self.size, self.rank = driver, inner, size, rank
        self.caps = driver.caps
        self.passes: set[tuple[Any, ...]] = set()
        self.routes: dict[tuple[Any, ...], tuple[Any, str, bool]] = {}
        #: ops whose wrapped Works never report completion (``Driver.silent_works``)
        self.silent: frozenset[str] = driver.silent_works

    def plan(self, op: str, dtype: torch.dtype, rop: Optional[str] = None) -> Plan:
        """The driver's plan; its PlanError names the wrapper and what to do."""
        try:
            return self.driver.plan(op, dtype, rop)  # type: ignore[no-any-return]
        except PlanError as exc:
            raise PlanError(
                f"{exc} (a call through the {NAME!r} backend, wrapping {self.driver.name!r}). HINT: use a"
                f" dtype or reduce op the backend plans (`hwdist env` lists its table), or cast before the"
                f" call"
            ) from None

    def reduce_plan(self, op: str, dtype: torch.dtype, rop: str) -> Any:
        """A reduction's plan, or ``GATHER_REDUCE`` for a MIN/MAX with no plan but an all_gather one."""
        try:
            return self.plan(op, dtype, rop)
        except PlanError:
            if rop not in ("min", "max"):
                raise
            self.plan("all_gather", dtype)  # raises when even that has no plan
            return GATHER_REDUCE

    def cdev(self, t: Tensor) -> Optional[torch.device]:
        """None when ``t`` is on the driver's comm device, else that device (host staging)."""
        return wire.comm_device(self.driver, t)

    def flat(self, op: str) -> bool:
        """Whether the wrapped backend has ``op``'s one-tensor form."""
        return op in self.caps.flat_ops

    def cacheable(self) -> bool:
        """Whether a route may be kept: the comm device is fixed (asked after a ``cdev`` call)."""
        return wire.fixed_comm_device(self.driver)

    # ---- the slow path of each kind of call: ask the plan, keep the answer --------------------------
    def moves(self, key: tuple[Any, ...], op: str, t: Tensor, flat: Optional[str] = None) -> Plan:
        """The plan of a move (broadcast, all_gather, ...) on ``t``; ``key`` joins ``passes`` when it is a
        pass-through here (and the wrapped backend has the one-tensor form ``flat`` names)."""
        plan = self.plan(op, t.dtype)
        if plan.passthrough and self.cdev(t) is None and (flat is None or self.flat(flat)):
            if self.cacheable():
                self.passes.add(key)
        return plan

    def reduction(
        self, key: tuple[Any, ...], op: str, t: Tensor, opts: Any, flat: Optional[str] = None
    ) -> tuple[Any, str, Any, bool]:
        """A reduction's ``(plan, reduce op name, PREMUL_SUM factor, passes)``; the route is kept for the
        next call of ``key`` unless the op is a PREMUL_SUM. ``key`` joins ``passes`` only where the
        wrapped backend also has the one-tensor form ``flat`` names."""
        hit = self.routes.get(key)
        if hit is not None:
            return hit[0], hit[1], None, hit[2]
        rop, factor = reduce_op(opts.reduceOp)
        plan = self.reduce_plan(op, t.dtype, rop)
        passes = factor is None and plan is not GATHER_REDUCE and plan.passthrough and self.cdev(t) is None
        if factor is None and self.cacheable():
            if passes and (flat is None or self.flat(flat)):
                self.passes.add(key)
            else:
                self.routes[key] = (plan, rop, passes)
        return plan, rop, factor, passes
