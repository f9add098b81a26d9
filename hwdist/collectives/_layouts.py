"""How ``all_reduce_dict`` checks the ranks' layouts without an extra collective.

A *layout* is what decides the bytes on the wire: the reduce op, the sorted
keys, each value's shape and dtype, and the driver. The first call with a
layout is checked with one small reduction before the data moves (a wrong
length would crash or hang the data collective itself). Once every rank has
agreed on a layout, every rank holds the same history of agreed layouts, so
every rank makes the same *prediction* of the next call's layout:

* the layout that followed the previous one last time, else the previous one
  (a loop that reduces one metrics dict per step, or alternates between a
  loss dict and a metrics dict, is predicted every time).

The next call then runs one collective with the predicted buffers plus one
*flag* element: 1 where this rank's dict matches the prediction, 0 where not,
encoded so the reduced flag says whether *every* rank matched (SUM == world
size, MIN == 1, MAX == 0, ...). All ranks send buffers of the predicted
length, so the collective is safe even when a rank's dict changed; a rank
whose dict does not match sends zeros. If the reduced flag says some rank
did not match, every rank sees it, drops the result and takes the checked
path (small check, then data), which raises the same error on every rank
when the dicts really differ.

Cost: one collective per call in the steady state (the flag rides in the data
buffer), three on the call where the layout changes to one not predicted.
The history is per process group and changes only after a call that every
rank completed, so it stays the same on every rank.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Optional, Sequence

import torch

from ..drivers.base import Plan, Post
from .flat import FlatLayout

Tensor = torch.Tensor
#: (op, sorted keys, shapes, dtypes): everything of a call that decides the wire format.
Signature = tuple[str, tuple[Any, ...], tuple[torch.Size, ...], tuple[torch.dtype, ...]]


def signature(op: str, keys: Sequence[Any], values: Sequence[Any]) -> Optional[Signature]:
    """The call's signature, or None when a value is not a tensor."""
    try:
        return (op, tuple(keys), tuple([v.shape for v in values]), tuple([v.dtype for v in values]))
    except AttributeError:
        return None


class Part:
    """One flat buffer of a layout: which values, packed in which dtype, reduced how."""

    __slots__ = ("idx", "plan", "layout", "pack_dtype", "extra")

    def __init__(self, idx: tuple[int, ...], plan: Plan, layout: FlatLayout, extra: int) -> None:
        self.idx = idx
        self.plan = plan
        self.layout = layout
        #: the buffer's dtype before any view (the values' dtype for view plans, else the comm dtype)
        self.pack_dtype = plan.dtype if plan.view else plan.comm_dtype
        #: trailing elements (of pack_dtype) that hold the flag: 0 or enough for one wire element
        self.extra = extra


class FlagCode:
    """The flag element's values under the reduce op actually issued, and the test of the result."""

    __slots__ = ("match", "mismatch", "ok")

    def __init__(self, match: int, mismatch: int, ok: Callable[[Any], bool]) -> None:
        self.match = match
        self.mismatch = mismatch
        self.ok = ok


def flag_code(reduce_op: str, wire_dtype: torch.dtype, ws: int) -> Optional[FlagCode]:
    """How a 0/1 "this rank matches" flag reduces to "every rank matches", or None (no exact code)."""
    if reduce_op in ("max", "bor"):
        return FlagCode(0, 1, lambda v: v == 0)
    if reduce_op in ("min", "product", "band"):
        return FlagCode(1, 0, lambda v: v == 1)
    if wire_dtype.is_floating_point:
        exact = 2.0 / torch.finfo(wire_dtype).eps  # every integer up to here is exact
        if reduce_op == "sum" and ws <= exact:
            return FlagCode(1, 0, lambda v: v == ws)
        if reduce_op == "avg" and 8 * torch.finfo(wire_dtype).eps < 0.5 / ws:
            # all ones average to 1 (up to rounding); one zero gives at most 1 - 1/ws
            return FlagCode(1, 0, lambda v: v > 1.0 - 0.5 / ws)
        return None
    if reduce_op == "sum" and wire_dtype != torch.bool and not wire_dtype.is_complex and ws <= torch.iinfo(wire_dtype).max:
        return FlagCode(1, 0, lambda v: v == ws)
    return None  # bxor, or a sum that could overflow the flag


class DictLayout:
    """Everything ``all_reduce_dict`` needs to move one signature's values (built once, reused)."""

    __slots__ = (
        "sig", "_hash", "driver", "device_type", "parts", "stack", "flag", "_flag_tensors", "__weakref__",
        "keys", "dtypes", "dtype", "shape", "scalar", "reduce_name", "divide", "cpu", "row_value", "cpu_row",
    )

    def __init__(self, sig: Signature, driver: Any, device_type: str, plans: dict[torch.dtype, Plan], ws: int) -> None:
        self.sig = sig
        self._hash = hash(sig)
        self.driver = driver
        #: the device type of the first value when the layout was built (it chose the driver)
        self.device_type = device_type
        _, keys, shapes, dtypes = sig
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, dt in enumerate(dtypes):
            p = plans[dt]
            gk = (str(p.comm_dtype), p.reduce_op or "", p.post.value, str(p.dtype) if p.view else "")
            groups.setdefault(gk if len(plans) > 1 else ("",), []).append(i)
        parts = []
        for n, gk in enumerate(sorted(groups)):
            idx = tuple(groups[gk])
            plan = plans[dtypes[idx[0]]]
            offsets, numels, pos = [], [], 0
            for i in idx:
                offsets.append(pos)
                numels.append(math.prod(shapes[i]))
                pos += numels[-1]
            flat = FlatLayout(tuple(shapes[i] for i in idx), tuple(dtypes[i] for i in idx), tuple(offsets), tuple(numels))
            extra = 0
            if n == 0:  # the flag rides at the end of the first buffer
                wire_size = torch.empty((), dtype=plan.comm_dtype).element_size()
                pack_size = torch.empty((), dtype=plan.dtype if plan.view else plan.comm_dtype).element_size()
                extra = max(1, -(-wire_size // pack_size))
            parts.append(Part(idx, plan, flat, extra))
        first = parts[0].plan if parts else None
        # the cheap case: one buffer in the values' own dtype, every value of one non-empty shape;
        # the flag is then one more value-shaped row (so the buffer length is the same either way)
        self.stack = bool(
            len(parts) == 1
            and len(set(dtypes)) == 1
            and len(set(shapes)) == 1
            and not parts[0].plan.cast
            and parts[0].layout.numels[0] > 0
        )
        if self.stack:
            parts[0].extra = parts[0].layout.numels[0]
        self.parts = parts
        self.flag = None if first is None else flag_code(first.reduce_op or "sum", first.comm_dtype, ws)
        self._flag_tensors: dict[tuple[torch.device, int], Tensor] = {}
        # what the stacked fast path compares and issues (see params._stacked_call)
        self.keys = list(keys)
        self.dtypes = set(dtypes)
        self.dtype = dtypes[0] if dtypes else None
        self.shape = shapes[0] if shapes else None
        self.reduce_name = (first.reduce_op or "sum") if first is not None else "sum"
        self.divide = first is not None and first.post is Post.DIVIDE
        self.scalar = self.shape is not None and len(self.shape) == 0
        #: the driver communicates on the CPU (then no device check is needed for CPU values)
        self.cpu = driver.comm_device().type == "cpu"
        #: the stacked layout's flag row when this rank matches (the one value a matching rank sends)
        self.row_value = self.flag.match if self.flag is not None else 0
        self.cpu_row = self.flag_tensor(torch.device("cpu"), self.row_value) if self.stack else None

    # equal when the signatures are (histories compare layouts by what they describe, not by object)
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, DictLayout) and self.sig == other.sig)

    def flag_tensor(self, device: torch.device, value: int) -> Tensor:
        """A value-shaped tensor filled with ``value`` (the stacked layout's last row)."""
        key = (device, value)
        t = self._flag_tensors.get(key)
        if t is None:
            shape = self.sig[2][0]
            t = self._flag_tensors[key] = torch.full(shape, value, dtype=self.sig[3][0], device=device)
        return t


class History:
    """One process group's agreed layouts: the last one, and what followed each (same on every rank)."""

    __slots__ = ("ws", "last", "predicted", "follows", "unchecked")

    LIMIT = 64

    def __init__(self, ws: int) -> None:
        self.ws = ws
        self.last: Optional[DictLayout] = None
        #: the layout every rank expects next, or None before the first agreed call
        self.predicted: Optional[DictLayout] = None
        self.follows: dict[DictLayout, DictLayout] = {}
        #: this rank's last ``verify=False`` layout (local only: it never decides what is sent)
        self.unchecked: Optional[DictLayout] = None

    def agreed(self, layout: DictLayout) -> None:
        """Record a layout every rank used (called on every rank after the same successful call)."""
        last = self.last
        if layout is last and layout is self.predicted:
            return  # the steady state: nothing would change (a missing "follows itself" entry predicts the same)
        if last is not None and self.follows.get(last) is not layout:
            if len(self.follows) >= self.LIMIT and last not in self.follows:
                self.follows.clear()  # the same on every rank: the histories are equal
            self.follows[last] = layout
        self.last = layout
        self.predicted = self.follows.get(layout, layout)


_histories: dict[int, tuple[Callable[[], Any], History]] = {}


def history(group: Any) -> History:
    """The layout history of ``group`` (a process group object, not None).

    Kept by ``id(group)`` with a weak reference (a strong one for group objects
    that allow none) to tell a new group at a reused address from the old one.
    """
    hit = _histories.get(id(group))
    if hit is not None and hit[0]() is group:
        return hit[1]
    for key in [k for k, (ref, _) in _histories.items() if ref() is None]:
        del _histories[key]  # groups that are gone
    try:
        ref: Callable[[], Any] = weakref.ref(group)
    except TypeError:
        ref = lambda: group  # noqa: E731
    found = History(torch.distributed.get_world_size(group))
    _histories[id(group)] = (ref, found)
    return found


_layouts: dict[tuple[Signature, int, str, int], DictLayout] = {}


def cached(sig: Signature, driver: Any, device_type: str, ws: int) -> Optional[DictLayout]:
    """A layout built earlier on this rank for ``sig`` on ``driver``, if any (a local cache)."""
    found = _layouts.get((sig, id(driver), device_type, ws))
    return found if found is not None and found.driver is driver else None


def build(sig: Signature, driver: Any, device_type: str, plans: dict[torch.dtype, Plan], ws: int) -> DictLayout:
    """Build (and cache on this rank) the layout of ``sig``; ``plans`` holds one plan per dtype."""
    if len(_layouts) >= 256:
        _layouts.clear()
    found = _layouts[(sig, id(driver), device_type, ws)] = DictLayout(sig, driver, device_type, plans, ws)
    return found
