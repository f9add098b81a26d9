"""The ``hwdist`` torch backend: a Python ``Backend`` that wraps a driver's backend and applies its plans.

torch (>= 2.15) calls these methods from ``ProcessGroup`` for every collective on a device type the
group maps to ``hwdist``. Each method asks the driver's plan for (op, dtype, reduce op) (once per group and
device: the answer is kept in the target's route table, hwdist/backend/_target.py): a pass-through
calls the wrapped backend with the caller's own arguments and returns its Work; anything else goes
through hwdist/backend/_ops.py; no plan raises [`PlanError`][hwdist.errors.PlanError] before any data
moves (the plan depends only on the call, so every rank raises it). Every call enters hwdist's flight
recorder (when it is on and the call is not inside a hwdist collective, which records itself), so the
hang watchdog covers it.

Methods torch 2.15 calls (measured with a counting backend: DDP, FSDP2, DTensor and the
torch.distributed functions): ``broadcast``, ``allreduce``, ``allreduce_coalesced``, ``reduce``,
``allgather``, ``all_gather_single``, ``allgather_coalesced``, ``all_gather_single_coalesced``,
``gather``, ``scatter``, ``reduce_scatter``, ``reduce_scatter_single``,
``reduce_scatter_single_coalesced``, ``all_to_all_single``, ``alltoall``, ``send``, ``recv``,
``recv_anysource``, ``barrier``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional

import torch
import torch.distributed as torch_dist

from .. import _compat, _state, registry
from ..collectives import call_entry
from ..flight import recorder as _flight
from ..errors import BackendError
from . import _inflight, _ops, _work
from ._table import NAME, registered_wraps
from ._target import Target, op_key as _op_key

__all__ = ["HwdistBackend", "Target", "create"]

_Backend, _Work = _compat.python_backend_types()
Tensor = torch.Tensor
_SKIP_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)
_in_call = call_entry.in_call
_in_flight = call_entry.IN_FLIGHT  # non-empty while any thread is inside a hwdist collective
_recorder = call_entry.recorder
_getframe = sys._getframe
_now = time.time
_get_ident = threading.get_ident
_ISSUED = _flight.ISSUED
_add = _inflight.add


class HwdistBackend(_Backend):  # type: ignore[misc, valid-type]
    """torch's view of hwdist: one per group, wrapping one backend per device type (see the module)."""

    def __init__(self, opts: Any, targets: dict[str, Target]) -> None:
        super().__init__(opts.group_rank, opts.group_size)
        self._targets = targets
        self._only: Optional[Target] = next(iter(targets.values())) if len(targets) == 1 else None
        self._options = _Backend.Options(NAME, timeout=opts.timeout)
        try:
            self._options.global_ranks_in_group = list(opts.global_ranks_in_group)
            self._options.group_name = opts.group_id
        except Exception:  # informational only
            pass
        pg = getattr(opts, "process_group", None)
        try:
            self._pg: Callable[[], Any] = weakref.ref(pg) if pg is not None else (lambda: None)
        except TypeError:
            self._pg = lambda: None
        self._group: Any = self  # the recorder's key of the group, found on the first call
        #: what flight records show as the group's backend: ``hwdist:gloo`` (``hwdist:cpu:gloo,cuda:nccl``)
        self.label = f"{NAME}:" + (
            self._only.driver.name
            if self._only is not None
            else ",".join(f"{d}:{tg.driver.name}" for d, tg in targets.items())
        )
        #: (recorder, state generation, the group's state) the hot path records with; None: look again
        self._flight: Optional[tuple[Any, int, Any]] = None

    # ---- what torch asks a backend ---------------------------------------------------------------
    @property
    def options(self) -> Any:
        """The backend's options (a Python backend must give them: torch reads them from C++)."""
        return self._options

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """``'hwdist'``."""
        return NAME

    def wrapped(self, device_type: Optional[str] = None) -> Any:
        """The wrapped backend of ``device_type`` (None: the only one)."""
        return (self._only or self._targets[str(device_type)]).inner

    def shutdown(self) -> None:
        """Shut the wrapped backends down."""
        for tg in self._targets.values():
            fn = getattr(tg.inner, "shutdown", None)
            if fn is not None:
                try:
                    fn()
                except Exception:
                    pass

    def abort(self) -> None:
        """Abort the wrapped backends (what torch's abort and hwdist's watchdog call)."""
        for tg in self._targets.values():
            fn = getattr(tg.inner, "abort", None)
            if fn is not None:
                try:
                    fn()
                except Exception:
                    pass

    # ---- plumbing --------------------------------------------------------------------------------
    def _target(self, t: Optional[Tensor]) -> Target:
        if self._only is not None:
            return self._only
        device = t.device.type if t is not None else "cpu"
        tg = self._targets.get(device) or self._targets.get("cpu")
        if tg is None:
            raise BackendError(
                f"tensor: the {NAME!r} backend of this group wraps device types"
                f" {sorted(self._targets)}, got a tensor on {device!r}. HINT: hwdist.backend.register("
                f"wraps=[...]) with a backend for {device!r} before creating the group"
            )
        return tg

    def _key(self) -> Any:
        group = self._group
        if group is self:
            pg = self._pg()
            world = _compat.default_group()
            if world is None:
                return None
            group = self._group = None if pg is None or pg is world else pg
        return group

    def _enter_first(self, rec: Any, op: str, arg: Any) -> Any:
        """``_run``'s slow path to a new entry: through the recorder's own ``begin`` (which makes the group's
        info and starts the watchdog on a first call), then the group state cached for the next calls."""
        group = self._key()
        st = _state.of(group)
        if st.flight is not None and st.flight.backend != self.label:
            st.flight.backend = self.label  # a record shows the wrapped backend (made by a hwdist call first)
        hooks = st.torch_hooks
        if hooks is not None and hooks.on:  # torch's hooks record this group's calls already
            self._flight = None
            return None
        entry = rec.begin(op, group, (arg,), {})
        if entry is None:
            return None
        entry[_flight.GROUP].backend = self.label
        self._flight = (rec, _state.generation, st)
        try:
            f: Any = _getframe(2)  # _enter_first <- _run <- the method torch called
        except ValueError:  # called from a thread without Python frames (an autograd device thread)
            f = None
        while f is not None and f.f_code.co_filename.startswith(_SKIP_DIRS):
            f = f.f_back
        if f is not None:  # the call site: the first frame outside torch and hwdist
            entry[_flight.CODE], entry[_flight.LINE] = f.f_code, f.f_lasti
        return entry

    def _run(self, op: str, arg: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (the call's plan and issue: a kept pass-through first, else the planned call),
        recorded in the flight recorder when it is on and the call is not inside a hwdist collective
        (which records itself).

        The hot path, inline: the cached group state, one frame walk to the user's call site, one list
        appended (the recorder's entry layout, hwdist/flight/recorder.py; the text is made when the ring
        is read), and the Work handed to hwdist/backend/_inflight.py, which ends the entry.
        """
        rec: Any = _recorder()
        if rec is None or (_in_flight and _in_call()):
            return fn(*args)
        fc = self._flight
        st: Any = None if fc is None or fc[0] is not rec or fc[1] != _state.generation else fc[2]
        info = None if st is None else st.flight
        hooks = None if st is None else st.torch_hooks
        if info is None or (hooks is not None and hooks.on):
            entry = self._enter_first(rec, op, arg)
            if entry is None:
                return fn(*args)
        else:
            try:
                f: Any = _getframe(2)  # _run <- the method torch called <- torch's Python caller
                while f is not None and f.f_code.co_filename.startswith(_SKIP_DIRS):
                    f = f.f_back
            except ValueError:
                f = None
            seq = info.seq = info.seq + 1
            entry = [
                seq, op, info, arg, None if f is None else f.f_code, 0 if f is None else f.f_lasti,
                _now(), 0.0, _ISSUED, None, _get_ident(),
            ]  # fmt: skip
            rec.ring.append(entry)
        try:
            work = fn(*args)
        except BaseException as exc:
            rec.end(entry, exc)
            raise
        _add(rec, entry, work)  # ended by a later call or the thread (_inflight.py)
        return work

    # ---- reductions ------------------------------------------------------------------------------
    def allreduce(self, tensors: list[Tensor], opts: Any) -> Any:
        """all_reduce (DDP's gradient buckets)."""
        return self._run("all_reduce", tensors[0], self._allreduce, tensors, opts)

    def _allreduce(self, tensors: list[Tensor], opts: Any) -> Any:
        t = tensors[0]
        tg = self._only or self._target(t)
        key = ("allreduce", t.dtype, t.device, _op_key(opts.reduceOp))
        if key in tg.passes:
            return tg.inner.allreduce(tensors, opts)
        plan, rop, factor, passes = tg.reduction(key, "all_reduce", t, opts)
        if passes:
            return tg.inner.allreduce(tensors, opts)
        return _ops.all_reduce(tg, tensors, opts, plan, rop, factor)

    def allreduce_coalesced(self, tensors: list[Tensor], opts: Any) -> Any:
        """all_reduce of several tensors (torch's coalescing manager): one call when every plan passes."""
        return self._run(
            "all_reduce_coalesced", tensors[0] if tensors else None, self._allreduce_coalesced, tensors, opts
        )

    def _allreduce_coalesced(self, tensors: list[Tensor], opts: Any) -> Any:
        tg = self._target(tensors[0])
        routes = [
            tg.reduction(("allreduce", t.dtype, t.device, _op_key(opts.reduceOp)), "all_reduce", t, opts)
            for t in tensors
        ]
        if all(r[3] for r in routes):
            return tg.inner.allreduce_coalesced(tensors, opts)
        works = [_ops.all_reduce(tg, [t], opts, p, rop, f) for (p, rop, f, _), t in zip(routes, tensors)]
        return _ops.coalesced(works, tensors)

    def reduce(self, tensors: list[Tensor], opts: Any) -> Any:
        """reduce to ``opts.rootRank``."""
        return self._run("reduce", tensors[0], self._reduce, tensors, opts)

    def _reduce(self, tensors: list[Tensor], opts: Any) -> Any:
        t = tensors[0]
        tg = self._only or self._target(t)
        key = ("reduce", t.dtype, t.device, _op_key(opts.reduceOp))
        if key in tg.passes:
            return tg.inner.reduce(tensors, opts)
        plan, rop, factor, passes = tg.reduction(key, "reduce", t, opts)
        if passes:
            return tg.inner.reduce(tensors, opts)
        return _ops.reduce(tg, tensors, opts, plan, rop, factor)

    def reduce_scatter(self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any) -> Any:
        """reduce_scatter, list form."""
        return self._run("reduce_scatter", outputs[0], self._reduce_scatter, outputs, inputs, opts)

    def _reduce_scatter(self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any) -> Any:
        out = outputs[0]
        tg = self._only or self._target(out)
        key = ("reduce_scatter", out.dtype, out.device, _op_key(opts.reduceOp))
        if key in tg.passes:
            return _reported(tg, tg.inner.reduce_scatter(outputs, inputs, opts), outputs)
        plan, rop, factor, passes = tg.reduction(key, "reduce_scatter", out, opts)
        if passes:
            return _reported(tg, tg.inner.reduce_scatter(outputs, inputs, opts), outputs)
        rows = torch.stack([p.reshape(out.shape) for p in inputs[0]])
        return _ops.reduce_scatter(tg, out, rows, opts, plan, rop, factor)

    def reduce_scatter_single(self, output: Tensor, input: Tensor, opts: Any) -> Any:
        """reduce_scatter into one tensor (FSDP2's gradients)."""
        return self._run("reduce_scatter_tensor", input, self._reduce_scatter_single, output, input, opts)

    def _reduce_scatter_single(self, output: Tensor, input: Tensor, opts: Any) -> Any:
        tg = self._only or self._target(output)
        key = ("reduce_scatter_single", output.dtype, output.device, _op_key(opts.reduceOp))
        if key in tg.passes:
            return _reported(tg, tg.inner.reduce_scatter_single(output, input, opts), [output])
        plan, rop, factor, passes = tg.reduction(key, "reduce_scatter", output, opts, flat="reduce_scatter")
        rows = input.reshape(tg.size, *output.shape)
        if passes and tg.flat("reduce_scatter"):
            return _reported(tg, tg.inner.reduce_scatter_single(output, input, opts), [output])
        if passes:  # the list form over the input's rows (views: no copy)
            return _reported(tg, tg.inner.reduce_scatter([output], [list(rows.unbind(0))], opts), [output])
        return _ops.reduce_scatter(tg, output, rows, opts, plan, rop, factor)

    def reduce_scatter_single_coalesced(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any) -> Any:
        """reduce_scatter of several tensors, one call per pair."""
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _ops.coalesced(works, outputs)

    # ---- moves -------------------------------------------------------------------------------------
    def broadcast(self, tensors: list[Tensor], opts: Any) -> Any:
        """broadcast from ``opts.rootRank`` (DDP's start-up, FSDP's and DTensor's replication)."""
        return self._run("broadcast", tensors[0], self._broadcast, tensors, opts)

    def _broadcast(self, tensors: list[Tensor], opts: Any) -> Any:
        t = tensors[0]
        tg = self._only or self._target(t)
        key = ("broadcast", t.dtype, t.device)
        if key in tg.passes:
            return tg.inner.broadcast(tensors, opts)
        plan = tg.moves(key, "broadcast", t)
        if plan.passthrough and tg.cdev(t) is None:
            return tg.inner.broadcast(tensors, opts)
        return _ops.broadcast(tg, tensors, opts, plan)

    def allgather(self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any = None) -> Any:
        """all_gather, list form."""
        return self._run("all_gather", inputs[0], self._allgather, outputs, inputs, opts)

    def _allgather(self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any) -> Any:
        t = inputs[0]
        tg = self._only or self._target(t)
        key = ("allgather", t.dtype, t.device)
        if key in tg.passes:
            return tg.inner.allgather(outputs, inputs, opts)
        plan = tg.moves(key, "all_gather", t)
        if plan.passthrough and tg.cdev(t) is None:
            return tg.inner.allgather(outputs, inputs, opts)
        return _ops.all_gather(tg, outputs, inputs, opts, plan)

    def all_gather_single(self, output: Tensor, input: Tensor, opts: Any = None) -> Any:
        """all_gather into one tensor (FSDP2's parameters, DTensor's Shard -> Replicate)."""
        return self._run("all_gather_into_tensor", input, self._all_gather_single, output, input, opts)

    def _all_gather_single(self, output: Tensor, input: Tensor, opts: Any) -> Any:
        tg = self._only or self._target(input)
        key = ("all_gather_single", input.dtype, input.device)
        if key in tg.passes:
            return tg.inner.all_gather_single(output, input, opts)
        plan = tg.moves(key, "all_gather", input, flat="all_gather")
        if plan.passthrough and tg.cdev(input) is None and tg.flat("all_gather"):
            return tg.inner.all_gather_single(output, input, opts)
        return _ops.all_gather_single(tg, output, input, opts, plan)

    def all_gather_single_coalesced(
        self, outputs: list[Tensor], inputs: list[Tensor], opts: Any = None
    ) -> Any:
        """all_gather into one tensor each for several tensors, one call per pair."""
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _ops.coalesced(works, outputs)

    def allgather_coalesced(self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any = None) -> Any:
        """all_gather of several tensors, list form, one call per tensor."""
        works = [self.allgather([outs], [t], opts) for outs, t in zip(outputs, inputs)]
        return _ops.coalesced(works, outputs)

    def gather(self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any) -> Any:
        """gather to ``opts.rootRank``."""
        return self._run("gather", inputs[0], self._gather, outputs, inputs, opts)

    def _gather(self, outputs: list[list[Tensor]], inputs: list[Tensor], opts: Any) -> Any:
        t = inputs[0]
        tg = self._only or self._target(t)
        key = ("gather", t.dtype, t.device)
        if key in tg.passes:
            return tg.inner.gather(outputs, inputs, opts)
        plan = tg.moves(key, "gather", t)
        if plan.passthrough and tg.cdev(t) is None:
            return tg.inner.gather(outputs, inputs, opts)
        return _ops.gather(tg, outputs, inputs, opts, plan)

    def scatter(self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any) -> Any:
        """scatter from ``opts.rootRank``."""
        return self._run("scatter", outputs[0], self._scatter, outputs, inputs, opts)

    def _scatter(self, outputs: list[Tensor], inputs: list[list[Tensor]], opts: Any) -> Any:
        t = outputs[0]
        tg = self._only or self._target(t)
        key = ("scatter", t.dtype, t.device)
        if key in tg.passes:
            return tg.inner.scatter(outputs, inputs, opts)
        plan = tg.moves(key, "scatter", t)
        if plan.passthrough and tg.cdev(t) is None:
            return tg.inner.scatter(outputs, inputs, opts)
        return _ops.scatter(tg, outputs, inputs, opts, plan)

    def all_to_all_single(
        self, output: Tensor, input: Tensor, out_splits: list[int], in_splits: list[int], opts: Any
    ) -> Any:
        """all_to_all of one tensor each way (DTensor's Shard(i) -> Shard(j) on accelerators)."""
        args = (output, input, out_splits, in_splits, opts)
        return self._run("all_to_all_single", input, self._all_to_all_single, *args)

    def _all_to_all_single(
        self, output: Tensor, input: Tensor, out_splits: list[int], in_splits: list[int], opts: Any
    ) -> Any:
        tg = self._only or self._target(input)
        key = ("all_to_all_single", input.dtype, input.device)
        if key in tg.passes:
            return tg.inner.all_to_all_single(output, input, out_splits, in_splits, opts)
        plan = tg.moves(key, "all_to_all", input, flat="all_to_all")
        if plan.passthrough and tg.cdev(input) is None and tg.flat("all_to_all"):
            return tg.inner.all_to_all_single(output, input, out_splits, in_splits, opts)
        return _ops.all_to_all_single(tg, output, input, list(out_splits), list(in_splits), opts, plan)

    def alltoall(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any) -> Any:
        """all_to_all of lists of tensors."""
        return self._run("all_to_all", inputs[0], self._alltoall, outputs, inputs, opts)

    def _alltoall(self, outputs: list[Tensor], inputs: list[Tensor], opts: Any) -> Any:
        tg = self._only or self._target(inputs[0])
        plan = tg.plan("all_to_all", inputs[0].dtype)
        if plan.passthrough and tg.cdev(inputs[0]) is None and plan.native_op == "all_to_all":
            return tg.inner.alltoall(outputs, inputs, opts)
        return _ops.all_to_all(tg, outputs, inputs, opts, plan)

    def barrier(self, opts: Any) -> Any:
        """barrier."""
        return self._run("barrier", None, self._barrier, opts)

    def _barrier(self, opts: Any) -> Any:
        return self._target(None).inner.barrier(opts)

    # ---- point to point ----------------------------------------------------------------------------
    def _p2p(self, kind: str, tensors: list[Tensor], peer: int, tag: int) -> Any:
        t = tensors[0]
        tg = self._only or self._target(t)
        key = (kind, t.dtype, t.device)
        if key not in tg.passes:
            plan = tg.moves(key, kind, t)
            if not (plan.passthrough and tg.cdev(t) is None):
                return _ops.point_to_point(tg, kind, tensors, peer, tag, plan)
        if kind == "send":
            return tg.inner.send(tensors, peer, tag)
        return tg.inner.recv(tensors, peer, tag)

    def send(self, tensors: list[Tensor], dst: int, tag: int = 0) -> Any:
        """send to ``dst``."""
        return self._run("send", tensors[0], self._p2p, "send", tensors, dst, tag)

    def recv(self, tensors: list[Tensor], src: int, tag: int = 0) -> Any:
        """recv from ``src``."""
        return self._run("recv", tensors[0], self._p2p, "recv", tensors, src, tag)

    def recv_anysource(self, tensors: list[Tensor], tag: int = 0) -> Any:
        """recv from any rank: refused before anything is received. torch hands a Python backend's Work
        back in a holder without ``_source_rank()``, so the sender could not be reported."""
        raise BackendError(
            f"recv from any source (src=None) on a group of the {NAME!r} backend: torch does not pass"
            " the sender back from a backend written in Python, so the call could not say who sent the"
            " data. Nothing was received. HINT: pass src=<the sender's rank>"
        )


def _reported(tg: Target, work: Any, result: Any) -> Any:
    """A pass-through reduce_scatter's ``work``, or, where the wrapped backend's reduce_scatter Works
    never report completion (``Driver.silent_works``: gloo's), a Work that does once waited.

    Otherwise hwdist's flight recorder would keep every such call in flight, and its Work with the
    buffers the backend keeps in it, for as long as the process runs (measured on gloo: a 1 MiB
    ``reduce_scatter_tensor`` took 1.3-1.4x its time while the calls piled up).
    """
    return _work.then([work], None, result) if "reduce_scatter" in tg.silent else work


def _inner_backend(driver: Any, opts: Any, backend_options: Any, store: Any) -> Any:
    """Create the wrapped backend of ``driver`` with torch's own creator for its name."""
    plugin = _compat.torch_backend_plugin(driver.torch_name)
    if plugin is None:
        raise BackendError(
            f"backend {driver.name!r} (wrapped by {NAME!r}): torch has no creator for {driver.torch_name!r}."
            f" HINT: hwdist.backend.register(wraps={driver.name!r}) registers it before the group is made"
        )
    creator, extended = plugin
    if not extended:
        return creator(store, opts.group_rank, opts.group_size, opts.timeout)
    saved = opts.store, getattr(opts, "split_from", None)
    opts.store = store
    if saved[1] is not None:
        opts.split_from = None  # the wrapped backend is made afresh, never split from the wrapper
    try:
        return creator(opts, backend_options)
    finally:
        opts.store = saved[0]
        if saved[1] is not None:
            opts.split_from = saved[1]


def create(opts: Any, backend_options: Any = None) -> Any:
    """The creator torch calls for a group on ``hwdist`` (``register_backend(extended_api=True)``)."""
    wraps = registered_wraps()
    targets: dict[str, Target] = {}
    for device, name in wraps.items():
        driver = registry.get_driver(name)
        store = opts.store if len(wraps) == 1 else torch_dist.PrefixStore(f"{NAME}/{device}/", opts.store)
        try:
            inner = _inner_backend(driver, opts, backend_options, store)
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(
                f"backend {NAME!r} could not create the {driver.name!r} backend it wraps on rank"
                f" {opts.group_rank}: {type(exc).__name__}: {exc}. HINT: check that"
                f" init_process_group({driver.torch_name!r}) works here alone"
                f" (`hwdist check --backend {driver.name}`)"
            ) from exc
        if inner is None:  # this rank is not a member of the group
            return None
        targets[device] = Target(driver, inner, opts.group_size, opts.group_rank)
    return HwdistBackend(opts, targets)
