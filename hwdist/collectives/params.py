"""Many tensors in few collectives: metric dicts and model parameters.

Both functions pack their tensors into flat buffers (hwdist.collectives.flat),
one per communication dtype, so a dict of twenty metrics or a whole model
costs about one all_reduce. Dispatch goes through the group's driver exactly
as in [`hwdist.collectives.tensor`][hwdist.collectives.tensor].
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import MutableMapping
from typing import Any, Iterable, Optional

import torch
import torch.distributed as torch_dist

from .. import _compat, registry
from .. import verify as _verify_mode
from ..drivers.base import Plan, Post
from ..errors import ArgumentAssertionError
from . import _layouts, _transport
from ._calls import collective
from . import tensor as _t
from .flat import FlatLayout, bucket_tensors, copy_from_flat, flatten_tensors, unique_tensors

__all__ = ["all_reduce_dict", "all_reduce_params"]

Tensor = torch.Tensor


def _key_order(key: Any) -> tuple[str, str]:
    # str keys sort as sorted() does; other hashable keys sort deterministically.
    return ("", key) if isinstance(key, str) else (type(key).__name__, repr(key))


def _describe(keys: list[Any], data: Any) -> list[tuple[str, tuple[int, ...], str]]:
    return [(repr(k), tuple(data[k].shape), str(data[k].dtype).replace("torch.", "")) for k in keys]


def _fingerprint(desc: list[tuple[str, tuple[int, ...], str]]) -> tuple[int, int]:
    digest = hashlib.blake2b(repr(desc).encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little") >> 1, int.from_bytes(digest[4:], "little") >> 1


_FINGERPRINTS: dict[tuple[Any, ...], tuple[int, int]] = {}


def _layout_fingerprint(keys: list[Any], data: Any, op: Optional[str] = None) -> tuple[int, int]:
    """The fingerprint of keys, shapes, dtypes and op (cached: metric dicts repeat every step)."""
    sig = _layouts.signature(op, keys, [data[k] for k in keys])  # type: ignore[arg-type]
    found = _FINGERPRINTS.get(sig)
    if found is None:
        if len(_FINGERPRINTS) > 256:
            _FINGERPRINTS.clear()
        desc: Any = _describe(keys, data)
        found = _FINGERPRINTS[sig] = _fingerprint(desc if op is None else [("op", (), op), *desc])
    return found


def _verify(
    keys: list[Any],
    data: Any,
    problem: Optional[str],
    group: Any,
    driver: Any,
    ws: int,
    op: Optional[str] = None,
    kind: type[Exception] = ValueError,
) -> None:
    """One small max/min of [error, f] proves every rank holds the same dict layout (and op).

    This is how a bad argument on ONE rank (``problem``, found before any
    communication) reaches every rank: each rank joins this exchange with its
    error flag instead of raising alone. On a mismatch every rank sees the
    same reduced values and raises (``kind`` where this rank's own argument
    was bad, else ValueError); the descriptions are then exchanged (error
    path only) to name the difference.
    """
    if driver is None:
        driver = registry.resolve(group, None)
    f0, f1 = _layout_fingerprint(keys, data, op) if problem is None else (0, 0)
    highest, lowest = _transport.max_and_min([int(problem is not None), f0, f1], group, ws, driver)
    if highest[0] == 0 and highest[1:] == lowest[1:]:
        return
    text = ("ERROR " + problem) if problem is not None else repr([op, _describe(keys, data)])
    payload = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).to(driver.comm_device())
    texts = [bytes(t.cpu().tolist()).decode() for t in _t.all_gather(payload, group)]
    what = "keys, shapes and dtypes" if op is None else "keys, shapes, dtypes and op"
    explained = _explain(texts)
    if not any(t.startswith("ERROR ") for t in texts):
        explained += f"; every rank must pass the same {what}"
    raise (kind if problem is not None else ValueError)("all_reduce_dict: " + explained)


def _explain(texts: list[str]) -> str:
    errors = [f"rank {r}: {t[6:]}" for r, t in enumerate(texts) if t.startswith("ERROR ")]
    if len(errors) == len(texts) and len(set(texts)) == 1:
        return texts[0][6:]  # the same bad argument on every rank: no rank list needed
    if errors:
        return "; ".join(errors)
    import ast

    parsed = [ast.literal_eval(t) for t in texts]
    ops = [op for op, _ in parsed]
    descs = [{k: (s, d) for k, s, d in desc} for _, desc in parsed]
    ref = descs[0]
    parts = []
    for r, other in enumerate(descs[1:], start=1):
        if ops[r] != ops[0]:
            parts.append(f"op is '{ops[0]}' on rank 0 but '{ops[r]}' on rank {r}")
        missing = sorted(set(ref) - set(other))
        extra = sorted(set(other) - set(ref))
        if missing:
            parts.append(f"rank {r} lacks keys {', '.join(missing)} that rank 0 has")
        if extra:
            parts.append(f"rank {r} has extra keys {', '.join(extra)}")
        for k in sorted(set(ref) & set(other)):
            if ref[k][0] != other[k][0]:
                parts.append(f"key {k} has shape {ref[k][0]} on rank 0 but {other[k][0]} on rank {r}")
            if ref[k][1] != other[k][1]:
                parts.append(f"key {k} has dtype {ref[k][1]} on rank 0 but {other[k][1]} on rank {r}")
    return "; ".join(parts) or "the ranks' dicts differ"


def _verify_dict_call(data: Any, op: Any, group: Any) -> None:
    """Verification mode: every rank passes the same keys, shapes, dtypes and op (one digest exchange)."""
    if isinstance(data, MutableMapping):
        try:
            keys = sorted(data)
        except TypeError:
            keys = sorted(data, key=_key_order)
        fields: Any = {repr(k): _verify_mode.describe_tensor(data[k]) for k in keys}
        first = next((v for v in data.values() if isinstance(v, torch.Tensor)), None)
    else:
        fields, first = type(data).__name__, None
    driver = registry.resolve(group, first.device if first is not None else None)
    _verify_mode.check_call("all_reduce_dict", group, driver, data=fields, reduce_op=_t._op_field(op))


@collective(2)
def all_reduce_dict(data: MutableMapping, op: _t.ReduceOpLike = "sum", group: Optional[Any] = None, *, verify: bool = True) -> None:
    """Reduce every tensor of a dict across ranks with one flattened collective.

    Keys are processed in sorted order. Tensors are packed into one flat
    buffer per communication dtype (usually exactly one: all float32 metrics
    travel together); mixed dtypes are never merged lossily (an int64 counter
    does not go through float32). Each key is replaced by its reduced tensor
    in the key's own dtype, shape and device (as in mmengine). Same ops and
    mean rule as [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce].

    With ``verify=True`` (default) every rank checks that all ranks hold the
    same keys, shapes, dtypes and op; on a mismatch or a bad value on any
    rank, every rank raises ValueError naming the difference (e.g. "rank 1
    lacks keys 'b'"), instead of hanging or mixing up values. The check costs
    no extra collective once the ranks have agreed on a layout: the first
    call with a layout runs one small all_reduce (a fingerprint) before the
    data; later calls whose layout every rank can predict (the same dict as
    last time, or the one that followed it last time) carry a one-element
    "matches" flag inside the data buffer instead. When the flag says some
    rank's dict changed, the result is dropped and the checked path runs
    (three collectives on that call). See ``docs/collectives.md``.
    Every value is checked (a tensor, dense, not meta) and ``op`` and
    ``data`` too before any communication; with ``verify=True`` a bad one on
    ONE rank makes every rank raise. ``verify=False`` skips every check
    (mmengine's behaviour: a mismatch is then undefined, and a bad value
    raises on its own rank only, before that rank communicates). In
    verification mode ([`hwdist.verification`][hwdist.verify.verification], ``HWDIST_DEBUG=1``) the mode's digest exchange checks keys, shapes,
    dtypes and ``op`` whatever ``verify`` says and replaces this check; a
    mismatch raises [`hwdist.CollectiveMismatch`][hwdist.verify.CollectiveMismatch] (a ValueError).
    ``verify`` must be the same on every rank.

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
    if _verify_mode._enabled and torch_dist.is_initialized():
        _verify_dict_call(data, op, group)  # a sparse or meta value, a bad op or type on one rank differ here
    checked = verify and not _verify_mode._enabled
    bad: Optional[Exception] = None  # a bad op or data: raised here, or on every rank by the check below
    try:
        rop = _t.normalize_reduce_op(op)
    except ValueError as exc:
        bad, rop = exc, "sum"
    if bad is None and type(data) is not dict and not isinstance(data, MutableMapping):
        bad = ArgumentAssertionError(f"all_reduce_dict: data must be a dict of tensors, got {type(data).__name__}")  # noqa: E501
    ws = 1
    if torch_dist.is_initialized():
        hist = _layouts.history(group if group is not None else _compat.default_group())
        ws = hist.ws
    if bad is not None and (not checked or ws == 1):
        raise bad
    if ws == 1:
        return
    if bad is not None:  # join what the other ranks run, so that every rank raises, not only this one
        predicted = hist.predicted
        if predicted is not None and predicted.flag is not None:
            _mismatch_call(predicted, group, ws)  # they run the predicted call first: "no match" from here
        text = str(bad).replace("all_reduce_dict: ", "", 1)
        _verify([], {}, text, group, None, ws, rop, kind=type(bad))
    try:
        keys = sorted(data)
    except TypeError:  # keys of mixed types: still one order on every rank
        keys = sorted(data, key=_key_order)
    values = [data[k] for k in keys]
    if checked:
        predicted = hist.predicted
        if predicted is not None and predicted.flag is not None:  # shared state: the same branch on every rank
            call = _stacked_call if predicted.stack else _predicted_call
            if call(predicted, rop, keys, values, data, group, ws):
                hist.agreed(predicted)
                return
            # some rank's dict is not the predicted one: every rank saw the same flag; check properly
    elif not verify and not _verify_mode._enabled:
        recent = hist.unchecked  # this rank's own last layout: a local shortcut, no shared state
        if recent is not None and recent.stack and _stacked_call(recent, rop, keys, values, data, group, ws, False):
            return
    problem = _value_problem(keys, values)  # every value checked before any communication
    sig = _layouts.signature(rop, keys, values) if problem is None else None
    layout = None
    driver = None
    if sig is not None and values:
        driver = registry.resolve(group, values[0].device)
        layout = _layouts.cached(sig, driver, values[0].device.type, ws)
    plans: dict[torch.dtype, Plan] = {}
    if layout is None:
        driver = registry.resolve(group, values[0].device if values and problem is None else None)
        if problem is None:
            try:
                for v in values:
                    if v.dtype not in plans:
                        plans[v.dtype] = driver.plan("all_reduce", v.dtype, rop)
            except (TypeError, ValueError) as exc:  # PlanError is a TypeError
                problem = f"{type(exc).__name__}: {exc}"
    if _verify_mode._enabled:  # the layouts agree (checked above): a problem is the same on every rank
        if problem is not None:
            raise (ValueError if verify else TypeError)(f"all_reduce_dict: {problem}")
    elif verify:
        _verify(keys, data, problem, group, driver, ws, rop)
    elif problem is not None:
        raise TypeError(f"all_reduce_dict: {problem}")
    if not keys:
        return
    if layout is None:
        assert sig is not None
        layout = _layouts.build(sig, driver, values[0].device.type, plans, ws)
    bufs, stacked = _pack(layout, values, layout.driver.comm_device(), 0)
    _reduce(layout, bufs, group, ws)
    _finish(layout, bufs, stacked, keys, values, data, ws)
    if checked:
        hist.agreed(layout)
    elif not verify:
        hist.unchecked = layout


def _mismatch_call(layout: _layouts.DictLayout, group: Any, ws: int) -> None:
    """Take part in a predicted call with zeros and a "does not match" flag (this rank's arguments are bad)."""
    if layout.stack:
        _stacked_call(layout, "", [], [], {}, group, ws)  # no values: it sends the mismatch row
    else:
        assert layout.flag is not None
        bufs, _ = _pack(layout, None, layout.driver.comm_device(), layout.flag.mismatch)
        _reduce(layout, bufs, group, ws)


def _value_problem(keys: list[Any], values: list[Any]) -> Optional[str]:
    """What is wrong with the first bad value (not a tensor, sparse, meta), or None."""
    for k, v in zip(keys, values):
        if not isinstance(v, torch.Tensor):
            return f"data[{k!r}] must be a torch.Tensor, got {type(v).__name__}"
        if v.layout is not torch.strided:
            return f"data[{k!r}] must be a dense (strided) tensor, got a {str(v.layout).replace('torch.', '')} tensor"
        if v.is_meta:
            return f"data[{k!r}] is a meta tensor: it has no values to reduce"
    return None


def _stacked_call(
    layout: _layouts.DictLayout,
    rop: str,
    keys: list[Any],
    values: list[Any],
    data: Any,
    group: Any,
    ws: int,
    check: bool = True,
) -> bool:
    """[`_predicted_call`][hwdist.collectives.params._predicted_call] for a layout of one dtype and one shape: one ``torch.stack``, flag row last.

    ``check=False`` (``verify=False``): returns False without communicating when this rank's dict
    does not fit ``layout``, and ignores the flag.
    """
    flag = layout.flag
    flat = None
    try:
        first = values[0]
        on_cpu = first.is_cpu
        if (
            rop == layout.sig[0]
            and keys == layout.keys
            and {v.dtype for v in values} == layout.dtypes  # stack would promote a stray int silently
            and (on_cpu if layout.device_type == "cpu" else first.device.type == layout.device_type)
        ):
            row = layout.cpu_row if on_cpu else layout.flag_tensor(first.device, layout.row_value)
            flat = torch.stack([*values, row])
            if (flat.dim() != 1) if layout.scalar else (flat.shape[1:] != layout.shape):
                flat = None
            elif flat.layout is not torch.strided:  # sparse values stack into a sparse tensor
                flat = None
    except (AttributeError, IndexError, RuntimeError, TypeError):  # empty, not tensors, shapes or devices differ
        flat = None
    if flat is None:
        if not check or flag is None:
            return False
        cdev = layout.driver.comm_device()
        flat = torch.zeros((len(layout.keys) + 1, *layout.shape), dtype=layout.dtype, device=cdev)
        flat[-1] = flag.mismatch
    else:
        if flat.requires_grad:
            flat = flat.detach()
        if not (layout.cpu and flat.is_cpu):
            cdev = layout.driver.comm_device()
            if flat.device != cdev:
                flat = flat.to(cdev)
    _transport.reduce_buffer(flat, layout.reduce_name, group, ws, layout.driver)
    if check and not flag.ok(_last_value(flat)):  # type: ignore[union-attr]
        return False
    if layout.divide:
        _t._divide(flat, ws)
    home = values[0]
    if not (on_cpu and flat.is_cpu) and flat.device != home.device:
        flat = flat.to(home.device)
    for k, piece in zip(keys, flat.unbind(0)):  # the last row (the flag) has no key
        data[k] = piece
    return True


def _predicted_call(
    layout: _layouts.DictLayout, rop: str, keys: list[Any], values: list[Any], data: Any, group: Any, ws: int
) -> bool:
    """One collective in the predicted layout, flag included; True (and ``data`` updated) if every rank matched."""
    flag = layout.flag
    assert flag is not None
    sig = _layouts.signature(rop, keys, values)
    # a device of another type may belong to another driver (mixed backends): count it as a mismatch
    match = sig == layout.sig and values[0].device.type == layout.device_type
    bufs: Any = None
    if match:
        try:
            bufs, stacked = _pack(layout, values, layout.driver.comm_device(), flag.match)
        except (RuntimeError, NotImplementedError, TypeError):  # a sparse or meta value: this rank does not match
            bufs = None
    if bufs is None:  # the checked path that follows names the bad value on every rank
        bufs, stacked = _pack(layout, None, layout.driver.comm_device(), flag.mismatch)
    _reduce(layout, bufs, group, ws)
    if not flag.ok(_last_value(bufs[0][1])):
        return False
    _finish(layout, bufs, stacked, keys, values, data, ws)
    return True


def _last_value(buf: Tensor) -> Any:
    """The buffer's last element (where the flag ends up) as a Python number."""
    return (buf[-1] if buf.dim() == 1 else buf.reshape(-1)[-1]).item()


def _pack(
    layout: _layouts.DictLayout, values: Optional[list[Tensor]], cdev: torch.device, flag: int
) -> tuple[list[tuple[Tensor, Tensor]], bool]:
    """The layout's buffers ``[(flat, wire)]`` holding ``values`` (zeros if None) and ``flag``; and whether stacked."""
    if layout.stack and values is not None:
        try:
            flat = torch.stack([*values, layout.flag_tensor(values[0].device, flag)])
        except RuntimeError:  # values on several devices: pack them one by one below
            pass
        else:
            if flat.requires_grad:
                flat = flat.detach()
            if flat.device != cdev:
                flat = flat.to(cdev)
            return [(flat, flat)], True
    with torch.no_grad():
        bufs = []
        for part in layout.parts:
            fl = part.layout
            total = fl.total
            if values is None:
                flat = torch.zeros(total + part.extra, dtype=part.pack_dtype, device=cdev)
            else:
                flat = torch.empty(total + part.extra, dtype=part.pack_dtype, device=cdev)
                body = flat[:total]
                members = [values[i] for i in part.idx]
                if all(m.device == cdev for m in members):
                    torch.cat([m.reshape(-1) for m in members], out=body)  # casts into pack_dtype
                else:
                    for m, off, n in zip(members, fl.offsets, fl.numels):
                        body[off : off + n].copy_(m.reshape(-1))
                if part.extra:
                    flat[total:].zero_()
            wire = flat.view(part.plan.comm_dtype) if part.plan.view else flat
            if part.extra:
                wire[-1] = flag
            bufs.append((flat, wire))
    return bufs, False


def _reduce(layout: _layouts.DictLayout, bufs: list[tuple[Tensor, Tensor]], group: Any, ws: int) -> None:
    for part, (_, wire) in zip(layout.parts, bufs):
        _transport.reduce_buffer(wire, part.plan.reduce_op or "sum", group, ws, layout.driver)


def _finish(
    layout: _layouts.DictLayout,
    bufs: list[tuple[Tensor, Tensor]],
    stacked: bool,
    keys: list[Any],
    values: list[Tensor],
    data: Any,
    ws: int,
) -> None:
    """Mean's division, then each key replaced by its reduced value (own dtype, shape and device)."""
    for part, (_, wire) in zip(layout.parts, bufs):
        if part.plan.post is Post.DIVIDE:
            _t._divide(wire, ws)
    if stacked:
        flat = bufs[0][0]
        if flat.device != values[0].device:
            flat = flat.to(values[0].device)
        for k, piece in zip(keys, flat.unbind(0)):  # the last row (the flag) has no key
            data[k] = piece
        return
    for part, (flat, _) in zip(layout.parts, bufs):
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


MiB = 1024 * 1024


def _mib(value: Any, argname: str, fn: str) -> int:
    """A size in MiB as bytes (``<= 0`` -> -1); TypeError for anything but a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{fn}: {argname} must be a number of MiB, got {value!r}")
    return int(value * MiB) if value > 0 else -1


@collective(4)
def all_reduce_params(
    params: Iterable[Tensor],
    coalesce: bool = True,
    bucket_size_mb: float = -1,
    op: _t.ReduceOpLike = "sum",
    group: Optional[Any] = None,
) -> None:
    """All-reduce parameters (or buffers, or any tensors) in place.

    ``coalesce=True`` packs the tensors into flat buffers, one per dtype (and
    device), split into buckets of at most ``bucket_size_mb`` MiB when it is
    positive, and reduces each buffer with one all_reduce; buckets are issued
    asynchronously so packing the next one overlaps the communication of the
    previous. Tensors of at least the driver's ``pack_max_bytes`` (1 MiB on
    CPU backends, where a packing copy costs as much as the wire; 0 = pack
    everything on accelerators) are reduced in place, asynchronously,
    instead of being copied. Results are written back into the tensors (``.data``, so
    parameters that require grad work). ``coalesce=False`` runs one
    [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce] per tensor. Same ops, casts and mean rule as
    [`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce]. Every rank must pass the same tensors (shapes,
    dtypes, order). A tensor given twice (``[p, p]``, or tied weights seen
    twice through ``state_dict().values()``) is reduced once.
    Non-distributed or a one-rank group: does nothing.

    Args:
        params: a list or generator of tensors (e.g. ``model.parameters()``).
        coalesce: pack into flat buffers (default) or reduce one by one.
        bucket_size_mb: bucket limit in MiB; ``<= 0``: one bucket per dtype.
        op: the reduce op.
        group: process group.

    Raises:
        TypeError: an item of ``params`` is not a tensor, or
            ``bucket_size_mb`` is not a number (on every rank).

    Examples:
        >>> params = [torch.tensor([1.0, 2.0]) + rank, torch.tensor([3.0]) + rank]
        >>> # rank 0: [1., 2.], [3.]   rank 1: [2., 3.], [4.]
        >>> dist.all_reduce_params(params)
        >>> # rank 0: [3., 5.], [7.]   rank 1: [3., 5.], [7.]
    """
    items = params if isinstance(params, (list, tuple)) else list(params)
    if _verify_mode._enabled and torch_dist.is_initialized():
        first = next((p for p in items if isinstance(p, torch.Tensor)), None)
        _verify_mode.check_call(
            "all_reduce_params",
            group,
            registry.resolve(group, first.device if first is not None else None),
            params=[_verify_mode.describe_tensor(p) for p in items],
            reduce_op=_t._op_field(op),
            coalesce=bool(coalesce),
            bucket_size_mb=bucket_size_mb,
        )
    rop = _t.normalize_reduce_op(op)
    bucket_bytes = _mib(bucket_size_mb, "bucket_size_mb", "all_reduce_params")
    tensors: list[Tensor] = []
    for i, p in enumerate(items):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"all_reduce_params: params[{i}] must be a torch.Tensor, got {type(p).__name__}")
        if p.layout is not torch.strided:
            _t._not_dense(p, f"params[{i}]", "all_reduce_params")
        tensors.append(p.data)
    if not torch_dist.is_initialized() or not tensors:
        return
    # a tensor given twice (or tied weights from state_dict().values()) is reduced once
    tensors = unique_tensors(tensors, same_memory=True)
    ws = torch_dist.get_world_size(group)
    if ws == 1:
        return
    if not coalesce:
        for t in tensors:
            _t.all_reduce(t, rop, group)
        return
    driver = registry.resolve(group, tensors[0].device)
    cdev = driver.comm_device()
    # Big tensors go as they are (asynchronously) where the driver says packing costs more than it saves.
    limit = int(getattr(driver, "pack_max_bytes", 0) or 0)
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
    use_async = driver.supports_async
    handles = [_t.all_reduce(t, rop, group, async_op=True) for t in direct]
    pending: list[tuple[Any, Tensor, Tensor, Plan, list[Tensor], FlatLayout]] = []
    for bucket, plan in zip(buckets, plans):
        members = [packed[i] for i in bucket]
        if plan.view:
            flat, layout = flatten_tensors(members, device=cdev)
            wire = flat.view(plan.comm_dtype)
        else:
            flat, layout = flatten_tensors(members, dtype=plan.comm_dtype, device=cdev)
            wire = flat
        work = torch_dist.all_reduce(wire, _t._torch_op(plan), group, use_async)
        pending.append((work, flat, wire, plan, members, layout))
    for work, flat, wire, plan, members, layout in pending:
        if use_async:
            work.wait()
        if plan.post is Post.DIVIDE:
            _t._divide(wire, ws)
        copy_from_flat(flat, members, layout)
    for h in handles:
        h.wait()

