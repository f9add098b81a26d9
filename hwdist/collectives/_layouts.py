"""How ``all_reduce_dict`` agrees on a dict's layout (through ``_sizes``) and how it moves the values.

A *layout* ([`DictLayout`][hwdist.collectives._layouts.DictLayout]) is what decides
the bytes on the wire: the reduce op, the sorted keys, each value's shape and
dtype, and the driver. It packs the values into one flat buffer per
communication dtype, with one match flag ([`_sizes.match_flag`][hwdist.collectives._sizes.match_flag])
at the end of the first buffer, reduces them and writes the results back.

[`LayoutAgreement`][hwdist.collectives._layouts.LayoutAgreement] is one process
group's use of the size-agreement mechanism ([`_sizes`][hwdist.collectives._sizes]),
with one entry point, ``reduce``. Its history is the group's
``_sizes.history(group, "all_reduce_dict")``: a layout is a
[`Header`][hwdist.collectives._sizes.Header] (its wire bytes, its fingerprint as
``layout``), and every call records a [`Verdict`][hwdist.collectives._sizes.Verdict]
every rank reached alike, so every rank predicts the same next layout
(``SizeHistory.expected_layout``: the one that followed the last one last time,
else the last one):

* the predicted call moves the data in the predicted layout with the flag "my
  dict is the predicted one"; a rank whose dict differs sends zeros of the
  predicted length, so the collective is always well formed; the reduced flag
  is the verdict (held, or redo) on every rank;
* otherwise (no prediction, no exact flag for the op, or the flag said redo)
  one small [`agree`][hwdist.collectives.consensus.agree] exchange of the
  fingerprint checks the layouts first (the explicit exchange), every rank
  raising together when they differ, then the data moves.

Cost: one collective per call in the steady state, check + data on a new
layout, three on a change after a predicted layout. Only agreed calls are
recorded (a miss is not), so ``_sizes``' backoff never applies here: the
check's agreed layout is always the next prediction.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Optional, Sequence

import torch

from .. import registry
from ..drivers.base import Plan, Post
from ..errors import PlanError
from . import _sizes, transport
from ._wire import divide
from .flat import FlatLayout

_STRIDED = torch.strided

Tensor = torch.Tensor
#: (op, sorted keys, shapes, dtypes): everything of a call that decides the wire format.
Signature = tuple[str, tuple[Any, ...], tuple[torch.Size, ...], tuple[torch.dtype, ...]]
#: Raises on every rank together when the ranks' dicts differ or some rank's arguments are bad
#: (``params.check_same_dicts``).
Check = Callable[..., None]


def signature(op: str, keys: Sequence[Any], values: Sequence[Any]) -> Optional[Signature]:
    """The call's signature, or None when a value is not a tensor."""
    try:
        return (op, tuple(keys), tuple([v.shape for v in values]), tuple([v.dtype for v in values]))
    except AttributeError:
        return None


def describe(
    keys: Sequence[Any], shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]
) -> list[tuple[str, tuple[int, ...], str]]:
    """(repr of key, shape, dtype name) of each value: what the ranks compare and what errors show."""
    return [(repr(k), tuple(s), str(d).replace("torch.", "")) for k, s, d in zip(keys, shapes, dtypes)]


def fingerprint(op: Optional[str], desc: list[tuple[str, tuple[int, ...], str]]) -> tuple[int, int]:
    """Two 31-bit words of a hash of ``desc`` (and ``op``): what the ranks compare."""
    digest = hashlib.blake2b(
        repr(desc if op is None else [("op", (), op), *desc]).encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest[:4], "little") >> 1, int.from_bytes(digest[4:], "little") >> 1


class Part:
    """One flat buffer of a layout: which values, packed in which dtype, reduced how."""

    __slots__ = ("idx", "plan", "layout", "pack_dtype", "extra")

    def __init__(self, idx: tuple[int, ...], plan: Plan, layout: FlatLayout, extra: int) -> None:
        self.idx = idx
        self.plan = plan
        self.layout = layout
        #: the buffer's dtype before any view (the values' dtype for view plans, else the comm dtype)
        self.pack_dtype = plan.dtype if plan.view else plan.comm_dtype
        #: trailing elements (of pack_dtype) that hold the flag: enough for one wire element
        self.extra = extra


#: One call's buffers: ``[(flat, wire)]`` per part, and whether the values were stacked.
Buffers = tuple[list[tuple[Tensor, Tensor]], bool]


class DictLayout:
    """Everything ``all_reduce_dict`` needs to move one signature's values (built once per group, reused)."""

    __slots__ = (
        "sig", "driver", "device_type", "ws", "parts", "stack", "flag", "words", "_rows", "cdev", "cpu",
        "keys", "dtypes", "shapes", "held", "explicit", "fp", "_reducers", "stacked", "scalar", "divide",
    )  # fmt: skip

    def __init__(
        self, sig: Signature, driver: Any, device_type: str, plans: dict[torch.dtype, Plan], ws: int
    ) -> None:
        self.sig = sig
        self.driver = driver
        #: the device type of the first value when the layout was built (it chose the driver)
        self.device_type = device_type
        self.ws = ws
        self.cdev = driver.comm_device()
        #: the driver communicates on the CPU (then CPU values need no device comparison)
        self.cpu = self.cdev.type == "cpu"
        op, keys, shapes, dtypes = sig
        # what try_pack compares (lists: a list compares to a list faster than a tuple is built)
        self.keys, self.dtypes, self.shapes = list(keys), list(dtypes), list(shapes)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, dt in enumerate(dtypes):
            p = plans[dt]
            view = str(p.dtype) if p.view else ""
            # a mean floor-divides integers summed in float64 and true-divides floats: two parts
            floor = "floor" if p.post is Post.DIVIDE and not (dt.is_floating_point or dt.is_complex) else ""
            gk: tuple[str, ...] = (str(p.comm_dtype), p.reduce_op or "", p.post.value, view, floor)
            groups.setdefault(gk if len(plans) > 1 else ("",), []).append(i)
        parts = []
        for n, key in enumerate(sorted(groups)):
            idx = tuple(groups[key])
            plan = plans[dtypes[idx[0]]]
            numels = tuple(math.prod(shapes[i]) for i in idx)
            offsets = tuple(sum(numels[:j]) for j in range(len(idx)))
            flat = FlatLayout(tuple(shapes[i] for i in idx), tuple(dtypes[i] for i in idx), offsets, numels)
            extra = 0
            if n == 0:  # the flag rides at the end of the first buffer
                wire_size = torch.empty((), dtype=plan.comm_dtype).element_size()
                pack_size = torch.empty((), dtype=plan.dtype if plan.view else plan.comm_dtype).element_size()
                extra = max(1, -(-wire_size // pack_size))
            parts.append(Part(idx, plan, flat, extra))
        # the cheap case: one buffer in the values' own dtype, every value of one non-empty shape;
        # the flag is then one more value-shaped row (torch.stack packs, unbind unpacks)
        self.stack = bool(
            len(parts) == 1
            and len(set(shapes)) == 1
            and not parts[0].plan.cast
            and parts[0].layout.numels[0] > 0
        )
        if self.stack:
            parts[0].extra = parts[0].layout.numels[0]
        #: what the stacked path compares and reads per call, worked out once: the stacked buffer's
        #: shape (the values and the flag row), scalar rows, and whether mean divides afterwards
        self.stacked = torch.Size((len(keys) + 1, *shapes[0])) if self.stack else None
        self.scalar = bool(self.stack and len(shapes[0]) == 0)
        self.divide = bool(parts and parts[0].plan.post is Post.DIVIDE)
        self.parts = parts
        first = parts[0].plan if parts else None
        self.flag = _sizes.match_flag(first.reduce_op or "sum", first.comm_dtype, ws) if first else None
        #: the fingerprint every rank compares on a checked call, and as one int (the header's layout)
        self.words = fingerprint(op, describe(keys, shapes, dtypes))
        self.fp = (self.words[0] << 31) | self.words[1]
        self._rows: dict[tuple[Optional[torch.device], int], Tensor] = {}
        #: (part, stacked) -> its reducer, made by the first such call (kept: its route, rows and wire call);
        #: a stacked layout's rows and its packed zeros (``pack(None, ...)``) are buffers of two shapes
        self._reducers: dict[tuple[int, bool], transport.FlatReducer] = {}
        # the verdicts this layout's calls record (the same on every rank: built from agreed facts only)
        nbytes = sum(p.layout.total * torch.empty((), dtype=p.pack_dtype).element_size() for p in parts)
        head = (_sizes.Header.of_bytes(nbytes, self.fp),)
        self.held = _sizes.Verdict(_sizes.Outcome.HELD, head, nbytes, nbytes)  #: the prediction held
        self.explicit = _sizes.Verdict(_sizes.Outcome.HELD, head, None, nbytes)  #: checked, then moved

    def _row(self, first: Tensor, value: int) -> Tensor:
        """A value-shaped tensor filled with ``value`` on ``first``'s device (the stacked flag row)."""
        device = None if first.is_cpu else first.device
        t = self._rows.get((device, value))
        if t is None:
            t = self._rows[(device, value)] = torch.full(
                self.sig[2][0], value, dtype=self.sig[3][0], device=device
            )
        return t

    def pack(self, values: Optional[Sequence[Tensor]], flag: int) -> Buffers:
        """The buffers holding ``values`` (zeros if None) and ``flag``.

        Raises:
            RuntimeError, NotImplementedError, TypeError: a value that cannot be packed (sparse, meta).
        """
        cdev = self.cdev
        if self.stack and values is not None:
            try:
                flat = torch.stack([*values, self._row(values[0], flag)])
            except RuntimeError:  # values on several devices: pack them one by one below
                pass
            else:
                if flat.layout is not torch.strided or flat.is_meta:
                    raise TypeError("a value is not a dense tensor with data")
                if flat.requires_grad:
                    flat = flat.detach()
                if not (self.cpu and flat.is_cpu) and flat.device != cdev:
                    flat = flat.to(cdev)
                return [(flat, flat)], True
        bufs = []
        with torch.no_grad():
            for part in self.parts:
                fl = part.layout
                if values is None:
                    flat = torch.zeros(fl.total + part.extra, dtype=part.pack_dtype, device=cdev)
                else:
                    flat = torch.empty(fl.total + part.extra, dtype=part.pack_dtype, device=cdev)
                    body = flat[: fl.total]
                    members = [values[i] for i in part.idx]
                    if all(m.device == cdev for m in members):
                        torch.cat([m.reshape(-1) for m in members], out=body)  # casts into pack_dtype
                    else:
                        for m, off, n in zip(members, fl.offsets, fl.numels):
                            body[off : off + n].copy_(m.reshape(-1))
                    if part.extra:
                        flat[fl.total :].zero_()
                wire = flat.view(part.plan.comm_dtype) if part.plan.view else flat
                if part.extra:
                    wire[-1] = flag
                bufs.append((flat, wire))
        return bufs, False

    def try_pack(self, op: str, keys: Sequence[Any], values: Sequence[Any], flag: int) -> Optional[Buffers]:
        """The buffers of ``values`` when this call fits the layout, else None.

        Fits: the same op, keys, dtypes, shapes and device type, dense tensors with data. Cheaper than
        building and comparing the call's signature (the fast path of every steady-state call).
        """
        if op != self.sig[0] or keys != self.keys:
            return None
        try:
            if [v.dtype for v in values] != self.dtypes:
                return None  # (torch.stack would promote a stray int silently)
            first = values[0]
            if not (first.is_cpu if self.device_type == "cpu" else first.device.type == self.device_type):
                return None
            if self.stack:
                flat = torch.stack([*values, self._row(first, flag)])
                if flat.shape != self.stacked or flat.layout is not _STRIDED or flat.is_meta:
                    return None
                if flat.requires_grad:
                    flat = flat.detach()
                if not (self.cpu and flat.is_cpu) and flat.device != self.cdev:
                    flat = flat.to(self.cdev)
                return [(flat, flat)], True
            if [v.shape for v in values] != self.shapes:
                return None
            return self.pack(values, flag)
        except (AttributeError, IndexError, RuntimeError, NotImplementedError, TypeError):
            return None  # not tensors, several devices, sparse or meta: the check names it

    def reduce(self, bufs: Buffers, group: Any) -> None:
        """Reduce every buffer across the ranks, in place."""
        reducers, stacked = self._reducers, bufs[1]
        for i, (part, (_, wire)) in enumerate(zip(self.parts, bufs[0])):
            reducer = reducers.get((i, stacked))
            if reducer is None or not reducer.current():
                rop = part.plan.reduce_op or "sum"
                reducer = transport.FlatReducer(wire, rop, group, self.ws, self.driver)
                reducers[(i, stacked)] = reducer
            reducer(wire)

    def unpack(
        self, bufs: Buffers, keys: Sequence[Any], values: Sequence[Tensor], data: Any, flagged: bool = False
    ) -> bool:
        """Mean's division, then each key replaced by its reduced value (own dtype, shape and device).

        With ``flagged``, first the reduced flag: False (and nothing written) when it says that some
        rank did not send this layout.
        """
        if bufs[1]:  # stacked: value-shaped rows, the flag row last
            flat = bufs[0][0][0]
            rows = flat.unbind(0)
            if flagged:
                last = rows[-1]
                assert self.flag is not None
                if not self.flag.ok((last if self.scalar else last.reshape(-1)[0]).item()):
                    return False
            if self.divide:
                divide(flat, self.ws, self.parts[0].plan.dtype)
            if not (flat.is_cpu and values[0].is_cpu) and flat.device != values[0].device:
                rows = flat.to(values[0].device).unbind(0)
            for k, piece in zip(keys, rows):  # the last row (the flag) has no key
                data[k] = piece
            return True
        if flagged:
            wire = bufs[0][0][1]
            assert self.flag is not None
            if not self.flag.ok(wire[-1].item()):
                return False
        for part, (flat, wire) in zip(self.parts, bufs[0]):
            if part.plan.post is Post.DIVIDE:
                divide(wire, self.ws, part.plan.dtype)
            fl = part.layout
            body = flat[: fl.total] if part.extra else flat
            members = [values[i] for i in part.idx]
            fd, fdev = body.dtype, body.device
            same = all(m.dtype == fd and m.device == fdev for m in members)
            if same and all(len(sh) == 0 for sh in fl.shapes):  # scalar metrics: one call makes every view
                pieces: Any = body.unbind(0)
            else:
                pieces = [piece.view(sh) for piece, sh in zip(body.split(fl.numels), fl.shapes)]
            for i, orig, piece in zip(part.idx, members, pieces):
                if not same:
                    if piece.dtype != orig.dtype:
                        piece = piece.to(orig.dtype)
                    if piece.device != orig.device:
                        piece = piece.to(orig.device)
                data[keys[i]] = piece
        return True

    def move(self, keys: Sequence[Any], values: Sequence[Tensor], data: Any, group: Any) -> None:
        """Pack, reduce and unpack ``values`` in this layout (the ranks agreed on it, or did not check)."""
        if self.parts:
            bufs = self.pack(values, self.flag.match if self.flag is not None else 0)
            self.reduce(bufs, group)
            self.unpack(bufs, keys, values, data)


class DictCall:
    """One ``all_reduce_dict`` call as the protocol sees it.

    Args:
        fn: the public op's name (starts every message).
        op: the reduce op's hwdist name.
        keys: the dict's keys, sorted.
        values: their values, in that order.
        data: the dict (updated in place).
        problem: this rank's bad argument, found before any communication (its message without
            ``fn``; raised on every rank together when checked).
        kind: the exception type of a problem found later (no plan for a dtype and the op).
    """

    __slots__ = ("fn", "op", "keys", "values", "data", "problem", "kind", "sig", "_checked")

    def __init__(
        self,
        fn: str,
        op: str,
        keys: list[Any],
        values: list[Any],
        data: Any,
        problem: Optional[Exception],
        kind: type[Exception],
    ) -> None:
        self.fn = fn
        self.op = op
        self.keys = keys
        self.values = values
        self.data = data
        self.problem = problem
        self.kind = kind
        self.sig: Optional[Signature] = None
        self._checked = False

    def check(self) -> None:
        """Find a bad value (not a tensor, sparse, meta) and the signature, once (not on the fast paths)."""
        if self._checked:
            return
        self._checked = True
        if self.problem is None:
            text = value_problem(self.keys, self.values)
            if text is not None:
                self.problem = self.kind(text)
        if self.problem is None:
            self.sig = signature(self.op, self.keys, self.values)


def value_problem(keys: Sequence[Any], values: Sequence[Any]) -> Optional[str]:
    """What is wrong with the first bad value (not a tensor, sparse, meta), or None."""
    for k, v in zip(keys, values):
        if not isinstance(v, torch.Tensor):
            return f"data[{k!r}] must be a torch.Tensor, got {type(v).__name__}"
        if v.layout is not torch.strided:
            layout = str(v.layout).replace("torch.", "")
            return f"data[{k!r}] must be a dense (strided) tensor, got a {layout} tensor"
        if v.is_meta:
            return f"data[{k!r}] is a meta tensor: it has no values to reduce"
    return None


class LayoutAgreement:
    """One process group's ``all_reduce_dict`` protocol over ``_sizes``; the one entry point is ``reduce``.

    Args:
        group: the process group (None: the default group).
        ws: its size.
        check: raises on every rank together unless every rank holds the same layout (and no rank's
            arguments were bad): ``check(fn, keys, values, problem, group, op=, driver=, words=)``.
        history: the group's ``_sizes.history(group, "all_reduce_dict")``.
    """

    LIMIT = 64

    def __init__(self, group: Any, ws: int, check: Check, history: _sizes.SizeHistory) -> None:
        self.group = group
        self.ws = ws
        self.check = check
        self.history = history
        #: the layouts every rank agreed on, by fingerprint (filled only by agreed calls: alike everywhere)
        self.agreed: dict[int, DictLayout] = {}
        #: the layout the history predicts for the next call (with a flag), or None: explicit
        self.predicted: Optional[DictLayout] = None
        self.built: dict[tuple[Signature, str], DictLayout] = {}
        #: this rank's last ``verify=False`` layout (local only: it never decides what is sent)
        self.unchecked: Optional[DictLayout] = None

    # The same arguments as DictCall's (deliberate): reduce builds one DictCall from them per call.
    def reduce(
        self,
        fn: str,
        op: str,
        keys: list[Any],
        values: list[Any],
        data: Any,
        problem: Optional[Exception],
        kind: type[Exception],
        checked: bool = True,
    ) -> None:
        """Reduce ``values`` into ``data``; with ``checked``, every rank raises together on a mismatch.

        The arguments are [`DictCall`][hwdist.collectives._layouts.DictCall]'s (built only off the
        steady state). Unchecked, a problem raises on this rank only, before it communicates.
        """
        if not checked:
            recent = self.unchecked
            if recent is not None and problem is None:
                bufs = recent.try_pack(op, keys, values, recent.flag.match if recent.flag else 0)
                if bufs is not None:
                    recent.reduce(bufs, self.group)
                    recent.unpack(bufs, keys, values, data)
                    return
            call = DictCall(fn, op, keys, values, data, problem, kind)
            layout = self.layout_for(call)
            if call.problem is not None:
                raise type(call.problem)(f"{fn}: {call.problem}")
            if layout is not None:
                layout.move(keys, values, data, self.group)
                self.unchecked = layout
            return
        predicted = self.predicted
        if predicted is not None:  # the same branch on every rank: the history is the same everywhere
            flag = predicted.flag
            assert flag is not None
            bufs = predicted.try_pack(op, keys, values, flag.match) if problem is None else None
            if bufs is None:
                bufs = predicted.pack(None, flag.mismatch)
            predicted.reduce(bufs, self.group)
            if predicted.unpack(bufs, keys, values, data, flagged=True):
                self.record(predicted.held, predicted)
                return
            # every rank saw the same flag: the explicit exchange now; the miss is not recorded (no backoff:
            # the check's agreed layout is the next prediction, so a changed dict costs 3 once, then 1)
        call = DictCall(fn, op, keys, values, data, problem, kind)
        layout = self.layout_for(call)
        driver = layout.driver if layout is not None else None
        words = layout.words if layout is not None else None
        self.check(fn, keys, values, call.problem, self.group, op=op, driver=driver, words=words)
        if layout is not None and layout.parts:
            layout.move(keys, values, data, self.group)
            self.record(layout.explicit, layout)

    def record(self, v: _sizes.Verdict, layout: Optional[DictLayout]) -> None:
        """Move the history by one call's verdict (on every rank alike) and draw the next prediction."""
        hist = self.history
        hist.record(v)
        if layout is not None and self.agreed.get(layout.fp) is not layout:
            if len(self.agreed) >= self.LIMIT:
                self.agreed.clear()  # the same on every rank: only agreed calls fill it
            self.agreed[layout.fp] = layout
        fp = hist.expected_layout()
        nxt = self.agreed.get(fp) if fp is not None else None
        self.predicted = nxt if nxt is not None and nxt.flag is not None else None

    def layout_for(self, call: DictCall) -> Optional[DictLayout]:
        """This rank's layout of ``call`` (built once per signature and device type).

        None for an empty dict or a bad call; no plan for a value's dtype and the op becomes
        ``call.problem``.
        """
        call.check()
        if call.problem is not None or call.sig is None or not call.values:
            return None
        dtype = call.values[0].device.type
        driver = registry.resolve(self.group, dtype)
        found = self.built.get((call.sig, dtype))
        if found is not None and found.driver is driver:
            return found
        plans: dict[torch.dtype, Plan] = {}
        try:
            for v in call.values:
                if v.dtype not in plans:
                    plans[v.dtype] = driver.plan("all_reduce", v.dtype, call.op)
        except PlanError as exc:  # the same type as all_reduce raises, on every rank
            call.problem = exc
            return None
        except (TypeError, ValueError) as exc:
            call.problem = call.kind(f"{type(exc).__name__}: {exc}")
            return None
        if len(self.built) >= 256:
            self.built.clear()  # a local cache: clearing it changes nothing on the wire
        found = self.built[(call.sig, dtype)] = DictLayout(call.sig, driver, dtype, plans, self.ws)
        return found
