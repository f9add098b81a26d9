"""``all_reduce_dict``: a dict of tensors reduced in few flat buffers, its layouts and its check.

The values are packed into one flat buffer per way of reducing (``DictLayout``), usually one. With
``verify=True`` the ranks agree on the layout once (``consensus.agree``), and later calls send the
agreed layout's buffers with check slots that every rank reads from the same reduction
(docs/collectives.md, "all_reduce_dict and its layout check"). Public through
[`hwdist.collectives.params`][hwdist.collectives.params].
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.distributed as torch_dist

from .. import _compat, _state, registry
from .verify import describe_tensor
from ..errors import ArgumentAssertionError
from ..drivers.base import Plan, Post
from . import transport
from . import tensor as _t
from .consensus import check_same_dicts, dict_fingerprint
from ._args import op_field
from ._wire import divide
from .call_entry import collective
from .engine import check

__all__ = ["all_reduce_dict", "check_same_dicts"]

Tensor = torch.Tensor


def _key_order(key: Any) -> tuple[str, str]:
    # str keys sort as sorted() does; other hashable keys sort deterministically.
    return ("", key) if isinstance(key, str) else (type(key).__name__, repr(key))


def _value_problem(keys: Sequence[Any], values: Sequence[Any]) -> Optional[str]:
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


class _Part:
    """One flat buffer of a dict layout: which values (``idx``), packed in which dtype, reduced how.

    Values of one non-empty shape that travel in their own dtype are stacked (one ``torch.stack``,
    one ``unbind``); others are concatenated into a 1-D buffer, cast into the plan's dtype on the way.
    The part that carries the layout's check slots (``extra`` elements) has them after the values.
    """

    __slots__ = ("idx", "plan", "shapes", "numels", "offsets", "pack_dtype", "own", "stacked", "reducer",
                 "size", "extra", "cdev", "cpu", "rows", "tail")  # fmt: skip

    def __init__(
        self,
        idx: list[int],
        plan: Plan,
        shapes: list[torch.Size],
        dtypes: list[torch.dtype],
        cdev: torch.device,
        extra: int,
    ) -> None:
        self.idx, self.plan, self.cdev, self.cpu = idx, plan, cdev, cdev.type == "cpu"
        self.shapes = [shapes[i] for i in idx]
        self.numels = [math.prod(s) for s in self.shapes]
        self.offsets = [sum(self.numels[:j]) for j in range(len(idx))]
        self.size = sum(self.numels)  #: elements of the values (the buffer has ``extra`` more)
        self.pack_dtype = plan.dtype if plan.view else plan.comm_dtype
        self.own = all(dtypes[i] == self.pack_dtype for i in idx)  #: no value changes dtype
        one = self.shapes[0]
        same = self.own and self.numels[0] and all(s == one for s in self.shapes)
        #: the stacked values' shape, or None: concatenated
        self.stacked = torch.Size((len(idx), *one)) if same else None
        #: the stacked values are not 0-d (a 1-D buffer is viewed back into their stacked shape)
        self.rows = same and len(one) > 0
        #: elements after the values: the layout's check slots in one part (``DictLayout.check``), else 0
        self.extra = extra
        #: what ``pack`` writes after the values: this rank's own check slots (set by the layout)
        self.tail: Optional[Tensor] = None
        self.reducer: Optional[transport.FlatReducer] = None  #: route, rows and wire call, made once

    def pack(self, values: Sequence[Tensor]) -> tuple[Tensor, Tensor, bool]:
        """``(buffer, wire, home)``: the buffer, as it travels, and whether every value was on ``cdev``.

        Raises:
            RuntimeError, NotImplementedError, TypeError: a value that does not fit (another shape,
                sparse, meta); only where the values were not checked first.
        """
        members = [values[i] for i in self.idx]
        cdev, tail = self.cdev, self.tail
        if self.stacked is not None:
            try:
                flat = torch.stack(members)
                home = flat.is_cpu if self.cpu else flat.device == cdev
            except (RuntimeError, AssertionError):  # values on several devices (or of other shapes, or a
                # meta value on an older torch, whose meta kernels assert: raises again)
                flat, home = torch.stack([m.to(cdev) for m in members]), False
            if flat.shape != self.stacked or flat.layout is not torch.strided or flat.is_meta:
                raise TypeError("the values do not fit the layout")
            if flat.requires_grad:
                flat = flat.detach()
            if not home:
                flat = flat.to(cdev)
            if tail is not None:
                flat = torch.cat([flat.view(-1) if self.rows else flat, tail])
        else:
            flat = torch.empty(self.size + self.extra, dtype=self.pack_dtype, device=cdev)
            home = all(m.is_cpu for m in members) if self.cpu else all(m.device == cdev for m in members)
            with torch.no_grad():
                if home:  # casts into pack_dtype
                    flat_values = [m.reshape(-1) for m in members]
                    torch.cat(flat_values if tail is None else [*flat_values, tail], out=flat)
                else:
                    for m, off, n in zip(members, self.offsets, self.numels):
                        flat[off : off + n].copy_(m.reshape(-1))
                    if tail is not None:
                        flat[self.size :].copy_(tail)
        return flat, (flat.view(self.plan.comm_dtype) if self.plan.view else flat), home

    def reducer_for(self, wire: Tensor, group: Any, ws: int, driver: Any) -> transport.FlatReducer:
        """The reducer of this part's buffers: made once, and again after ``set_tuning``."""
        reducer = self.reducer
        if reducer is None or not reducer.current():
            tail = self.tail
            if tail is not None and self.plan.view:
                tail = tail.view(self.plan.comm_dtype)
            reducer = self.reducer = transport.FlatReducer(
                wire, self.plan.reduce_op or "sum", group, ws, driver, tail=tail
            )
        return reducer

    def reduce(self, wire: Tensor, group: Any, ws: int, driver: Any) -> None:
        """Reduce ``wire`` (a packed buffer as it travels) in place."""
        self.reducer_for(wire, group, ws, driver)(wire)

    def blank(self) -> tuple[Tensor, Tensor, bool]:
        """A buffer of this part's size and dtype, with no values (a rank whose dict differs sends it)."""
        flat = torch.zeros(self.size + self.extra, dtype=self.pack_dtype, device=self.cdev)
        return flat, (flat.view(self.plan.comm_dtype) if self.plan.view else flat), True

    def finish(
        self, buf: tuple[Tensor, Tensor, bool], keys: list[Any], values: list[Any], data: Any, ws: int
    ) -> None:
        """Mean's division, then each key replaced by its reduced value (own dtype, shape and device).

        ``buf``'s buffer may hold the values alone (``DictLayout.read_slots`` cut the slots off).
        """
        flat, wire, home = buf
        if self.plan.post is Post.DIVIDE:
            divide(wire, ws, self.plan.dtype)
        if self.extra and flat.shape[0] != self.size:  # the values, without the check slots after them
            flat = flat[: self.size]
        if self.stacked is not None:
            pieces: Sequence[Tensor] = (flat.view(self.stacked) if self.rows else flat).unbind(0)
        elif not any(self.shapes):  # 0-d values: one call makes every view
            pieces = flat.unbind(0)
        else:
            pieces = [p.view(s) for p, s in zip(flat.split(self.numels), self.shapes)]
        for i, piece in zip(self.idx, pieces):
            data[keys[i]] = piece if home and self.own else piece.to(values[i].device, values[i].dtype)


#: One call's packed buffers: ``(buffer, wire, home)`` per part (``_Part.pack``).
Buffers = list[tuple[Tensor, Tensor, bool]]


class DictLayout:
    """One dict layout (op, sorted keys, dtypes, shapes, device type) and how its values travel.

    Built once per layout and group (``_DictState``), reused call after call: one flat buffer per
    way of reducing (communication dtype, issued op, mean division, integer floor), usually one.
    """

    __slots__ = ("op", "keys", "dtypes", "shapes", "device_type", "driver", "cdev", "parts", "words",
                 "stacked", "checked", "check")  # fmt: skip

    def __init__(
        self, op: str, keys: list[Any], values: list[Tensor], driver: Any, group: Any, checked: bool
    ) -> None:
        self.op, self.keys, self.driver, self.cdev = op, keys, driver, driver.comm_device()
        self.checked = checked  #: for calls with ``verify=True`` (only those carry check slots)
        self.dtypes, self.shapes = [v.dtype for v in values], [v.shape for v in values]
        self.device_type = values[0].device.type
        plans = {dt: driver.plan("all_reduce", dt, op) for dt in dict.fromkeys(self.dtypes)}  # PlanError
        ways: dict[str, list[int]] = {}
        for i, dt in enumerate(self.dtypes):
            p = plans[dt]
            # a mean floor-divides integers (summed in a wider type) and true-divides floats: two parts
            floor = p.post is Post.DIVIDE and not (dt.is_floating_point or dt.is_complex)
            way = f"{p.comm_dtype} {p.reduce_op} {p.post.value} {p.dtype if p.view else ''} {floor}"
            ways.setdefault(way, []).append(i)
        order = sorted(ways)
        ws = torch_dist.get_world_size(group)
        #: (the part whose buffer ends with the check slots, how the slots are written and read), or None
        #: where no part can carry them (``_slot_code``); the part with the fewest slots carries them
        self.check: Optional[tuple[int, _SlotCode]] = None
        for j, w in enumerate(order if checked else ()):
            code = _slot_code(plans[self.dtypes[ways[w][0]]], ws)
            if code is not None and (self.check is None or code.size < self.check[1].size):
                self.check = (j, code)
        self.parts = [
            _Part(ways[w], plans[self.dtypes[ways[w][0]]], self.shapes, self.dtypes, self.cdev,
                  self.check[1].size if self.check is not None and self.check[0] == j else 0)
            for j, w in enumerate(order)
        ]  # fmt: skip
        self.stacked = all(p.stacked is not None for p in self.parts)  #: torch.stack checks the shapes
        self.words = dict_fingerprint(op, keys, values)  #: what every rank compares when ``verify=True``
        if self.check is not None:  # what a rank that packs its values sends
            self.parts[self.check[0]].tail = self.slot_values(self.words, False)

    def pack(self, values: list[Tensor]) -> Buffers:
        """The buffers of ``values`` (checked first: dense tensors with data, of this layout)."""
        return [part.pack(values) for part in self.parts]

    def blank(self) -> Buffers:
        """Buffers of this layout without values: what a rank that holds another dict sends in its place."""
        return [part.blank() for part in self.parts]

    def slot_values(self, words: Optional[tuple[int, int]], other: bool) -> Tensor:
        """The check slots of a rank that holds a dict of fingerprint ``words`` (None: a bad argument);
        ``other``: its values are not in this layout's buffers."""
        assert self.check is not None
        j, code = self.check
        bits = 0 if words is None else words[0] << 31 | words[1]
        facts = [words is None, other, *(bool(bits >> b & 1) for b in range(_BITS))]
        return torch.tensor(code.encode(facts), dtype=self.parts[j].pack_dtype, device=self.cdev)

    def set_slots(self, bufs: Buffers, slots: Tensor) -> None:
        """Write the check slots after the values of the carrying part."""
        j = self.check[0]  # type: ignore[index]
        bufs[j][0][self.parts[j].size :].copy_(slots)

    def read_slots(self, bufs: Buffers) -> tuple[bool, bool, bool]:
        """After a reduction in which some rank sent other check slots: (some rank had a bad argument, some
        rank's values are not in these buffers, every rank's fingerprint is the same).

        The carrying part's buffer is replaced by its values (what ``finish`` reads).
        """
        j, code = self.check  # type: ignore[misc]
        flat, wire, home = bufs[j]
        size = self.parts[j].size
        bufs[j] = (flat[:size], wire, home)
        return code.decode(flat[size:])

    def try_pack(self, op: str, keys: list[Any], values: list[Any], checked: bool) -> Optional[Buffers]:
        """The buffers of ``values`` when this call has this layout, with dense tensors that have data.

        Else None (the caller then checks the values and builds the call's layout). Cheaper than the
        checks and the signature: the path of every call whose dict is the one of the call before.
        """
        if op != self.op or keys != self.keys or checked != self.checked:
            return None
        try:
            if [v.dtype for v in values] != self.dtypes:  # (torch.stack would promote a stray int)
                return None
            if not self.stacked and [v.shape for v in values] != self.shapes:
                return None
            first = values[0]
            if not (first.is_cpu if self.device_type == "cpu" else first.device.type == self.device_type):
                return None
            return self.pack(values)
        except Exception:  # noqa: BLE001 - not tensors, sparse or meta (older torch: AssertionError from
            return None  # its meta kernels): the checks name it

    def reduce(self, bufs: Buffers, group: Any, ws: int, skip: int = -1) -> None:
        """Reduce the buffers in place, but part ``skip``'s."""
        for i, (part, (_, wire, _)) in enumerate(zip(self.parts, bufs)):
            if i != skip:
                part.reduce(wire, group, ws, self.driver)

    def reduce_checked(self, bufs: Buffers, group: Any, ws: int) -> tuple[bool, bool, bool]:
        """Reduce the part with the check slots and read them; the other parts only when every rank holds
        this layout, with good values.

        When every rank sent this rank's own slots (the reducer compares them: ``reduce_checked``), the
        part's buffer is replaced by its reduced values; else the slots are decoded (``read_slots``).
        """
        j = self.check[0]  # type: ignore[index]
        part = self.parts[j]
        wire = bufs[j][1]
        values = part.reducer_for(wire, group, ws, self.driver).reduce_checked(wire)
        if values is None:
            bad, elsewhere, same = verdict = self.read_slots(bufs)
        else:
            bufs[j] = (values.view(part.pack_dtype) if part.plan.view else values, values, bufs[j][2])
            bad, elsewhere, same = verdict = False, False, True
        if len(self.parts) > 1 and not (bad or elsewhere) and same:
            self.reduce(bufs, group, ws, skip=j)
        return verdict

    def finish(self, bufs: Buffers, keys: list[Any], values: list[Tensor], data: Any, ws: int) -> None:
        """Write every reduced value back (``reduce`` first)."""
        for part, buf in zip(self.parts, bufs):
            part.finish(buf, keys, values, data, ws)


_BITS = 62  #: the fingerprint's bits (two 31-bit words)


class _SlotCode:
    """How a rank's check facts travel in the check slots, and what the reduced slots say.

    The facts are 64 bits: a bad argument, values elsewhere (the rank's dict is not this layout's),
    then the fingerprint's bits. After the reduction: (some rank had a bad argument, some rank's values
    are elsewhere, every rank's fingerprint is the same).
    """

    size: int  #: the number of slots

    def encode(self, facts: list[bool]) -> list[Any]:
        raise NotImplementedError

    def decode(self, slots: Tensor) -> tuple[bool, bool, bool]:
        raise NotImplementedError


class _Counts(_SlotCode):
    """Under a sum that stays exact: each slot holds ``per`` facts as digits in base ``ws + 1`` (a rank
    sends 1 where a fact holds), so the reduced digit is how many ranks sent it. A fingerprint bit is the
    same everywhere when its count is 0 or ``ws``. float32 metrics on 2 ranks: 15 facts a slot, 5 slots.
    """

    def __init__(self, per: int, ws: int) -> None:
        self.per, self.base = per, ws + 1
        self.size = -(-(2 + _BITS) // per)

    def encode(self, facts: list[bool]) -> list[Any]:
        return [sum(self.base**i for i, f in enumerate(facts[s : s + self.per]) if f)
                for s in range(0, len(facts), self.per)]  # fmt: skip

    def decode(self, slots: Tensor) -> tuple[bool, bool, bool]:
        counts = []
        for v in slots.tolist():
            v = int(v)
            for _ in range(self.per):
                v, digit = divmod(v, self.base)
                counts.append(digit)
        ws = self.base - 1
        return counts[0] > 0, counts[1] > 0, all(c in (0, ws) for c in counts[2 : 2 + _BITS])


class _Pairs(_SlotCode):
    """Under any op that tells whether some rank raised a slot (1 under sum, average, max and or: the
    result is nonzero; 0 under min, product and and: the result is zero): one slot per flag, then two
    per fingerprint bit, the first raised where the bit is 1, the second where it is 0. A pair with both
    raised is a bit on which two ranks differ (126 slots)."""

    size = 2 + 2 * _BITS

    def __init__(self, up: int) -> None:
        self.up = up  #: a raised slot's value (an int: it converts into every dtype without a warning)

    def encode(self, facts: list[bool]) -> list[Any]:
        raised = facts[:2]
        for f in facts[2:]:
            raised += [f, not f]
        return [self.up if r else 1 - self.up for r in raised]

    def decode(self, slots: Tensor) -> tuple[bool, bool, bool]:
        raised = (slots != 0) if self.up else (slots == 0)
        head = raised[:2].tolist()
        return bool(head[0]), bool(head[1]), not bool((raised[2::2] & raised[3::2]).any())


#: Issued reduce ops whose result tells whether some rank raised a slot (``_Pairs``).
_ANY_OPS, _ALL_OPS = frozenset({"sum", "avg", "max", "bor"}), frozenset({"min", "product", "band"})


def _exact_bits(dtype: torch.dtype) -> int:
    """Bits of the non-negative integers ``dtype`` holds exactly (float32: 24), or 0 (bool, complex)."""
    if dtype == torch.bool or dtype.is_complex:
        return 0
    if dtype.is_floating_point:  # the mantissa's bits and the implicit one (eps is 2 ** -mantissa)
        return round(-math.log2(torch.finfo(dtype).eps)) + 1
    return (torch.iinfo(dtype).max + 1).bit_length() - 1


def _slot_code(plan: Plan, ws: int) -> Optional[_SlotCode]:
    """How check slots travel in a buffer of ``plan``, or None where the reduction cannot tell (bxor; an
    integer sum that could wrap around with this many ranks; an integer average).

    A sum whose counts stay exact packs them as digits (``_Counts``); else one or two slots per fact
    (``_Pairs``): a sum of non-negative numbers is zero only when all are, in every float type too; a
    product, minimum or and of zeros and ones is zero when one is.
    """
    op, cd = plan.reduce_op, plan.comm_dtype
    if op == "sum" and not plan.view:
        per, bits = 0, _exact_bits(cd)
        while (ws + 1) ** (per + 1) <= 1 << bits:
            per += 1
        if per:
            return _Counts(min(per, 2 + _BITS), ws)
    if op in _ALL_OPS:
        return _Pairs(0)
    if op not in _ANY_OPS:
        return None
    if op in ("sum", "avg") and not (cd.is_floating_point or cd.is_complex or cd == torch.bool):
        if op == "avg" or ws > torch.iinfo(cd).max:  # an integer average of ones may floor to 0
            return None
    return _Pairs(1)


@dataclass(eq=False)
class _DictState:
    """One process group's ``all_reduce_dict`` layouts (a local cache: nothing here decides what is sent)."""

    ws: int
    last: Optional[DictLayout] = None
    #: the layout every rank held in the last verified call (the same on every rank), or None
    agreed: Optional[DictLayout] = None
    built: dict[tuple[Any, ...], DictLayout] = field(default_factory=dict)

    def layout(
        self, group: Any, op: str, keys: list[Any], values: list[Any], kind: type[Exception], checked: bool
    ) -> DictLayout:
        """This call's layout (built once per layout and driver), its values checked.

        Raises:
            ``kind``: a value that is not a dense tensor with data.
            PlanError: no plan for a value's dtype and ``op`` on this backend.
        """
        text = _value_problem(keys, values)
        if text is not None:
            raise kind(text)
        driver = registry.resolve(group, values[0].device.type)
        dtypes, shapes = tuple(v.dtype for v in values), tuple(v.shape for v in values)
        sig = (op, tuple(keys), dtypes, shapes, driver, checked)
        found = self.built.get(sig)
        if found is None:
            if len(self.built) >= 64:
                self.built.clear()
            found = self.built[sig] = DictLayout(op, keys, values, driver, group, checked)  # PlanError
        return found


def _describe_dict_call(data: Any, op: Any) -> tuple[Any, dict[str, Any]]:
    """Verification mode: what must agree (keys, shapes, dtypes, op); the sample picks the device."""
    if isinstance(data, MutableMapping):
        try:
            keys = sorted(data)
        except TypeError:
            keys = sorted(data, key=_key_order)
        fields: Any = {repr(k): describe_tensor(data[k]) for k in keys}
        first = next((v for v in data.values() if isinstance(v, torch.Tensor)), None)
    else:
        fields, first = type(data).__name__, None
    return first, {"data": fields, "reduce_op": op_field(op)}


@collective(2)
def all_reduce_dict(
    data: MutableMapping, op: _t.ReduceOpLike = "sum", group: Optional[Any] = None, *, verify: bool = True
) -> None:
    """Reduce every tensor of a dict across ranks with one flattened collective.

    Keys are processed in sorted order. Tensors are packed into one flat
    buffer per communication dtype (usually exactly one: all float32 metrics
    travel together); mixed dtypes are never merged lossily (an int64 counter
    does not go through float32). Each key is replaced by its reduced tensor
    in the key's own dtype, shape and device (as in mmengine). Same ops and
    mean rule as [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce].

    With ``verify=True`` (default) every rank checks that all ranks hold the same keys, shapes, dtypes and
    op; on a mismatch or a bad value on any rank, every rank raises ValueError naming the difference (e.g.
    "rank 1 lacks keys 'b'"), instead of hanging or mixing up values. The check is one small collective
    before the data: the ranks agree on a fingerprint of the layout (keys, shapes, dtypes, op) and on
    whether some rank's arguments were bad (``collectives.consensus.agree``). See ``docs/collectives.md``.
    Every value is checked (a tensor, dense, not meta) and ``op`` and ``data`` too before any
    communication; with ``verify=True`` a bad one on ONE rank makes every rank raise. ``verify=False``
    skips the check (mmengine's behaviour: a mismatch is then undefined, and a bad value raises on its own
    rank only, before that rank communicates). In verification mode
    ([`hwdist.verification`][hwdist.collectives.verify.verification], ``HWDIST_DEBUG=1``) the mode's
    digest exchange checks keys, shapes, dtypes and ``op`` whatever ``verify`` says and replaces this
    check; a mismatch raises [`hwdist.CollectiveMismatch`][hwdist.collectives.verify.CollectiveMismatch]
    (a ValueError). ``verify`` must be the same on every rank.

    Non-distributed or a one-rank group: does nothing.

    Args:
        data: ``{key: Tensor}``, updated in place.
        op: the reduce op.
        group: process group.
        verify: check that every rank holds the same keys, shapes and dtypes.

    Raises:
        ValueError: unknown ``op``; the dicts differ across ranks, or a
            value on some rank is not a dense tensor with data (verify).
        TypeError: ``data`` is not a dict (on that rank; ValueError on the
            others), or a value is not a tensor (``verify=False``).

    Examples:
        >>> data = {"loss": torch.tensor(1.0 + rank), "n": torch.tensor([2 * rank])}
        >>> # rank 0: {'loss': 1., 'n': [0]}   rank 1: {'loss': 2., 'n': [2]}
        >>> dist.all_reduce_dict(data)
        >>> # rank 0: {'loss': 3., 'n': [2]}   rank 1: {'loss': 3., 'n': [2]}
    """
    # verification mode: a sparse or meta value, a bad op or type on one rank differ here; its check
    # replaces this function's own one
    checked = not check("all_reduce_dict", group, lambda: _describe_dict_call(data, op)) and verify
    problem: Optional[Exception] = None  # a bad op or data: raised here, or on every rank by the check
    alone: Optional[Exception] = None  # the same, as this rank raises it when no other rank is told
    try:
        rop = _t.normalize_reduce_op(op, "op", "all_reduce_dict")
    except ValueError as exc:
        problem = alone = exc
        rop = "sum"
    if problem is None and type(data) is not dict and not isinstance(data, MutableMapping):
        problem = ArgumentAssertionError(f"data must be a dict of tensors, got {type(data).__name__}")
        alone = _alone(problem)
    if not torch_dist.is_initialized():
        if alone is not None:
            raise alone
        return
    # kept by the group object (not None): a default group made by a new init gets new layouts
    st = _state.of(group if group is not None else _compat.default_group())
    state: Optional[_DictState] = st.all_reduce_dict
    if state is None:
        state = st.all_reduce_dict = _DictState(torch_dist.get_world_size(group))
    if alone is not None and (not checked or state.ws == 1):
        raise alone
    if state.ws == 1:
        return
    keys: list[Any] = []
    values: list[Any] = []
    layout: Optional[DictLayout] = None
    bufs: Optional[Buffers] = None
    if problem is None:
        try:
            keys = sorted(data)
        except TypeError:  # keys of mixed types: still one order on every rank
            keys = sorted(data, key=_key_order)
        values = [data[k] for k in keys]
        layout = state.last if values else None
        # the dict of the last call
        bufs = layout.try_pack(rop, keys, values, checked) if layout is not None else None
        if values and bufs is None:
            # a bad value: ValueError on every rank when checked; else TypeError on this rank (ValueError in
            # verification mode with verify=True, where the digest exchange proved it is the same everywhere)
            kind = TypeError if not verify else ValueError
            try:
                layout = state.layout(group, rop, keys, values, kind, checked)
                bufs = layout.pack(values)
            except (TypeError, ValueError) as exc:  # PlanError is a TypeError
                problem, layout = exc, None
            except (RuntimeError, NotImplementedError) as exc:  # a value torch cannot pack: every rank raises
                problem, layout = kind(f"{type(exc).__name__}: {exc}"), None
    known: Optional[tuple[bool, bool]] = None  # what the check slots told, when they were sent
    if checked:
        agreed, state.agreed = state.agreed, None  # set again once every rank is known to hold it
        if agreed is not None and agreed.check is not None:
            # every rank held ``agreed`` in the last verified call: its buffers go now, with check slots
            # that compare every rank's fingerprint, in one collective (a bad argument or another dict
            # on some rank is known to every rank from the same exchange)
            mine = layout is agreed and bufs is not None
            sent: Buffers = bufs if mine else agreed.blank()  # type: ignore[assignment]
            if not mine:  # (packed buffers carry the layout's own slots)
                held = None if problem is not None else dict_fingerprint(rop, keys, values)
                agreed.set_slots(sent, agreed.slot_values(held, True))
            bad, elsewhere, same = agreed.reduce_checked(sent, group, state.ws)
            if not bad and same and not elsewhere:
                agreed.finish(sent, keys, values, data, state.ws)
                state.agreed = state.last = agreed
                return
            if not bad and same:  # every rank holds the same other dict: it goes next
                if layout is not None:
                    bufs = layout.pack(values)
                    layout.reduce(bufs, group, state.ws)
                    layout.finish(bufs, keys, values, data, state.ws)
                state.last = layout
                state.agreed = layout if layout is not None and layout.check is not None else None
                return
            # else every rank raises: the difference or the bad argument, named
            known = (bad, same)
        words = layout.words if layout is not None else None
        driver = layout.driver if layout is not None else None
        check_same_dicts(
            "all_reduce_dict", keys, values, problem, group, op=rop, driver=driver, words=words, known=known
        )
    elif problem is not None:
        raise _alone(problem)
    if layout is not None and bufs is not None:
        layout.reduce(bufs, group, state.ws)
        layout.finish(bufs, keys, values, data, state.ws)
        state.last = layout
        if checked and layout.check is not None:
            state.agreed = layout


def _alone(problem: Exception) -> Exception:
    """``problem`` as this rank raises it when no other rank is told (the op's name first)."""
    return type(problem)(f"all_reduce_dict: {problem}")
