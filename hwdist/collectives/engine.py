"""The collective engine: the one module of ``hwdist.collectives`` that calls torch.distributed collectives.

Every tensor collective is a thin public function (argument checks, then one
[`GroupView.run`][hwdist.collectives.engine.GroupView.run]) and every internal exchange (``protocol``) issues
through [`issue`][hwdist.collectives.engine.issue]. One call goes through the same steps whatever the op:
resolve ([`view`][hwdist.collectives.engine.view], then the driver), plan, the strategy's ``to_wire``, issue,
the strategy's ``finish``, and with ``async_op=True`` a
[`CollectiveHandle`][hwdist.collectives.tensor.CollectiveHandle] (docs/architecture.md). Without
torch.distributed the view is the serial null object [`SERIAL`][hwdist.collectives.engine.SERIAL].
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as torch_dist

from .. import _compat, registry
from ..drivers.base import Driver, Plan
from .call_entry import CollectiveHandle
from .wire import TORCH_OPS, comm_device, fixed_comm_device

__all__ = ["Call", "Strategy", "GroupView", "SERIAL", "view", "issue", "wire_call"]

Tensor = torch.Tensor

_is_initialized: Callable[[], bool] = torch_dist.is_initialized if _compat.DIST_AVAILABLE else (lambda: False)


# ---------------------------------------------------------------------------
# one call, and the strategies that fill it
# ---------------------------------------------------------------------------
class Call:
    """Everything one collective call needs, from its arguments to its wire buffers.

    Set by the engine: ``view``, ``group``, ``driver``, ``plan``, ``cdev`` (None: ``data`` is on the comm
    device), ``data``, ``root``, ``rop``, ``extra`` (the op's other arguments). Set by the strategy's
    ``to_wire``: ``native`` (the torch op to issue, None for nothing), ``send``, ``recv``, ``splits``,
    ``torch_op`` (reductions), ``tag`` (point to point), ``aliased`` (the wire buffer is ``data``) and
    ``state`` (its own). ``work`` is torch's ``Work`` of an async issue.
    """

    view: "GroupView"
    group: Any = None
    driver: Driver
    plan: Plan
    cdev: Optional[torch.device] = None
    data: Tensor
    root: Optional[int] = None
    rop: Optional[str] = None
    extra: Any = None
    native: Optional[str] = None
    send: Any = None
    recv: Any = None
    splits: Any = None
    torch_op: Any = None
    tag: int = 0
    aliased: bool = False
    state: Any = None
    work: Any = None


class Strategy:
    """How one op travels: its plan, its wire buffers, its finish; one instance per op (stateless).

    Attributes:
        op: the op name the driver plans.
        direct: the op may be issued on the caller's tensor as it is when the plan is a pass-through.
    """

    op: str = ""
    direct: bool = False
    #: the op has several strategies and ``pick`` chooses one from the call's data (the engine asks first)
    picks: bool = False

    def pick(self, data: Any, extra: Any) -> "Strategy":
        """The strategy for this call's ``data`` and ``extra`` (only asked when ``picks`` is set)."""
        return self

    def plan(self, driver: Driver, data: Any, rop: Optional[str]) -> Plan:
        """The plan of this call (the driver's, cached there); ``data`` is the call's tensor."""
        return driver.plan(self.op, data.dtype, rop)

    def choose(self, c: Call) -> "Strategy":
        """The strategy that runs this call (an op with several transports picks one here)."""
        return self

    def to_wire(self, c: Call) -> None:
        """Fill ``c``'s wire fields: ``native`` and the buffers."""
        raise NotImplementedError

    def finish(self, c: Call) -> Any:
        """After the communication: post-processing, copy back; returns the collective's result."""
        return None

    def serial(self, data: Optional[Tensor], extra: Any) -> Any:
        """The result without torch.distributed (mmengine's single-process semantics)."""
        return None


# ---------------------------------------------------------------------------
# the group views: serial null object and a distributed group
# ---------------------------------------------------------------------------
def _done(async_op: bool, result: Any) -> Any:
    return CollectiveHandle(result=result) if async_op else result


def _weak(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: kept, as before
        return lambda: obj


class GroupView:
    """A process group as the collectives see it (distributed).

    The default group's view is kept between calls (see [`view`][hwdist.collectives.engine.view]): it holds
    its world size and the group's driver (and comm device) per device, so a call on the default group asks
    the registry nothing. Another group's view is made per call and holds neither.
    """

    __slots__ = ("group", "world", "generation", "ws", "rk", "drivers")

    def __init__(self, group: Any, world: Any = None) -> None:
        self.group = group
        # the default group's torch object (the cache's key), held weakly: a view kept after the group is
        # destroyed must not keep torch's group alive until exit (gloo aborts destroying it then)
        self.world: Callable[[], Any] = (lambda: None) if world is None else _weak(world)
        #: the world size, cached in the default group's view (a group's size never changes)
        self.ws: Optional[int] = None
        #: this process's rank, cached in the default group's view (it never changes for one group)
        self.rk: Optional[int] = None
        #: device -> ``target``'s answer, the default group's view only
        self.drivers: Optional[dict[Optional[torch.device], tuple[Driver, Optional[torch.device]]]] = None
        self.generation = 0
        if world is not None:
            self.ws, self.generation = int(torch_dist.get_world_size()), registry.generation
            self.rk = int(torch_dist.get_rank())
            self.drivers = {}

    @property
    def size(self) -> int:
        """The group's number of ranks."""
        ws = self.ws
        return int(torch_dist.get_world_size(self.group)) if ws is None else ws

    @property
    def rank(self) -> int:
        """This process's global rank."""
        rk = self.rk
        return int(torch_dist.get_rank()) if rk is None else rk

    def target(self, data: Any) -> tuple[Driver, Optional[torch.device]]:
        """The group's driver for ``data`` (None: no data) and the comm device to move it to (None: stay).

        ``registry.resolve`` and ``comm_device``'s answers; the default group's view keeps them per device
        where they cannot change (a comm device without an index: not the current GPU).
        """
        device = None if data is None else data.device
        drivers = self.drivers
        if drivers is not None:
            hit = drivers.get(device)
            if hit is not None:
                return hit
        driver = registry.resolve(self.group, device)
        cdev = None if data is None else comm_device(driver, data)
        if drivers is not None and (data is None or fixed_comm_device(driver)):
            drivers[device] = (driver, cdev)
        return driver, cdev

    def ranks(self) -> Optional[list[int]]:
        """Global ranks of a non-default group, or None for the default group."""
        group = self.group
        if group is None or group is _compat.default_group():
            return None
        return list(torch_dist.get_process_group_ranks(group))

    def index(self, global_rank: int) -> int:
        """Position of a global rank inside the group (the index into gathered lists)."""
        ranks = self.ranks()
        return global_rank if ranks is None else ranks.index(global_rank)

    def check_rank(self, value: Any, argname: str, fn: str) -> int:
        """``value`` as a plain int global rank of the group (numpy integers accepted)."""
        ws = self.ws
        if value.__class__ is int and ws is not None and 0 <= value < ws:
            return value  # the common case (an int rank of the default group), checked first
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{fn}: {argname} must be an int rank, got {type(value).__name__}: {value!r}")
        value = int(value)
        ranks = self.ranks()
        if ranks is None:
            ws = self.size
            if not 0 <= value < ws:
                raise ValueError(
                    f"{fn}: {argname} must be a rank in 0..{ws - 1} (world size {ws}), got {value}"
                )
        elif value not in ranks:
            raise ValueError(f"{fn}: {argname} must be a global rank of the group {ranks}, got {value}")
        return value

    def check_peer(self, value: Any, argname: str, fn: str) -> Optional[int]:
        """A point-to-point partner: None (any rank) or another rank of the group."""
        if value is None:
            return None
        value = self.check_rank(value, argname, fn)
        if value == self.rank:
            raise ValueError(f"{fn}: {argname} must be another rank, got this rank ({value})")
        return value

    def _direct(
        self, op: str, data: Tensor, plan: Plan, root: Optional[int], use_async: bool, async_op: bool
    ) -> Any:
        """A pure pass-through, issued with torch's function on the caller's tensor (no ``Call``, no copy)."""
        result: Any = None
        if op == "all_reduce":
            work = torch_dist.all_reduce(data, TORCH_OPS[plan.reduce_op], self.group, use_async)  # type: ignore[index]
        elif op == "broadcast":
            work = torch_dist.broadcast(data, root, self.group, use_async)
        else:  # all_gather with same_shape=True
            ws = self.size
            if ws == 1:  # nothing to communicate
                return CollectiveHandle(result=[data]) if async_op else [data]
            result = [torch.empty_like(data) for _ in range(ws)]
            work = torch_dist.all_gather(result, data, self.group, use_async)
        if not async_op:
            return result
        return CollectiveHandle(work, result=result) if use_async else CollectiveHandle(result=result)

    def run(
        self,
        strategy: Strategy,
        data: Any,
        async_op: bool = False,
        rop: Optional[str] = None,
        root: Optional[int] = None,
        extra: Any = None,
    ) -> Any:
        """Pick, resolve, plan, to wire format, issue, finish; a handle when ``async_op``."""
        if strategy.picks:
            strategy = strategy.pick(data, extra)
        group = self.group
        driver, cdev = self.target(data)
        if data is None:  # barrier
            plan = strategy.plan(driver, data, rop)
        elif strategy.direct:  # the driver's plan as it is (its cache) and the pass-through check
            plan = driver.plan(strategy.op, data.dtype, rop)
            if cdev is None and plan.passthrough and data.is_contiguous():
                return self._direct(plan.op, data, plan, root, async_op and driver.supports_async, async_op)
        else:
            plan = strategy.plan(driver, data, rop)
        use_async = async_op and driver.supports_async
        c = Call()
        c.view, c.group, c.driver, c.plan, c.cdev, c.data = self, group, driver, plan, cdev, data
        c.root, c.rop, c.extra = root, rop, extra
        strategy = strategy.choose(c)
        strategy.to_wire(c)
        if c.native is None:  # nothing to communicate (e.g. a one-rank gather)
            return _done(async_op, strategy.finish(c))
        if use_async:
            c.work = issue(c, True)
            return CollectiveHandle(c.work, strategy.finish, c)
        issue(c, False)
        return _done(async_op, strategy.finish(c))


class _Serial:
    """The serial null object: torch.distributed is not initialised; every collective is local."""

    __slots__ = ()
    group = None
    size = 1
    rank = 0

    def ranks(self) -> Optional[list[int]]:
        return None

    def index(self, global_rank: int) -> int:
        return 0

    def check_rank(self, value: Any, argname: str, fn: str) -> Any:
        return value  # any root is this process (mmengine: no check without a group)

    def check_peer(self, value: Any, argname: str, fn: str) -> Any:
        return value

    def run(
        self, strategy: Strategy, data: Any, async_op: bool = False, *_: Any, extra: Any = None, **__: Any
    ) -> Any:
        """``GroupView.run`` without a group: the strategy's result (a finished handle when ``async_op``);
        ``rop`` and ``root`` do not matter here, ``extra`` is always a keyword."""
        return _done(async_op, strategy.serial(data, extra))


#: The view of every group while torch.distributed is not initialised.
SERIAL = _Serial()

_default_view: Optional[GroupView] = None  # the default group's view, while its group and registry last


def _forget_default_view() -> None:
    global _default_view
    _default_view = None


registry.on_forget(_forget_default_view)
_world: Callable[[], Any] = _compat.default_group if _compat.DIST_AVAILABLE else (lambda: None)


def view(group: Any) -> Any:
    """The view of ``group`` (None: the default group); [`SERIAL`][hwdist.collectives.engine.SERIAL]
    when torch.distributed is not initialised. The default group's view is made once per default group
    object and ``registry.generation``, so what it caches never outlives the group or a registry change."""
    if group is not None:
        return GroupView(group) if _is_initialized() else SERIAL
    global _default_view
    world = _world()
    if world is None:
        return SERIAL
    v = _default_view
    if v is not None and v.world() is world and v.generation == registry.generation:
        return v
    v = _default_view = GroupView(None, world)
    return v


# ---------------------------------------------------------------------------
# issue: every torch.distributed collective hwdist makes
# ---------------------------------------------------------------------------
def _all_gather_flat(c: Call, a: bool) -> Any:
    if "all_gather" in c.driver.caps.flat_ops:
        return _compat.all_gather_into_tensor(c.recv, c.send, c.group, a)  # type: ignore[misc]
    # no flat form on this backend and torch (gloo on torch 2.1)
    return _compat.all_gather_into_tensor_by_list(c.recv, c.send, c.group, a)


def _send(c: Call, a: bool) -> Any:
    if a:
        return torch_dist.isend(c.send, c.root, c.group, c.tag)
    torch_dist.send(c.send, c.root, c.group, c.tag)
    return None


def _recv(c: Call, a: bool) -> Any:
    if a:
        return torch_dist.irecv(c.send, c.root, c.group, c.tag)
    c.state = torch_dist.recv(c.send, c.root, c.group, c.tag)  # the sender's rank
    return None


#: ``call.native`` -> how it is issued (``a``: async); torch's ``Work`` when async, else None.
_ISSUE: dict[str, Callable[[Call, bool], Any]] = {
    "all_reduce": lambda c, a: torch_dist.all_reduce(c.send, c.torch_op, c.group, a),
    "reduce": lambda c, a: torch_dist.reduce(c.send, c.root, c.torch_op, c.group, a),
    "broadcast": lambda c, a: torch_dist.broadcast(c.send, c.root, c.group, a),
    "all_gather": lambda c, a: torch_dist.all_gather(c.recv, c.send, c.group, a),
    "all_gather_flat": _all_gather_flat,
    "gather": lambda c, a: torch_dist.gather(c.send, c.recv, c.root, c.group, a),
    "scatter": lambda c, a: torch_dist.scatter(c.recv, c.send, c.root, c.group, a),
    "reduce_scatter": lambda c, a: torch_dist.reduce_scatter(c.recv, c.send, c.torch_op, c.group, a),
    "all_to_all": lambda c, a: torch_dist.all_to_all(c.recv, c.send, c.group, a),
    "all_to_all_single": lambda c, a: torch_dist.all_to_all_single(
        c.recv, c.send, c.splits[0], c.splits[1], c.group, a
    ),
    "barrier": lambda c, a: torch_dist.barrier(c.group, a),
    "send": _send,
    "recv": _recv,
}


def issue(c: Call, async_op: bool = False) -> Any:
    """Issue ``c.native`` on ``c``'s buffers; torch's ``Work`` when ``async_op``, else None."""
    return _ISSUE[c.native](c, async_op)  # type: ignore[index]


def wire_call(
    group: Any,
    native: str,
    send: Any = None,
    recv: Any = None,
    root: Optional[int] = None,
    driver: Optional[Driver] = None,
    reduce_op: Optional[str] = None,
) -> Call:
    """A ``Call`` for hwdist's own traffic (``protocol``), for [`issue`][hwdist.collectives.engine.issue];
    ``reduce_op`` is an issued op name ('sum', 'max', ...) for the reductions."""
    c = Call()
    c.group, c.native, c.send, c.recv, c.root = group, native, send, recv, root
    if driver is not None:
        c.driver = driver
    if reduce_op is not None:
        c.torch_op = TORCH_OPS[reduce_op]
    return c
