"""Every collective on a group into the flight recorder, through torch's per-group hooks (torch >= 2.14).

torch 2.14 gave ``ProcessGroup`` ``register_pre_hook`` / ``register_post_hook``:
the pre hook sees each collective issued on the group (the op, ``async_op``,
the input and output tensors, the root, an op id) on the thread that issued it,
the post hook the returned ``Work``. hwdist attaches one pair to each group it
knows of (the default group, every group torch has made when the recorder
starts, and every group hwdist resolves later), so the collectives DDP, FSDP
and plain ``torch.distributed`` calls issue enter the same ring as hwdist's own
calls: the op, the first tensor's dtype and shape, the group's sequence number,
the first Python frame outside torch and hwdist (the call site: the
``loss.backward()`` line for DDP's gradient all-reduce) and, once the work's
future completes, the end time.

hwdist's own calls are recorded once, as the hwdist call: while one runs on this
thread the hooks record nothing. A hook that fails never reaches the user's
collective: it is logged once and the hooks of that group turn themselves off.

On older torch nothing is attached and only hwdist's own calls are recorded.
Off by default: ``hwdist.flight.enable(torch_calls=True)`` or ``HWDIST_FLIGHT_TORCH=1``
switches the hook path on; its cost is in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import weakref
from typing import Any, Optional

import torch

from .. import _compat, _state
from ..collectives import call_entry
from . import recorder as _rec

__all__ = ["attach", "attach_all", "detach_all", "available", "attached_groups"]

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HWDIST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_getframe = sys._getframe
_now = time.time
_get_ident = threading.get_ident
_in_call = call_entry.in_call
_ids = itertools.count(0x68770000)
_lock = threading.Lock()
#: Every attached pair, to detach them when the recorder is switched off.
_attached: list["GroupHooks"] = []
_known = [0]  # how many groups torch had at the last attach_all

# torch's HookOpName -> the torch.distributed function a user would name
_OPS = {
    "ALLREDUCE": "all_reduce",
    "ALLGATHER": "all_gather",
    "ALLGATHER_BASE": "all_gather_into_tensor",
    "REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
    "ALLTOALL_BASE": "all_to_all_single",
    "ALLTOALL": "all_to_all",
    "ALLREDUCE_COALESCED": "all_reduce_coalesced",
    "ALLGATHER_COALESCED": "all_gather_coalesced",
    "ALLGATHER_INTO_TENSOR_COALESCED": "all_gather_into_tensor_coalesced",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter_tensor_coalesced",
}


def available() -> bool:
    """Whether this torch has per-group collective hooks (torch >= 2.14)."""
    return _compat.PG_HAS_HOOKS


def _op_name(name: Any) -> str:
    text = str(getattr(name, "name", name)).rpartition(".")[2]
    return _OPS.get(text, text.lower())


def _summary(tensors: Any) -> Any:
    if not tensors:
        return ""
    first = tensors[0]
    if len(tensors) == 1:
        return (first.dtype, first.shape)
    return ("list", len(tensors), first.dtype, first.shape)


def _site() -> tuple[Any, int]:
    f: Any = _getframe(2)
    while f is not None and f.f_code.co_filename.startswith((_TORCH_DIR, _HWDIST_DIR)):
        f = f.f_back
    return (f.f_code, f.f_lasti) if f is not None else (None, 0)


class GroupHooks:
    """The pre/post hooks of one group; they record into the recorder's ring and never raise."""

    def __init__(self, recorder: _rec.Recorder, group: Any, info: _rec.GroupInfo) -> None:
        self.recorder = recorder
        self.info = info
        self.on = True
        self.id = next(_ids)
        self.pending: dict[int, list[Any]] = {}
        try:
            self.group: Any = weakref.ref(group)
        except TypeError:
            self.group = lambda g=group: g

    def pre(self, args: Any) -> None:
        """Record the start of a collective issued on the group (torch's pre hook)."""
        if not self.on or _in_call():  # inside a hwdist call on this thread: recorded once, as that call
            return
        try:
            code, lasti = _site()
            info = self.info
            info.seq += 1
            entry = [
                info.seq, _op_name(args.name), info, _summary(args.input_tensors), code, lasti,
                _now(), 0.0, _rec.ISSUED, None, _get_ident(),
            ]  # fmt: skip
            self.recorder._append(entry)
            self.pending[args.op_id] = entry
            if self.recorder.on_first_call is not None:
                self.recorder._first_call()
            if _compat.torch_group_count() != _known[0]:  # torch made a group since: record it too
                attach_all(self.recorder)
        except Exception as exc:
            self.fail(exc)

    def post(self, args: Any) -> None:
        """Complete the entry when the collective's work completes (torch's post hook)."""
        if not self.on:
            return
        try:
            entry = self.pending.pop(args.op_id, None)
            if entry is None:
                return
            work = args.work
            if work is None:
                self._done(entry, None)
                return
            try:
                fut = work.get_future()
            except Exception:  # a work without a future (some coalesced ops): its end is not seen
                self._done(entry, None)
                return
            fut.add_done_callback(lambda f: self._done(entry, f))
        except Exception as exc:
            self.fail(exc)

    def _done(self, entry: list[Any], fut: Any) -> None:
        try:
            entry[_rec.END] = _now()
            error = None
            if fut is not None:
                try:
                    fut.value()  # done: raises what stopped the call (torch's Future has no exception())
                except Exception as exc:
                    error = exc
            if error is not None:
                entry[_rec.STATE], entry[_rec.ERROR] = _rec.FAILED, error
            else:
                entry[_rec.STATE] = _rec.COMPLETED
        except Exception as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Turn this group's hooks off and say so once; the user's collective goes on."""
        self.on = False
        self.pending.clear()
        _rec.warn(
            f"torch-hook:{self.info.label}",
            f"recording {self.info.label}'s collectives through torch's hooks failed ({exc!r}); the"
            " recorder stopped recording that group's torch.distributed calls (hwdist's own calls are"
            " still recorded)",
        )

    def detach(self) -> None:
        """Unregister both hooks (the group may be gone already)."""
        self.on = False
        group = self.group()
        if group is None:
            return
        for name in ("unregister_pre_hook", "unregister_post_hook"):
            try:
                getattr(group, name)(self.id)
            except Exception:
                pass


def attach(recorder: _rec.Recorder, group: Any = None) -> Optional[GroupHooks]:
    """Attach the recorder to ``group`` (None: the default group) through torch's hooks; idempotent.

    Returns the group's hooks, or None where torch has no hooks, no process group exists or the group
    cannot take hooks (a ``ProcessGroup`` subclass of another library, say).
    """
    if not _compat.PG_HAS_HOOKS:
        return None
    world = _compat.default_group()
    if group is world:
        group = None
    target = world if group is None else group
    if target is None or not isinstance(target, _compat.GROUP_TYPES):
        return None
    pg: Any = target
    st = _state.of(group)
    with _lock:
        hooks: Optional[GroupHooks] = st.torch_hooks
        if hooks is not None and hooks.recorder is recorder:
            return hooks
        info = _rec.group_info(group)
        if info is None:
            return None
        hooks = GroupHooks(recorder, target, info)
        try:
            pg.register_pre_hook(hooks.id, hooks.pre)
            pg.register_post_hook(hooks.id, hooks.post)
        except Exception:
            hooks.detach()
            return None
        st.torch_hooks = hooks
        _attached.append(hooks)
        return hooks


def attach_all(recorder: _rec.Recorder) -> int:
    """Attach the recorder to the default group and every group torch has made; returns how many."""
    if not _compat.PG_HAS_HOOKS:
        return 0
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        return 0
    n = 0
    groups = _compat.torch_groups()
    _known[0] = _compat.torch_group_count()
    for group in [None, *groups]:
        if attach(recorder, group) is not None:
            n += 1
    return n


def detach_all() -> None:
    """Unregister every hook pair this process attached."""
    with _lock:
        hooks, _attached[:] = list(_attached), []
    for h in hooks:
        h.detach()
        try:
            group = h.group()
            st = _state.of(None if group is _compat.default_group() else group)
            if st.torch_hooks is h:
                st.torch_hooks = None
        except Exception:
            pass


def attached_groups() -> list[str]:
    """Labels of the groups whose torch.distributed calls are recorded now."""
    return [h.info.label for h in list(_attached) if h.on and h.group() is not None]
