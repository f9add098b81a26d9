"""Many tensors in few collectives: flat buffers, metric dicts and model parameters.

The flat-buffer helpers pack tensors into one 1-D buffer and split it back (no communication; the training
helpers use them too). ``all_reduce_dict`` and ``all_reduce_params`` pack one buffer per communication dtype,
so a dict of metrics or a whole model costs about one all_reduce (docs/collectives.md).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

import torch
import torch.distributed as torch_dist

from .. import _compat, _state, registry
from ..drivers.base import Plan, Post
from ..drivers.tuning import tuning
from ..errors import ArgumentAssertionError
from . import call_entry, protocol, verify
from . import tensor as _t
from .call_entry import collective
from .protocol import check_same_dicts  # noqa: F401 (re-exported)
from .verify import describe_tensor
from .wire import divide, not_dense, op_field

__all__ = [
    "all_reduce_dict", "all_reduce_params", "FlatLayout", "flatten_tensors", "unflatten_tensors",
    "copy_from_flat", "bucket_tensors",
]  # fmt: skip

Tensor = torch.Tensor


# ---- flat buffers (no communication) -----------------------------------------------------------------
@dataclass(frozen=True)
class FlatLayout:
    """Where each tensor lives in a flat buffer.

    Attributes:
        shapes: shape of each tensor.
        dtypes: original dtype of each tensor.
        offsets: start of each tensor in the buffer, in elements.
        numels: number of elements of each tensor.
    """

    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    offsets: tuple[int, ...]
    numels: tuple[int, ...]

    @property
    def total(self) -> int:
        """Number of elements of the whole buffer."""
        return (self.offsets[-1] + self.numels[-1]) if self.offsets else 0

    @classmethod
    def of(cls, tensors: Sequence[Tensor]) -> "FlatLayout":
        """The layout of ``tensors`` packed back to back in order."""
        numels = tuple(t.numel() for t in tensors)
        offsets = tuple(itertools.accumulate(numels, initial=0))[:-1]
        return cls(tuple(t.shape for t in tensors), tuple(t.dtype for t in tensors), offsets, numels)


def flatten_tensors(
    tensors: Sequence[Tensor],
    dtype: Optional[torch.dtype] = None,
    device: Union[torch.device, str, None] = None,
) -> tuple[Tensor, FlatLayout]:
    """Copy ``tensors`` into one new contiguous 1-D buffer (one copy per tensor, no more).

    Args:
        tensors: tensors of any shapes (and contiguity).
        dtype: dtype of the buffer; values are cast (choose a lossless one). Default: the tensors' common
            dtype (TypeError if they differ).
        device: device of the buffer; default: the first tensor's device.

    Returns:
        ``(flat, layout)``; ``flat`` has ``layout.total`` elements.

    Examples:
        >>> flat, layout = flatten_tensors([torch.tensor([1, 2]), torch.tensor([[3]])])
        >>> flat
        tensor([1, 2, 3])
    """
    tensors = list(tensors)
    layout = FlatLayout.of(tensors)
    if dtype is None:
        found = set(layout.dtypes)
        if len(found) > 1:
            raise TypeError(
                f"flatten_tensors: tensors have several dtypes ({', '.join(sorted(map(str, found)))});"
                " pass dtype= (a lossless one) or bucket them by dtype first (bucket_tensors)"
            )
        dtype = found.pop() if found else torch.float32
    if device is None:
        device = tensors[0].device if tensors else torch.empty(0).device  # torch's default device
    device = torch.device(device)
    if not tensors:
        return torch.empty(0, dtype=dtype, device=device), layout
    home = all(t.device == device for t in tensors)
    d0, s0 = layout.dtypes[0], layout.shapes[0]
    if home and all(d == d0 for d in layout.dtypes):  # one dtype: no promotion inside cat/stack
        with torch.no_grad():
            if all(sh == s0 for sh in layout.shapes):  # e.g. scalar metrics: stack is one cheap call
                flat = torch.stack(tensors).reshape(-1)
            else:
                flat = torch.cat([t.reshape(-1) for t in tensors])
        return (flat if d0 == dtype else flat.to(dtype)), layout
    return _pack(tensors, layout.offsets, layout.numels, dtype, device, home), layout


def _pack(tensors: Sequence[Tensor], offsets: Sequence[int], numels: Sequence[int], dtype: torch.dtype,
          device: torch.device, home: bool) -> Tensor:  # fmt: skip
    """``tensors`` copied into a new 1-D buffer of ``dtype`` on ``device``, cast on the way (one ``cat``
    when ``home``: every tensor is on ``device``)."""
    flat = torch.empty(sum(numels), dtype=dtype, device=device)
    with torch.no_grad():
        if home:
            torch.cat([t.reshape(-1) for t in tensors], out=flat)
        else:
            for t, off, n in zip(tensors, offsets, numels):
                flat[off : off + n].copy_(t.reshape(-1))
    return flat


def unflatten_tensors(flat: Tensor, layout: FlatLayout) -> list[Tensor]:
    """Views of ``flat`` with the layout's shapes (``flat``'s dtype and device, no copy).

    Examples:
        >>> flat, layout = flatten_tensors([torch.ones(2, 2), torch.ones(3)])
        >>> [t.shape for t in unflatten_tensors(flat, layout)]
        [torch.Size([2, 2]), torch.Size([3])]
    """
    if flat.dim() != 1 or flat.numel() != layout.total:
        raise ValueError(
            f"unflatten_tensors: flat must be 1-D with {layout.total} elements, got shape {tuple(flat.shape)}"
        )
    pieces = zip(layout.offsets, layout.numels, layout.shapes)
    return [flat[off : off + n].view(shape) for off, n, shape in pieces]


def copy_from_flat(flat: Tensor, tensors: Sequence[Tensor], layout: Optional[FlatLayout] = None) -> None:
    """Write the pieces of ``flat`` back into ``tensors`` in place (their own dtype and device).

    Works on parameters that require grad (copies under ``torch.no_grad``). ``layout`` defaults to the layout
    of ``tensors`` packed in order.
    """
    tensors = list(tensors)
    layout = layout if layout is not None else FlatLayout.of(tensors)
    if len(tensors) != len(layout.shapes):
        raise ValueError(f"copy_from_flat: layout has {len(layout.shapes)} tensors, got {len(tensors)}")
    with torch.no_grad():
        for t, piece in zip(tensors, unflatten_tensors(flat, layout)):
            t.copy_(piece)


def bucket_tensors(tensors: Iterable[Tensor], bucket_bytes: int = -1) -> list[list[int]]:
    """Group tensor indices by (dtype, device), split so no bucket exceeds ``bucket_bytes``.

    Order is kept inside each bucket; buckets come in order of first appearance. A tensor larger than
    ``bucket_bytes`` gets a bucket of its own. ``bucket_bytes <= 0``: one bucket per (dtype, device).

    Examples:
        >>> bucket_tensors([torch.ones(2), torch.ones(2, dtype=torch.int64), torch.ones(3)])
        [[0, 2], [1]]
    """
    open_buckets: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    out: list[list[int]] = []
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        nbytes = t.numel() * t.element_size()
        bucket = open_buckets.get(key)
        if bucket is None or (bucket_bytes > 0 and sizes[key] + nbytes > bucket_bytes and bucket):
            bucket = []
            open_buckets[key] = bucket
            sizes[key] = 0
            out.append(bucket)
        bucket.append(i)
        sizes[key] += nbytes
    return out


def unique_tensors(tensors: Iterable[Tensor], *, same_memory: bool = False) -> list[Tensor]:
    """``tensors`` with repeats dropped (the first one kept), in order.

    A repeat is the same tensor object, or with ``same_memory=True`` any tensor that views the same memory the
    same way (data pointer, dtype, shape, strides, device), such as tied weights seen twice through
    ``state_dict().values()``: reduced twice in place, it would count twice.

    Examples:
        >>> w = torch.ones(2)
        >>> len(unique_tensors([w, w, w.detach()])), len(unique_tensors([w, w.detach()], same_memory=True))
        (2, 1)
    """
    seen: set[object] = set()
    out: list[Tensor] = []
    for t in tensors:
        key: object = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t.device) if same_memory else id(t)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


# ---- all_reduce_params -------------------------------------------------------------------------------
def mib_bytes(value: Any, argname: str, fn: str) -> int:
    """A size in MiB as bytes (``<= 0`` -> -1); TypeError for anything but a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{fn}: {argname} must be a number of MiB, got {value!r}")
    return int(value * 1024 * 1024) if value > 0 else -1


@collective(4)
def all_reduce_params(
    params: Iterable[Tensor],
    coalesce: bool = True,
    bucket_size_mb: float = -1,
    op: _t.ReduceOpLike = "sum",
    group: Optional[Any] = None,
) -> None:
    """All-reduce parameters (or buffers, or any tensors) in place.

    ``coalesce=True`` packs the tensors into flat buffers, one per dtype and device (buckets of at most
    ``bucket_size_mb`` MiB when positive), one asynchronous all_reduce each; tensors of at least the driver's
    ``pack_max_bytes`` are reduced in place (docs/collectives.md). ``coalesce=False`` runs one
    [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce] per tensor. Every rank must pass the same
    tensors; one given twice (tied weights) is reduced once. Non-distributed or one rank: does nothing.

    Args:
        params: a list or generator of tensors (e.g. ``model.parameters()``).
        coalesce: pack into flat buffers (default) or reduce one by one.
        bucket_size_mb: bucket limit in MiB; ``<= 0``: one bucket per dtype.
        op: the reduce op.
        group: process group.

    Raises:
        TypeError: an item of ``params`` is not a tensor, or ``bucket_size_mb`` is not a number (on every
            rank).

    Examples:
        >>> params = [torch.tensor([1.0, 2.0]) + rank, torch.tensor([3.0]) + rank]
        >>> # rank 0: [1., 2.], [3.]   rank 1: [2., 3.], [4.]
        >>> dist.all_reduce_params(params)
        >>> # rank 0: [3., 5.], [7.]   rank 1: [3., 5.], [7.]
    """
    items = params if isinstance(params, (list, tuple)) else list(params)
    hook = call_entry.active_hook()
    if hook is not None:  # verified here, not by the decorator: ``params`` may be an iterator it consumes
        sample = next((p for p in items if isinstance(p, torch.Tensor)), None)
        fields = {"params": [describe_tensor(p) for p in items], "reduce_op": op_field(op),
                  "coalesce": bool(coalesce), "bucket_size_mb": bucket_size_mb}  # fmt: skip
        hook("all_reduce_params", group, sample, fields)
    rop = _t.normalize_reduce_op(op, "op", "all_reduce_params")
    bucket_bytes = mib_bytes(bucket_size_mb, "bucket_size_mb", "all_reduce_params")
    tensors: list[Tensor] = []
    for i, p in enumerate(items):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"all_reduce_params: params[{i}] must be a torch.Tensor, got {type(p).__name__}")
        if p.layout is not torch.strided:
            not_dense(p, f"params[{i}]", "all_reduce_params")
        tensors.append(p.data)
    if not torch_dist.is_initialized() or not tensors:
        return
    tensors = unique_tensors(tensors, same_memory=True)  # a tensor given twice is reduced once
    if torch_dist.get_world_size(group) == 1:
        return
    if not coalesce:
        for t in tensors:
            _t.all_reduce(t, rop, group)
        return
    driver = registry.resolve(group, tensors[0].device)
    cdev = driver.comm_device()
    # Big tensors go as they are (asynchronously) where the driver says packing costs more than it saves.
    limit = tuning(driver).pack_max_bytes
    big = [limit > 0 and t.numel() * t.element_size() >= limit for t in tensors]
    if any(big) and len(tensors) > 1:
        # in place only over memory no other tensor views: overlapping in-place reductions count twice,
        # while packing reads every value before any result is written back
        counts = Counter((t.device, t.untyped_storage().data_ptr()) for t in tensors)
        big = [b and counts[(t.device, t.untyped_storage().data_ptr())] == 1 for b, t in zip(big, tensors)]
    direct = [t for t, b in zip(tensors, big) if b]
    packed = [t for t, b in zip(tensors, big) if not b]
    buckets = bucket_tensors(packed, bucket_bytes)
    plans = [driver.plan("all_reduce", packed[b[0]].dtype, rop) for b in buckets]
    for t in direct:  # errors before any communication
        driver.plan("all_reduce", t.dtype, rop)
    handles = [_t.all_reduce(t, rop, group, async_op=True) for t in direct]
    pending: list[tuple[Any, Tensor, list[Tensor], FlatLayout]] = []
    for bucket, plan in zip(buckets, plans):
        members = [packed[i] for i in bucket]
        # packed straight into the dtype the backend reduces (bf16 -> fp32 where needed): one copy;
        # an integer mean in its own dtype (all_reduce's mean rule: a wider sum, then the floor)
        own = plan.view or (plan.post is Post.DIVIDE and not plan.dtype.is_floating_point)
        flat, layout = flatten_tensors(members, dtype=plan.dtype if own else plan.comm_dtype, device=cdev)
        pending.append((_t.all_reduce(flat, rop, group, async_op=True), flat, members, layout))
    for handle, flat, members, layout in pending:
        handle.wait()
        copy_from_flat(flat, members, layout)
    for h in handles:
        h.wait()


# ---- all_reduce_dict: its layouts and its check ------------------------------------------------------
def _canon(key: Any) -> str:
    """A text of ``key`` that is the same on every rank for equal keys: sets and frozensets by their sorted
    items (their own order follows the hash seed of each process), tuples item by item, else ``repr``."""
    if isinstance(key, (frozenset, set)):
        return f"{type(key).__name__}({{{', '.join(sorted(_canon(k) for k in key))}}})"
    if isinstance(key, tuple):
        return f"({', '.join(_canon(k) for k in key)}{',' if len(key) == 1 else ''})"
    return repr(key)


def sorted_keys(data: Any) -> list[Any]:
    """The dict's keys in one order on every rank: ``sorted()``'s for str keys and for int keys, else by type
    name and a canonical text (``sorted()`` alone orders sets only partly: by inclusion)."""
    keys = list(data)
    kinds = {type(k) for k in keys}
    if kinds <= {str} or kinds <= {int}:
        return sorted(keys)
    return sorted(keys, key=lambda k: (type(k).__name__, _canon(k)))


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

    Values of one non-empty shape that travel in their own dtype are stacked (one ``torch.stack``, one
    ``unbind``); others are concatenated into a 1-D buffer, cast into the plan's dtype on the way.
    """

    __slots__ = ("idx", "plan", "shapes", "numels", "offsets", "pack_dtype", "own", "stacked", "cdev", "cpu",
                 "rows")  # fmt: skip

    def __init__(
        self, idx: list[int], plan: Plan, shapes: list[torch.Size], dtypes: list[torch.dtype], cdev: Any
    ) -> None:
        self.idx, self.plan, self.cdev, self.cpu = idx, plan, cdev, cdev.type == "cpu"
        self.shapes = [shapes[i] for i in idx]
        self.numels = [math.prod(s) for s in self.shapes]
        self.offsets = [sum(self.numels[:j]) for j in range(len(idx))]
        self.pack_dtype = plan.dtype if plan.view else plan.comm_dtype
        self.own = all(dtypes[i] == self.pack_dtype for i in idx)  #: no value changes dtype
        one = self.shapes[0]
        same = self.own and self.numels[0] and all(s == one for s in self.shapes)
        self.stacked = torch.Size((len(idx), *one)) if same else None  #: or None: concatenated
        self.rows = same and len(one) > 0  #: not 0-d: a 1-D buffer is viewed back into ``stacked``

    def pack(self, values: Sequence[Tensor]) -> tuple[Tensor, Tensor, bool]:
        """``(buffer, wire, home)``: the buffer, as it travels, and whether every value was on ``cdev``;
        RuntimeError, NotImplementedError or TypeError for a value that does not fit (unchecked values)."""
        members = [values[i] for i in self.idx]
        cdev = self.cdev
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
        else:
            home = all(m.is_cpu for m in members) if self.cpu else all(m.device == cdev for m in members)
            flat = _pack(members, self.offsets, self.numels, self.pack_dtype, cdev, home)
        return flat, (flat.view(self.plan.comm_dtype) if self.plan.view else flat), home

    def finish(
        self, buf: tuple[Tensor, Tensor, bool], keys: list[Any], values: list[Any], data: Any, ws: int
    ) -> None:
        """Mean's division, then each key replaced by its reduced value (own dtype, shape and device)."""
        flat, wire, home = buf
        if self.plan.post is Post.DIVIDE:
            divide(wire, ws, self.plan.dtype)
        if self.stacked is not None:
            pieces: Sequence[Tensor] = (flat.view(self.stacked) if self.rows else flat).unbind(0)
        elif not any(self.shapes):  # 0-d values: one call makes every view
            pieces = flat.unbind(0)
        else:
            pieces = [p.view(s) for p, s in zip(flat.split(self.numels), self.shapes)]
        for i, piece in zip(self.idx, pieces):
            data[keys[i]] = piece if home and self.own else piece.to(values[i].device, values[i].dtype)


Buffers = list[tuple[Tensor, Tensor, bool]]  #: ``(buffer, wire, home)`` per part (``_Part.pack``)


class DictLayout:
    """One dict layout (op, sorted keys, dtypes, shapes, device type) and how its values travel.

    Built once per layout and group (``_DictState``), reused call after call: one flat buffer per way of
    reducing (communication dtype, issued op, mean division, integer floor), usually one.
    """

    __slots__ = ("op", "keys", "dtypes", "shapes", "device_type", "driver", "cdev", "parts", "stacked")

    def __init__(self, op: str, keys: list[Any], values: list[Tensor], driver: Any) -> None:
        self.op, self.keys, self.driver, self.cdev = op, keys, driver, driver.comm_device()
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
        self.parts = [
            _Part(ways[w], plans[self.dtypes[ways[w][0]]], self.shapes, self.dtypes, self.cdev) for w in order
        ]
        self.stacked = all(p.stacked is not None for p in self.parts)  #: torch.stack checks the shapes

    def pack(self, values: list[Tensor]) -> Buffers:
        """The buffers of ``values`` (checked first: dense tensors with data, of this layout)."""
        return [part.pack(values) for part in self.parts]

    def try_pack(self, op: str, keys: list[Any], values: list[Any]) -> Optional[Buffers]:
        """The buffers of ``values`` when this call has this layout, with dense tensors that have data, else
        None: cheaper than the checks, the path of every call whose dict is the one of the call before."""
        if op != self.op or keys != self.keys:
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

    def reduce(self, bufs: Buffers, keys: list[Any], values: list, data: Any, group: Any, ws: int) -> None:
        """Reduce the buffers in place (one all_reduce each), then write every reduced value back."""
        for part, (_, wire, _) in zip(self.parts, bufs):
            protocol.reduce_flat(wire, part.plan.reduce_op or "sum", group)
        for part, buf in zip(self.parts, bufs):
            part.finish(buf, keys, values, data, ws)


@dataclass(eq=False)
class _DictState:
    """One process group's ``all_reduce_dict`` layouts (a local cache: nothing here decides what is sent)."""

    ws: int
    last: Optional[DictLayout] = None
    built: dict[tuple[Any, ...], DictLayout] = field(default_factory=dict)

    def layout(
        self, group: Any, op: str, keys: list[Any], values: list[Any], kind: type[Exception]
    ) -> DictLayout:
        """This call's layout (built once per layout and driver), its values checked: ``kind`` for a value
        that is not a dense tensor with data, PlanError for a dtype this backend cannot reduce."""
        text = _value_problem(keys, values)
        if text is not None:
            raise kind(text)
        driver = registry.resolve(group, values[0].device.type)
        dtypes, shapes = tuple(v.dtype for v in values), tuple(v.shape for v in values)
        sig = (op, tuple(keys), dtypes, shapes, driver)
        found = self.built.get(sig)
        if found is None:
            if len(self.built) >= 64:
                self.built.clear()
            found = self.built[sig] = DictLayout(op, keys, values, driver)  # PlanError
        return found


def _agree(data: Any, op: Any, problem: Optional[Exception], group: Any) -> None:
    """The header round of a verified call: every rank raises together when some rank's arguments were
    bad (naming each such rank) or the ranks' dicts differ (CollectiveMismatch naming the difference)."""
    # what verification compares (keys, shapes, dtypes, op); the sample picks the device
    described: Any = type(data).__name__
    sample = None
    if isinstance(data, MutableMapping):
        described = {_canon(k): describe_tensor(data[k]) for k in sorted_keys(data)}
        sample = next((v for v in data.values() if isinstance(v, torch.Tensor)), None)
    st = verify.stamp("all_reduce_dict", group, {"data": described, "reduce_op": op_field(op)})
    if st is None:
        if problem is not None:
            raise type(problem)(f"all_reduce_dict: {problem}")  # this rank alone
        return
    driver = registry.resolve(group, sample.device.type if sample is not None else None)
    head = verify.call_header("all_reduce_dict", st)
    if problem is not None:  # its message instead of the description
        head.status, head.flags = 1, 0
        head.inline = f"{type(problem).__name__}: {problem}".encode("utf-8", "replace")
    headers = protocol.exchange(head, group, driver)
    failed = {h.rank: h.message.partition(": ") for h in headers if h.framed and h.status != protocol.OK}
    if failed:
        failures = {r: (name, msg) for r, (name, _, msg) in failed.items()}
        raise protocol.argument_error("all_reduce_dict", problem, failures, len(headers))
    verify.raise_if_mismatch("all_reduce_dict", headers, st, group, driver)


@collective(2)
def all_reduce_dict(
    data: MutableMapping,
    op: _t.ReduceOpLike = "sum",
    group: Optional[Any] = None,
    *,
    verify: Optional[bool] = None,
) -> None:
    """Reduce every tensor of a dict across ranks with one flattened collective.

    One flat buffer per communication dtype (usually one; an int64 counter does not go through float32), keys
    in one sorted order on every rank; each key is replaced by its reduced tensor in its own dtype, shape and
    device (as in mmengine). Same ops and mean rule as
    [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce]. Verified (the default), the call starts with
    one header round, and bad arguments or dicts that differ make every rank raise before any value moves
    ([`CollectiveMismatch`][hwdist.collectives.verify.CollectiveMismatch] for a mismatch); without
    verification a mismatch is undefined (mmengine's behaviour). ``verify`` must be the same on every rank
    (docs/collectives.md). Non-distributed or a one-rank group: does nothing.

    Args:
        data: ``{key: Tensor}``, updated in place.
        op: the reduce op.
        group: process group.
        verify: False: no header round for this call; True: a header round even while verification is off;
            None: as ``hwdist.verification_enabled()`` says.

    Raises:
        ValueError: unknown ``op``; the dicts differ across ranks, or a value on some rank is not a dense
            tensor with data (verify).
        TypeError: ``data`` is not a dict (on that rank; ValueError on the others), or a value is not a tensor
            (``verify=False``).

    Examples:
        >>> data = {"loss": torch.tensor(1.0 + rank), "n": torch.tensor([2 * rank])}
        >>> # rank 0: {'loss': 1., 'n': [0]}   rank 1: {'loss': 2., 'n': [2]}
        >>> dist.all_reduce_dict(data)
        >>> # rank 0: {'loss': 3., 'n': [2]}   rank 1: {'loss': 3., 'n': [2]}
    """
    problem: Optional[Exception] = None  # a bad op or data: raised here, or on every rank by the check
    try:
        rop = _t.normalize_reduce_op(op, "op", "all_reduce_dict")
    except ValueError as exc:
        problem, rop = exc, "sum"
    if problem is None and type(data) is not dict and not isinstance(data, MutableMapping):
        problem = ArgumentAssertionError(f"data must be a dict of tensors, got {type(data).__name__}")
    state: Optional[_DictState] = None
    if torch_dist.is_initialized():
        # kept by the group object (not None): a default group made by a new init gets new layouts
        st = _state.of(group if group is not None else _compat.default_group())
        state = st.all_reduce_dict
        if state is None:
            state = st.all_reduce_dict = _DictState(torch_dist.get_world_size(group))
    if state is None or state.ws == 1:
        if problem is not None:
            raise type(problem)(f"all_reduce_dict: {problem}")  # this rank alone
        return
    keys: list[Any] = []
    values: list[Any] = []
    layout: Optional[DictLayout] = None
    bufs: Optional[Buffers] = None
    if problem is None:
        keys = sorted_keys(data)
        values = [data[k] for k in keys]
        layout = state.last if values else None  # the dict of the last call
        bufs = layout.try_pack(rop, keys, values) if layout is not None else None
        if values and bufs is None:
            # a bad value: ValueError on every rank when verified, else TypeError on this rank
            kind = ValueError if call_entry.verifying() else TypeError
            try:
                layout = state.layout(group, rop, keys, values, kind)
                bufs = layout.pack(values)
            except (TypeError, ValueError) as exc:  # PlanError is a TypeError
                problem, layout = exc, None
            except (RuntimeError, NotImplementedError) as exc:  # a value torch cannot pack: every rank raises
                problem, layout = kind(f"{type(exc).__name__}: {exc}"), None
    _agree(data, op, problem, group)
    if layout is not None and bufs is not None:
        layout.reduce(bufs, keys, values, data, group, state.ws)
        state.last = layout

