"""``megengine.distributed.helper`` on torch tensors, over hwdist's collectives.

``import hwdist.compat.megengine as helper`` gives MegEngine's parameter
packing (``get_offsets``, ``param_pack_concat``, ``param_pack_split``,
``pack_allreduce_split``) and its fused gradient all-reduce
(``AllreduceCallback`` / ``make_allreduce_cb``: one bucket per dtype, flushed
when it passes 10 MB and at the end of backward, each call returning a future
that holds the reduced gradient once flushed), plus ``synchronized``,
``bcast_list_`` and the fork check. ``group`` is a torch process group
(``WORLD``, i.e. None, for the default group); every all-reduce runs through
[`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce] on the group's driver.

Torch has no ``GradManager``: [`AllreduceCallback.attach`][hwdist.compat.megengine.AllreduceCallback.attach]
plays ``gm.attach(params, callbacks=[cb])``'s part (each parameter's gradient
goes through the callback and its ``.grad`` receives the reduced value when
backward ends).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

import torch
import torch.distributed as torch_dist
from torch import Tensor

import hwdist

from ..errors import ArgumentAssertionError
from ._legacy_common import agree_on_layout

# MegEngine's API shape, mirrored on purpose (like info's and vis4d's): a drop-in must match its original.
__all__ = [
    "WORLD",
    "get_offsets",
    "param_pack_split",
    "param_pack_concat",
    "pack_allreduce_split",
    "TensorFuture",
    "AllreduceCallback",
    "make_allreduce_cb",
    "synchronized",
    "bcast_list_",
    "check_fork_safe",
]

#: The default group (MegEngine's ``WORLD``): every rank.
WORLD: Any = None
"""MegEngine's name for the default group; ``None`` is the default group here."""

#: Bytes a dtype's bucket may hold before it is all-reduced during backward (MegEngine's value).
PACK_THRESHOLD = 10 * 1024 * 1024


def get_offsets(shapes: Sequence[Sequence[int]]) -> list[int]:
    """``[begin0, end0, begin1, end1, ...]`` of tensors of ``shapes`` laid end to end.

    Examples:
        >>> helper.get_offsets([(1,), (3, 3)])
        [0, 1, 1, 10]
    """
    offsets: list[int] = []
    offset = 0
    for shape in shapes:
        offsets.append(offset)
        numel = 1
        for n in shape:
            numel *= int(n)
        offset += numel
        offsets.append(offset)
    return offsets


def _check_offsets(fn: str, offsets: Sequence[int], count: int) -> None:
    if len(offsets) != 2 * count:
        raise ValueError(
            f"{fn}: offsets must hold 2 * {count} = {2 * count} values ([begin0, end0, begin1, end1, ...]),"
            f" got {len(offsets)}"
        )


def param_pack_split(
    inp: Tensor, offsets: Sequence[int], shapes: Sequence[Sequence[int]]
) -> list[Tensor]:
    """Cut a flat tensor into tensors of ``shapes`` at ``offsets`` (views of ``inp``).

    Args:
        inp: a 1-D tensor.
        offsets: ``[begin0, end0, begin1, end1, ...]``, two per output.
        shapes: the outputs' shapes (an empty shape gives ``(1,)``, as in MegEngine).

    Returns:
        One tensor per shape.

    Raises:
        ValueError: ``offsets`` and ``shapes`` do not match, or a range leaves ``inp``.

    Examples:
        >>> b, c = helper.param_pack_split(torch.ones(10, dtype=torch.int32), [0, 1, 1, 10], [(1,), (3, 3)])
        >>> c.shape
        torch.Size([3, 3])
    """
    _check_offsets("param_pack_split", offsets, len(shapes))
    flat = inp.reshape(-1)
    outs = []
    for i, shape in enumerate(shapes):
        begin, end = int(offsets[2 * i]), int(offsets[2 * i + 1])
        if not 0 <= begin <= end <= flat.numel():
            raise ValueError(
                f"param_pack_split: range {i} [{begin}, {end}) is outside the input's {flat.numel()} elements"
            )
        outs.append(flat[begin:end].reshape(tuple(shape) or (1,)))
    return outs


def param_pack_concat(inps: Sequence[Tensor], offsets: Any, offsets_val: Sequence[int]) -> Tensor:
    """Lay ``inps`` into one flat tensor at ``offsets_val`` (MegEngine's packing; gaps are zeros).

    Args:
        inps: tensors of one dtype.
        offsets: ``offsets_val`` as a tensor (MegEngine's device copy; accepted, not needed).
        offsets_val: ``[begin0, end0, begin1, end1, ...]``.

    Returns:
        A 1-D tensor of ``offsets_val[-1]`` elements, on the first input's device.

    Raises:
        ValueError: the offsets do not fit the inputs.
        TypeError: the inputs' dtypes differ.

    Examples:
        >>> a, b = torch.ones(1, dtype=torch.int32), torch.ones(3, 3, dtype=torch.int32)
        >>> helper.param_pack_concat([a, b], torch.tensor([0, 1, 1, 10]), [0, 1, 1, 10])
        tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], dtype=torch.int32)
    """
    _check_offsets("param_pack_concat", offsets_val, len(inps))
    if not inps:
        return torch.zeros(0)
    dtypes = {t.dtype for t in inps}
    if len(dtypes) != 1:
        raise TypeError(
            f"param_pack_concat: the inputs must share one dtype, got {sorted(map(str, dtypes))}"
        )
    out = torch.zeros(int(offsets_val[-1]), dtype=inps[0].dtype, device=inps[0].device)
    for i, t in enumerate(inps):
        begin, end = int(offsets_val[2 * i]), int(offsets_val[2 * i + 1])
        if end - begin != t.numel():
            raise ValueError(
                f"param_pack_concat: input {i} has {t.numel()} elements but its range [{begin}, {end}) holds"
                f" {end - begin}"
            )
        out[begin:end] = t.detach().reshape(-1).to(out.device)
    return out


def pack_allreduce_split(
    pack_list: Sequence[Tensor], shapes: Sequence[Sequence[int]], group: Any, reduce_method: str
) -> list[Tensor]:
    """All-reduce tensors as one packed buffer and cut the result back into ``shapes``.

    Args:
        pack_list: tensors of one dtype (e.g. gradients).
        shapes: their shapes.
        group: the process group (``WORLD``/None: the default group).
        reduce_method: ``'sum'`` or ``'mean'`` (the sum divided by the group's size).

    Returns:
        The reduced tensors, one per shape (new tensors).

    Raises:
        TypeError: an item of ``pack_list`` is not a tensor, or the dtypes differ (every rank); ``group`` is
            not a process group (that rank agrees on the default group, so ranks passing ``WORLD`` raise too).
        ValueError: the tensors do not fit ``shapes``, ``reduce_method`` is neither ``'sum'`` nor
            ``'mean'`` (MegEngine sums for any other value; hwdist refuses it), or the ranks' buffers or
            ``reduce_method`` differ (every rank, before any rank waits in the all-reduce).

    Examples:
        >>> helper.pack_allreduce_split([torch.tensor([rank + 1.0])], [(1,)], None, "mean")
        # rank 0: [tensor([1.5000])]   rank 1: [tensor([1.5000])]
    """
    problem: Optional[Exception] = None
    packed = torch.zeros(0)
    offsets_val: list[int] = []
    if group is not None and not isinstance(group, torch_dist.ProcessGroup):
        # this rank cannot talk on it: it agrees on the default group, where the others (passing WORLD)
        # learn of the error too
        problem = TypeError(
            f"pack_allreduce_split: group must be a torch.distributed.ProcessGroup or None (WORLD), got"
            f" {type(group).__name__}: {group!r}"
        )
        group = None
    try:
        if problem is not None:
            raise problem
        offsets_val = get_offsets(shapes)
        if reduce_method not in ("sum", "mean"):
            raise ValueError(
                f"pack_allreduce_split: reduce_method must be 'sum' or 'mean', got {reduce_method!r}"
            )
        for i, t in enumerate(pack_list):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"pack_allreduce_split: pack_list[{i}] must be a torch.Tensor, got {type(t).__name__}"
                )
        packed = param_pack_concat(pack_list, torch.tensor(offsets_val), offsets_val)
    except (TypeError, ValueError) as exc:
        problem = exc
    if hwdist.is_distributed() and hwdist.get_world_size(group) > 1:
        layout = f"{offsets_val[-1] if offsets_val else 0}:{packed.dtype}:{reduce_method}"
        agree_on_layout(
            "pack_allreduce_split", group, problem, layout,
            "the ranks' packed buffers differ in size or dtype, or their reduce_method differs; every rank"
            " must pass tensors of the same shapes and dtype, and the same reduce_method",
        )
    elif problem is not None:
        raise problem
    hwdist.all_reduce(packed, "sum", group)
    if reduce_method == "mean":
        packed = packed / hwdist.get_world_size(group)
    return param_pack_split(packed, offsets_val, shapes)


class TensorFuture:
    """A gradient that is not reduced yet: ``get()`` returns it once the callback has flushed.

    MegEngine's future blocks in ``get()``; this one raises instead, since in
    a single-threaded torch program nothing could set it while ``get()`` waits.
    """

    def __init__(self, ack: bool = True) -> None:
        self._ready = threading.Event()
        self._value: Any = None
        self.ack = ack

    def set(self, value: Any) -> None:
        """Resolve the future."""
        self._value = value
        self._ready.set()

    def get(self) -> Any:
        """The reduced gradient.

        Raises:
            RuntimeError: not flushed yet (the callback flushes when backward ends).
        """
        if not self._ready.is_set():
            raise RuntimeError(
                "TensorFuture.get: this tensor is not ready; the all-reduce callback resolves it when"
                " backward ends"
            )
        return self._value

    def _not_ready(self) -> Any:
        raise RuntimeError(
            "Sorry, this tensor is not ready (the all-reduce callback has not flushed yet)"
        )

    def device(self) -> Any:
        """Raises: the tensor is not ready (as in MegEngine)."""
        return self._not_ready()

    def numpy(self) -> Any:
        """Raises: the tensor is not ready (as in MegEngine)."""
        return self._not_ready()

    def shape(self) -> Any:
        """Raises: the tensor is not ready (as in MegEngine)."""
        return self._not_ready()

    def dtype(self) -> Any:
        """Raises: the tensor is not ready (as in MegEngine)."""
        return self._not_ready()


def _queue_after_backward(callback: Callable[[], None]) -> bool:
    """Run ``callback`` when the current backward pass ends; False outside backward."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(callback)  # type: ignore[attr-defined]
    except RuntimeError:  # "Final callbacks can only be installed during backward pass"
        return False
    return True


class AllreduceCallback:
    """Fused all-reduce of gradients: one bucket per dtype, flushed at 10 MB and when backward ends.

    Each call ``cb(param, grad)`` (made during backward) files ``grad`` into
    its dtype's bucket and returns a [`TensorFuture`][hwdist.compat.megengine.TensorFuture].
    A bucket holding more than 10 MB is all-reduced at once (as one packed
    tensor); when the backward pass ends, the remaining buckets are reduced
    (dtypes in sorted order, so every rank runs the same collectives) and every
    future gets its reduced gradient, on the gradient's own device.

    Args:
        reduce_method: ``'sum'`` or ``'mean'`` (any case).
        group: the process group (``WORLD``: the default group).
        backend: MegEngine's backend override; accepted and recorded. The
            group's own driver runs the all-reduce (a torch group has one backend).

    Raises:
        AssertionError: ``reduce_method`` is neither, or no process group exists
            (as MegEngine's ``assert``s).

    Examples:
        >>> cb = helper.make_allreduce_cb("mean")
        >>> cb.attach(model.parameters())
        >>> model(x).sum().backward()     # each .grad is the mean over the ranks
    """

    def __init__(self, reduce_method: str, group: Any = WORLD, backend: Optional[str] = None) -> None:
        reduce_method = reduce_method.lower()
        if reduce_method not in ("sum", "mean"):
            raise ArgumentAssertionError(
                f"AllreduceCallback: reduce_method should be sum or mean, got {reduce_method!r}"
            )
        self._reduce_method = reduce_method
        self._group = group
        self._param_pack_thd = PACK_THRESHOLD
        self._attached: dict[int, Tensor] = {}
        self._queued = False
        self._reset()
        if backend is None:
            if not hwdist.is_distributed():
                raise ArgumentAssertionError(
                    "AllreduceCallback: please call init_process_group first (hwdist.init_dist(...))"
                )
            backend = hwdist.get_driver(group).name
        self._backend = backend

    def _reset(self) -> None:
        self._params: list[Tensor] = []
        self._gradients_dict: dict[Tensor, Tensor] = {}
        self._futures_dict: dict[Tensor, TensorFuture] = {}
        self._packing_list: defaultdict[str, list[Tensor]] = defaultdict(list)
        self._packing_size: defaultdict[str, int] = defaultdict(int)
        self._grad_origin_device: dict[Tensor, torch.device] = {}

    def _pack(self, dtype: str) -> None:
        if not self._packing_list[dtype]:
            return
        params = self._packing_list[dtype]
        grads = [self._gradients_dict[p] for p in params]
        reduced = pack_allreduce_split(
            grads, [tuple(p.shape) for p in params], self._group, self._reduce_method
        )
        for param, grad in zip(params, reduced):
            self._gradients_dict[param] = grad
        self._packing_list[dtype] = []
        self._packing_size[dtype] = 0

    def __call__(self, param: Tensor, grad: Tensor) -> TensorFuture:
        """File ``param``'s gradient ``grad``; returns its future (resolved when backward ends).

        Raises:
            AssertionError: called outside a backward pass (MegEngine asserts a
                backwarding ``GradManager``).
        """
        if not self._queued:
            if not _queue_after_backward(self._flush):
                raise ArgumentAssertionError(
                    "AllreduceCallback: call it during backward (from a gradient hook, e.g. through"
                    " AllreduceCallback.attach(params)); it flushes when the backward pass ends"
                )
            self._queued = True
        self._params.append(param)
        future = self._futures_dict[param] = TensorFuture(ack=False)
        self._gradients_dict[param] = grad
        self._grad_origin_device[param] = grad.device
        dtype = str(param.dtype)
        self._packing_list[dtype].append(param)
        self._packing_size[dtype] += param.numel() * param.element_size()
        if self._packing_size[dtype] > self._param_pack_thd:
            self._pack(dtype)
        return future

    def _flush(self) -> None:
        self._queued = False
        for dtype in sorted(self._packing_list.keys()):
            self._pack(dtype)
        for param in self._params:
            grad = self._gradients_dict[param].to(self._grad_origin_device[param])
            self._futures_dict[param].set(grad)
            if id(param) in self._attached:
                with torch.no_grad():
                    if param.grad is None:
                        param.grad = grad.clone()
                    else:
                        param.grad.add_(grad)
        self._reset()

    def attach(self, params: Iterable[Tensor]) -> None:
        """Send every gradient of ``params`` through this callback (``gm.attach(params, callbacks=[cb])``).

        After each backward pass, each parameter's ``.grad`` has received the
        reduced gradient (added to what it held, as gradients accumulate).
        Every rank must attach the same parameters in the same order.
        """
        for p in params:
            if not p.requires_grad or id(p) in self._attached:
                continue
            self._attached[id(p)] = p
            p.register_hook(self._hook_for(p))

    def _hook_for(self, p: Tensor) -> Callable[[Tensor], Tensor]:
        def hook(grad: Tensor) -> Tensor:
            self(p, grad)
            return torch.zeros_like(grad)  # nothing unreduced accumulates; _flush adds the reduced value

        return hook


make_allreduce_cb = AllreduceCallback
"""MegEngine's factory name for [`AllreduceCallback`][hwdist.compat.megengine.AllreduceCallback]."""


F = TypeVar("F", bound=Callable[..., Any])


def synchronized(func: F) -> F:
    """Decorator: run the function, then wait until every rank has run it (no-op when not distributed).

    Examples:
        >>> @helper.synchronized
        ... def save(): ...
    """
    return hwdist.synchronized(func)  # type: ignore[no-any-return]


def bcast_list_(inps: list[Tensor], group: Any = WORLD) -> None:
    """Overwrite every tensor of ``inps`` with its value on the group's first rank, in place.

    Examples:
        >>> ps = [torch.tensor([float(rank)])]
        >>> helper.bcast_list_(ps)
        # rank 0: [tensor([0.])]   rank 1: [tensor([0.])]
    """
    src = 0
    if group is not None and hwdist.is_distributed():
        src = torch_dist.get_global_rank(group, 0)
    hwdist.bcast_list_(inps, src, group)


def check_fork_safe(start_method: Optional[str] = None) -> None:
    """Raise if workers started with ``fork`` would inherit an initialised device.

    hwdist's [`check_fork_safe`][hwdist.training.check_fork_safe], the
    counterpart of MegEngine's check that the device was not initialised
    before its workers fork.
    """
    hwdist.check_fork_safe(start_method)
