"""Training-loop helpers: gradient, parameter, buffer and metric synchronisation.

Everything here dispatches through the group's driver like the collectives
([`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce], [`hwdist.broadcast`][hwdist.collectives.tensor.broadcast]), packs many tensors with
[`hwdist.collectives.flat`][hwdist.collectives.flat], and validates its input so that a bad or
mismatched argument raises on *every* rank (one tiny check collective) instead
of leaving the others waiting. See docs/training.md.

Helpers from the prior art: MegEngine ([`GradientSynchronizer`][hwdist.training.GradientSynchronizer],
[`bcast_list_`][hwdist.training.bcast_list_], [`synchronized`][hwdist.training.synchronized], [`check_fork_safe`][hwdist.training.check_fork_safe]), demucs'
``distrib.py`` ([`sync_grad`][hwdist.training.sync_grad], [`broadcast_tensors`][hwdist.training.broadcast_tensors],
[`sync_buffer`][hwdist.training.sync_buffer], [`average_metrics`][hwdist.training.average_metrics], ``rank``/``world_size``) and
vis4d ([`synchronize`][hwdist.training.synchronize], [`is_module_wrapper`][hwdist.training.is_module_wrapper]; ``rank_zero_only`` and
``get_local_rank`` live in [`hwdist.info`][hwdist.info]).

Examples:
    Data-parallel training without ``DistributedDataParallel``:

    >>> sync = hwdist.GradientSynchronizer(model.parameters())  # collective: checks and broadcasts
    >>> for x, y in loader:
    ...     opt.zero_grad(set_to_none=True)
    ...     loss_fn(model(x), y).backward()   # buckets are all-reduced while backward runs
    ...     sync.wait()                       # every .grad now holds the mean over ranks
    ...     opt.step()
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar, overload

import torch
import torch.distributed as torch_dist

from . import _compat, registry
from .collectives import tensor as _t
from .collectives.flat import FlatLayout, bucket_tensors, copy_from_flat, flatten_tensors, unflatten_tensors, unique_tensors
from .collectives.params import _fingerprint, _mib, _verify, all_reduce_dict, all_reduce_params
from .info import barrier, get_rank, get_world_size, is_distributed

__all__ = [
    "GradientSynchronizer",
    "sync_grad",
    "broadcast_tensors",
    "bcast_list_",
    "sync_buffer",
    "average_metrics",
    "synchronized",
    "synchronize",
    "check_fork_safe",
    "is_module_wrapper",
    "rank",
    "world_size",
]

Tensor = torch.Tensor
F = TypeVar("F", bound=Callable[..., Any])
MiB = 1024 * 1024

#: Bucket limit for flattened broadcasts (bcast_list_, broadcast_tensors, sync_buffer).
_BROADCAST_BUCKET_BYTES = 32 * MiB
_ERROR_CODES: dict[type, int] = {TypeError: 1, ValueError: 2}
_CODE_ERRORS = {1: TypeError, 2: ValueError}

rank = get_rank
"""Alias of [`hwdist.get_rank`][hwdist.info.get_rank] (demucs' ``distrib.rank()``)."""
world_size = get_world_size
"""Alias of [`hwdist.get_world_size`][hwdist.info.get_world_size] (demucs' ``distrib.world_size()``)."""


# ---------------------------------------------------------------------------
# one tiny collective that makes bad or mismatched input fail on every rank
# ---------------------------------------------------------------------------
def _describe(tensors: Sequence[Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    return [("", tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in tensors]


def _agree(
    fn: str,
    tensors: Sequence[Tensor],
    group: Any,
    *,
    problem: Optional[Exception] = None,
    flag: int = 0,
    config: Optional[dict[str, Any]] = None,
) -> int:
    """Check that every rank holds the same number, shapes and dtypes of ``tensors`` (and ``config``).

    One all_reduce(MAX) of 10 int32 values: an error code, the count, a
    62-bit fingerprint of shapes and dtypes and a 31-bit one of ``config``
    (arguments that decide the collectives, e.g. the bucket sizes), each also
    negated (MAX of -x is -MIN), and ``flag``. When a rank's input was
    invalid (``problem``) or the layouts differ, every rank raises. Returns
    the MAX of ``flag`` over the ranks. Needs an initialised process group.
    """
    dev = tensors[0].device if tensors and problem is None else None
    driver = registry.resolve(group, dev)
    if problem is None:
        n = len(tensors)
        f0, f1 = _fingerprint(_describe(tensors))
        c = _fingerprint([(repr(sorted((config or {}).items())), (), "")])[0]
        err = 0
    else:
        n = f0 = f1 = c = 0
        err = _ERROR_CODES.get(type(problem), 2)
    vec = torch.tensor([err, n, -n, f0, f1, -f0, -f1, c, -c, int(flag)], dtype=torch.int32, device=driver.comm_device())
    _t.all_reduce(vec, "max", group)
    err_max, nmax, nmin_neg, mx0, mx1, mn0_neg, mn1_neg, cmax, cmin_neg, flag_max = (int(v) for v in vec.tolist())
    if problem is not None:
        raise problem
    me = torch_dist.get_rank()
    if err_max:
        raise _CODE_ERRORS.get(err_max, ValueError)(
            f"{fn}: the arguments given on another rank were invalid (see the error raised there);"
            f" rank {me} stops too so that no rank waits forever"
        )
    if nmax != -nmin_neg:
        raise ValueError(
            f"{fn}: every rank must pass the same number of tensors; rank {me} passed {n},"
            f" the ranks passed between {-nmin_neg} and {nmax}"
        )
    if mx0 != -mn0_neg or mx1 != -mn1_neg:
        shown = ", ".join(f"{s}:{d}" for _, s, d in _describe(tensors)[:6])
        raise ValueError(
            f"{fn}: every rank must pass tensors of the same shapes and dtypes in the same order;"
            f" they differ across ranks (rank {me}: {n} tensors: {shown}{', ...' if n > 6 else ''})"
        )
    if cmax != -cmin_neg:
        assert config is not None
        given = ", ".join(f"{k}={v!r}" for k, v in config.items())
        raise ValueError(
            f"{fn}: every rank must pass the same {', '.join(config)} (they decide the collectives each"
            f" rank issues); they differ across ranks (rank {me}: {given})"
        )
    return flag_max


def _tensor_list(values: Any, fn: str, argname: str) -> list[Tensor]:
    """``values`` (a list or generator) as a list of tensors; TypeError naming the bad item."""
    if isinstance(values, torch.Tensor):
        raise TypeError(f"{fn}: {argname} must be a list or iterable of tensors, got a single tensor")
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{fn}: {argname} must be a list or iterable of tensors, got {type(values).__name__}") from None
    for i, t in enumerate(items):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {argname}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    return items


def _grad_op(op: Any, fn: str) -> str:
    rop = _t.normalize_reduce_op(op)
    if rop not in ("sum", "mean"):
        raise ValueError(f"{fn}: op must be 'mean' or 'sum' for gradients, got {op!r}")
    return rop


def _distributed_size(group: Any) -> int:
    return torch_dist.get_world_size(group) if is_distributed() else 1


# ---------------------------------------------------------------------------
# GradientSynchronizer
# ---------------------------------------------------------------------------
class _Bucket:
    """Parameters whose gradients travel together, and one step's state.

    A *direct* bucket holds one large gradient reduced in place (no packing
    copy, where the driver's ``pack_max_bytes`` says copies cost more than they
    save); a packed bucket copies its gradients into one flat buffer.
    """

    __slots__ = ("index", "params", "direct", "slot", "remaining", "flat_dtype", "handle", "flat", "layout",
                 "present", "in_backward")

    def __init__(self, index: list[int], params: list[Tensor], direct: bool, slot: int) -> None:
        self.index = index
        self.params = params
        self.direct = direct
        self.slot = slot  # position among the direct buckets' presence flags
        self.remaining = len(params)
        self.flat_dtype: Optional[torch.dtype] = None
        self.handle: Any = None
        self.flat: Optional[Tensor] = None
        self.layout: Optional[FlatLayout] = None
        self.present = True
        self.in_backward = False

    def reset(self) -> None:
        self.remaining = len(self.params)
        self.handle = self.flat = self.layout = None
        self.present = True
        self.in_backward = False


class GradientSynchronizer:
    """Average (or sum) gradients over ranks, overlapping communication with backward.

    MegEngine's gradient all-reduce callback for a plain training loop,
    without ``DistributedDataParallel``. Parameters are packed by dtype (and
    device) into buckets of about ``bucket_size_mb`` MiB, in reverse order
    (gradients arrive from the last layer to the first; like DDP, the first
    bucket is capped at ``first_bucket_mb`` so communication starts early).
    A hook on every parameter (``Tensor.register_post_accumulate_grad_hook``)
    counts the gradients as backward produces them; as soon as a bucket is
    complete its gradients are copied into one flat buffer and all-reduced
    *asynchronously* while backward goes on. [`wait`][hwdist.training.GradientSynchronizer.wait] (after backward)
    launches the buckets still open, waits for all of them and writes the
    results back into each ``.grad`` in its own dtype and device. A gradient
    that fills a bucket alone is reduced in place instead (no packing copy)
    where the driver's ``pack_max_bytes`` says copies are costly (CPU
    backends; never on accelerators, where ``pack_max_bytes`` is 0).

    Buckets are launched strictly in bucket order on every rank (a complete
    bucket waits for the ones before it), so the collectives match across
    ranks even when gradients arrive in another order. On torch without the
    hook every bucket is launched by [`wait`][hwdist.training.GradientSynchronizer.wait] (no overlap, same result).

    Unused parameters: a parameter whose ``.grad`` is None on a rank counts
    as zeros there. After [`wait`][hwdist.training.GradientSynchronizer.wait] it holds the reduced gradient if any
    rank produced one, and stays None if no rank did -- the same on every
    rank, so optimizers skip it everywhere. The mean divides by the world
    size (DDP's rule), not by the number of ranks that used the parameter.
    Packed buckets carry one presence flag per parameter for this; in-place
    gradients share one small extra all_reduce of flags per step.

    Construction is collective when a process group exists: one tiny
    all_reduce checks that every rank passed the same parameters (count,
    shapes, dtypes) and the same ``op``, ``bucket_size_mb``,
    ``first_bucket_mb`` and ``broadcast_from``, then the parameters are broadcast from
    ``broadcast_from`` so every rank starts from the same weights (pass
    None to skip). Without a process group (or with one rank) it does
    nothing, so the same script runs in a single process. ``.grad`` values
    are undefined between the end of backward and [`wait`][hwdist.training.GradientSynchronizer.wait].

    Gradient accumulation: run the backward passes that must not
    synchronise inside [`no_sync`][hwdist.training.GradientSynchronizer.no_sync]; the last one (outside) launches the
    buckets with the accumulated gradients. A second backward before
    [`wait`][hwdist.training.GradientSynchronizer.wait] outside ``no_sync`` raises.

    Args:
        params: the parameters (e.g. ``model.parameters()``); those with
            ``requires_grad=False`` are ignored, duplicates are kept once.
        op: ``'mean'`` (default) or ``'sum'``.
        bucket_size_mb: bucket limit in MiB (default 10); ``<= 0``: one
            bucket per dtype.
        first_bucket_mb: limit of the first bucket in MiB (default 1, as in
            DDP; never above ``bucket_size_mb``); ``<= 0``: no special first bucket.
        group: process group (default group if None).
        broadcast_from: global rank whose parameters every rank copies at
            construction; None: no broadcast.
        overlap: launch buckets during backward (default); False launches
            everything in [`wait`][hwdist.training.GradientSynchronizer.wait].

    Raises:
        TypeError: an item of ``params`` is not a tensor (on every rank).
        ValueError: bad ``op``/``bucket_size_mb``/``broadcast_from``, or the
            ranks passed different parameters (on every rank).

    Examples:
        >>> model = torch.nn.Linear(2, 1)
        >>> sync = hwdist.GradientSynchronizer(model.parameters())
        >>> model(torch.ones(1, 2) * (rank + 1)).sum().backward()
        >>> # rank 0: weight.grad [[1., 1.]]   rank 1: weight.grad [[2., 2.]]
        >>> sync.wait()
        >>> # rank 0: weight.grad [[1.5, 1.5]]   rank 1: weight.grad [[1.5, 1.5]]
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        op: Any = "mean",
        *,
        bucket_size_mb: float = 10.0,
        first_bucket_mb: float = 1.0,
        group: Optional[Any] = None,
        broadcast_from: Optional[int] = 0,
        overlap: bool = True,
    ) -> None:
        fn = "GradientSynchronizer"
        problem: Optional[Exception] = None
        plist: list[Tensor] = []
        self._bucket_bytes = self._first_bytes = -1
        try:
            self._op = _grad_op(op, fn)
            plist = unique_tensors(p for p in _tensor_list(params, fn, "params") if p.requires_grad)
            self._bucket_bytes = _mib(bucket_size_mb, "bucket_size_mb", fn)
            self._first_bytes = _mib(first_bucket_mb, "first_bucket_mb", fn)
        except (TypeError, ValueError) as exc:
            problem = exc
            self._op = "mean"
        self._group = group
        self._params = plist
        self._lock = threading.Lock()
        self._enabled = True
        self._verified = False
        self._hooks: list[Any] = []
        self._overlap = bool(overlap) and _compat.HAS_POST_ACCUMULATE_GRAD_HOOK
        self._ws: Optional[int] = None  # world size of the current step (None: step not started)
        self._next = 0  # next bucket to launch (buckets go in order on every rank)
        self._seen = [False] * len(plist)
        self._last_overlapped = 0
        self._flags_handle: Any = None
        self._flags: Optional[Tensor] = None
        self._buckets: list[_Bucket] = []
        self._where: list[int] = []
        self._direct_bytes: Optional[int] = None
        if is_distributed():
            ws = torch_dist.get_world_size(group)
            if problem is None and broadcast_from is not None:
                try:
                    broadcast_from = _t._check_rank(broadcast_from, "broadcast_from", fn, group, ws)
                except (TypeError, ValueError) as exc:
                    problem = exc
            if ws > 1:
                _agree(fn, plist, group, problem=problem, config=self._config(broadcast_from))
                self._verified = True
                self._build(self._driver_pack_bytes())
                if broadcast_from is not None:
                    _broadcast_flat(plist, broadcast_from, group)
        if problem is not None:
            raise problem
        if self._direct_bytes is None:
            self._build(0)
        if self._overlap:
            ref = weakref.ref(self)
            for i, p in enumerate(plist):
                self._hooks.append(p.register_post_accumulate_grad_hook(_make_hook(ref, i)))

    # ---- public --------------------------------------------------------------
    @property
    def params(self) -> list[Tensor]:
        """The synchronised parameters (requires_grad, without duplicates), in the given order."""
        return list(self._params)

    @property
    def buckets(self) -> list[list[int]]:
        """Each bucket's parameters as indices into [`params`][hwdist.training.GradientSynchronizer.params], in launch order."""
        return [list(b.index) for b in self._buckets]

    @property
    def launched(self) -> int:
        """Buckets launched so far in the current step (during backward or by [`wait`][hwdist.training.GradientSynchronizer.wait])."""
        return self._next

    @property
    def overlapped(self) -> int:
        """How many buckets of the last completed step were launched during backward."""
        return self._last_overlapped

    def wait(self) -> None:
        """Launch the buckets still open, wait for all of them, write the results into ``.grad``.

        Call it after ``loss.backward()`` and before ``optimizer.step()``, on
        every rank. Afterwards every ``.grad`` holds the mean (or sum) over
        the ranks, in its own dtype and device.
        """
        with self._lock:
            ws = self._start_step()
            if ws > 1:
                try:
                    for b in range(self._next, len(self._buckets)):
                        self._launch(b, in_backward=False)
                    self._launch_flags()
                    for bucket in self._buckets:
                        self._finish(bucket)
                except BaseException:
                    self._reset()
                    raise
            self._last_overlapped = sum(b.in_backward for b in self._buckets)
            self._reset()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside this block only accumulate (nothing is launched).

        Examples:
            >>> with sync.no_sync():
            ...     loss_a.backward()   # accumulates locally
            >>> loss_b.backward()       # launches buckets with the accumulated grads
            >>> sync.wait()
        """
        previous, self._enabled = self._enabled, False
        try:
            yield
        finally:
            self._enabled = previous

    def close(self) -> None:
        """Remove the hooks; [`wait`][hwdist.training.GradientSynchronizer.wait] still synchronises (after backward, no overlap)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._overlap = False

    def __enter__(self) -> "GradientSynchronizer":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """``with sync: loss.backward()`` calls [`wait`][hwdist.training.GradientSynchronizer.wait] on a clean exit."""
        if exc_type is None:
            self.wait()
        else:
            with self._lock:
                self._reset()

    def __repr__(self) -> str:
        return (
            f"<GradientSynchronizer {len(self._params)} params in {len(self._buckets)} buckets,"
            f" op={self._op!r}, overlap={self._overlap}>"
        )

    # ---- internals ---------------------------------------------------------
    def _config(self, broadcast_from: Any = None) -> dict[str, Any]:
        """The arguments that decide this synchroniser's collectives (the same on every rank, checked)."""
        config = {
            "op": self._op,
            "bucket_size_mb": self._bucket_bytes / MiB if self._bucket_bytes > 0 else -1,
            "first_bucket_mb": self._first_bytes / MiB if self._first_bytes > 0 else -1,
        }
        if broadcast_from is not None:
            config["broadcast_from"] = broadcast_from
        return config

    def _driver_pack_bytes(self) -> int:
        if not self._params:
            return 0
        driver = registry.resolve(self._group, self._params[0].device)
        return int(getattr(driver, "pack_max_bytes", 0) or 0)

    def _build(self, direct_bytes: int) -> None:
        """Split the parameters into buckets; the same layout on every rank (same params, same driver)."""
        plist = self._params
        arrival = list(reversed(range(len(plist))))  # gradients arrive roughly back to front
        pos = {i: k for k, i in enumerate(arrival)}

        def nbytes(i: int) -> int:
            return plist[i].numel() * plist[i].element_size()

        # In place only what would fill a bucket alone anyway: no extra collective, one copy less.
        alone = max(direct_bytes, self._bucket_bytes) if direct_bytes > 0 and self._bucket_bytes > 0 else 0
        big = [i for i in arrival if alone > 0 and nbytes(i) >= alone]
        small = [i for i in arrival if not (alone > 0 and nbytes(i) >= alone)]
        groups: list[tuple[list[int], bool]] = [([i], True) for i in big]
        first = self._first_bytes
        if self._bucket_bytes > 0:
            first = min(first, self._bucket_bytes) if first > 0 else -1
        else:
            first = -1  # one bucket per dtype: no early first bucket either
        if small and first > 0:
            head = [small[j] for j in bucket_tensors([plist[i] for i in small], first)[0]]
            groups.append((head, False))
            taken = set(head)
            small = [i for i in small if i not in taken]
        for b in bucket_tensors([plist[i] for i in small], self._bucket_bytes):
            groups.append(([small[j] for j in b], False))
        groups.sort(key=lambda g: max(pos[i] for i in g[0]))  # launch order: when the last gradient arrives
        self._buckets = []
        self._where = [0] * len(plist)
        slot = 0
        for b, (index, direct) in enumerate(groups):
            for i in index:
                self._where[i] = b
            self._buckets.append(_Bucket(index, [plist[i] for i in index], direct, slot))
            slot += direct
        self._direct_bytes = direct_bytes

    def _start_step(self) -> int:
        if self._ws is None:
            self._ws = _distributed_size(self._group)
            if self._ws > 1:
                if not self._verified:  # built before the process group existed
                    _agree("GradientSynchronizer", self._params, self._group, config=self._config())
                    self._verified = True
                direct = self._driver_pack_bytes()
                if direct != self._direct_bytes:
                    self._build(direct)
        return self._ws

    def _on_grad(self, i: int) -> None:
        if not self._enabled:
            return
        with self._lock:
            if self._seen[i]:
                raise RuntimeError(
                    f"GradientSynchronizer: the gradient of params[{i}] (shape {tuple(self._params[i].shape)})"
                    " arrived twice before wait(); for gradient accumulation run the earlier backward"
                    " passes inside `with sync.no_sync():`, and call sync.wait() once per step"
                )
            self._seen[i] = True
            if self._start_step() <= 1:
                return
            bucket = self._buckets[self._where[i]]
            bucket.remaining -= 1
            while self._next < len(self._buckets) and self._buckets[self._next].remaining == 0:
                self._launch(self._next, in_backward=True)

    def _grad_of(self, p: Tensor) -> Optional[Tensor]:
        g = p.grad
        if g is not None and g.layout != torch.strided:
            raise RuntimeError(
                f"GradientSynchronizer: sparse gradients are not supported (parameter of shape"
                f" {tuple(p.shape)} has a {g.layout} gradient)"
            )
        return g

    def _launch(self, b: int, in_backward: bool) -> None:
        bucket = self._buckets[b]
        self._next = b + 1
        bucket.in_backward = in_backward
        if bucket.direct:  # one large gradient, reduced where it is
            p = bucket.params[0]
            g = self._grad_of(p)
            if g is None:
                bucket.present = False
                g = bucket.flat = torch.zeros_like(p, memory_format=torch.contiguous_format)
            bucket.handle = _t.all_reduce(g, self._op, self._group, async_op=True)
            return
        driver = registry.resolve(self._group, bucket.params[0].device)
        if bucket.flat_dtype is None:
            first = bucket.params[0]
            plan = driver.plan("all_reduce", first.dtype, self._op)
            # Pack straight into the dtype the backend reduces (bf16 -> fp32 where needed): no second copy.
            bucket.flat_dtype = first.dtype if plan.view else plan.comm_dtype
        grads: list[Tensor] = []
        flags: list[float] = []
        for p in bucket.params:
            g = self._grad_of(p)
            flags.append(0.0 if g is None else 1.0)
            grads.append(torch.zeros_like(p, memory_format=torch.contiguous_format) if g is None else g)
        cdev = driver.comm_device()
        grads.append(torch.tensor(flags, dtype=bucket.flat_dtype, device=cdev))
        flat, layout = flatten_tensors(grads, dtype=bucket.flat_dtype, device=cdev)
        bucket.flat, bucket.layout = flat, layout
        bucket.handle = _t.all_reduce(flat, self._op, self._group, async_op=True)

    def _launch_flags(self) -> None:
        """One small all_reduce(MAX) of the in-place gradients' presence flags (after every bucket)."""
        direct = [b for b in self._buckets if b.direct]
        if not direct:
            return
        driver = registry.resolve(self._group, direct[0].params[0].device)
        flags = torch.tensor([int(b.present) for b in direct], dtype=torch.int32, device=driver.comm_device())
        self._flags = flags
        self._flags_handle = _t.all_reduce(flags, "max", self._group, async_op=True)

    def _finish(self, bucket: _Bucket) -> None:
        bucket.handle.wait()
        if bucket.direct:
            if not bucket.present:
                if self._flags_handle is not None:
                    self._flags_handle.wait()
                    self._flags_handle = None
                assert self._flags is not None
                if int(self._flags[bucket.slot]) > 0:  # another rank had a gradient: take the reduced one
                    bucket.params[0].grad = bucket.flat
            return
        assert bucket.flat is not None and bucket.layout is not None
        pieces = unflatten_tensors(bucket.flat, bucket.layout)
        present: Optional[list[float]] = None  # the presence flags, read only when needed
        with torch.no_grad():
            for j, (p, piece) in enumerate(zip(bucket.params, pieces)):
                g = p.grad
                if g is not None:
                    g.copy_(piece)
                    continue
                if present is None:
                    present = pieces[-1].tolist()
                if present[j] > 0:  # another rank had a gradient: this rank gets the reduced one
                    p.grad = piece.to(device=p.device, dtype=p.dtype, copy=True)

    def _reset(self) -> None:
        if self._flags_handle is not None:
            self._flags_handle.wait()  # issued on every rank: complete it before the next step
        self._flags_handle = self._flags = None
        for bucket in self._buckets:
            bucket.reset()
        self._next = 0
        self._ws = None
        self._seen = [False] * len(self._params)


def _make_hook(ref: "weakref.ReferenceType[GradientSynchronizer]", i: int) -> Callable[[Tensor], None]:
    def hook(_param: Tensor) -> None:
        sync = ref()
        if sync is not None:
            sync._on_grad(i)

    return hook


# ---------------------------------------------------------------------------
# demucs' distrib.py
# ---------------------------------------------------------------------------
def sync_grad(params: Iterable[Tensor], op: Any = "mean", group: Optional[Any] = None) -> None:
    """All-reduce every gradient, one asynchronous collective per tensor, then average.

    demucs' ``sync_grad``, called after ``loss.backward()``: every
    ``.grad`` of ``params`` gets the mean (or sum) over the ranks. One tiny
    check collective comes first (same parameters on every rank, and whether
    any rank lacks a gradient); unused parameters follow
    [`GradientSynchronizer`][hwdist.training.GradientSynchronizer]'s rule (zeros where missing; still None
    where no rank has a gradient). For many small parameters
    [`GradientSynchronizer`][hwdist.training.GradientSynchronizer] is faster (buckets, overlap with backward).
    Non-distributed or a one-rank group: does nothing.

    Args:
        params: parameters (e.g. ``model.parameters()``); ``requires_grad=False`` ones are
            ignored, one listed twice is reduced once.
        op: ``'mean'`` (default) or ``'sum'``.
        group: process group (default group if None).

    Raises:
        TypeError: an item of ``params`` is not a tensor (on every rank).
        ValueError: bad ``op``, or the ranks passed different parameters (on every rank).

    Examples:
        >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.full((2,), rank + 1.0)
        >>> # rank 0: w.grad [1., 1.]   rank 1: w.grad [2., 2.]
        >>> hwdist.sync_grad([w])
        >>> # rank 0: w.grad [1.5, 1.5]   rank 1: w.grad [1.5, 1.5]
    """
    fn = "sync_grad"
    problem: Optional[Exception] = None
    plist: list[Tensor] = []
    rop = "mean"
    try:
        rop = _grad_op(op, fn)
        plist = unique_tensors(p for p in _tensor_list(params, fn, "params") if p.requires_grad)  # [w, w]: once
        for i, p in enumerate(plist):
            if p.grad is not None and p.grad.layout != torch.strided:
                raise TypeError(f"{fn}: sparse gradients are not supported (parameter {i} has a {p.grad.layout} gradient)")
    except (TypeError, ValueError) as exc:
        problem = exc
    if _distributed_size(group) <= 1:
        if problem is not None:
            raise problem
        return
    has = [p.grad is not None for p in plist]
    any_missing = _agree(fn, plist, group, problem=problem, flag=int(not all(has)))
    used = has
    if any_missing:  # someone lacks a gradient: learn which parameters any rank has
        driver = registry.resolve(group, plist[0].device)
        mask = torch.tensor(has, dtype=torch.int32, device=driver.comm_device())
        _t.all_reduce(mask, "max", group)
        used = [bool(v) for v in mask.tolist()]
    handles = []
    for p, u in zip(plist, used):
        if not u:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        handles.append(_t.all_reduce(p.grad, rop, group, async_op=True))
    for h in handles:
        h.wait()


def _broadcast_flat(tensors: Sequence[Tensor], src: int, group: Any) -> None:
    """Broadcast tensors in place, packed by dtype into flat buffers (big ones as they are)."""
    if not tensors:
        return
    driver = registry.resolve(group, tensors[0].device)
    cdev = driver.comm_device()
    data = [t.detach() for t in tensors]
    limit = int(getattr(driver, "pack_max_bytes", 0) or 0)
    direct = [t for t in data if limit > 0 and t.numel() * t.element_size() >= limit]
    packed = [t for t in data if not (limit > 0 and t.numel() * t.element_size() >= limit)]
    is_src = torch_dist.get_rank() == src
    handles = [_t.broadcast(t, src, group, async_op=True) for t in direct]
    pending = []
    for bucket in bucket_tensors(packed, _BROADCAST_BUCKET_BYTES):
        members = [packed[i] for i in bucket]
        flat, layout = flatten_tensors(members, device=cdev)
        pending.append((_t.broadcast(flat, src, group, async_op=True), flat, members, layout))
    for handle, flat, members, layout in pending:
        handle.wait()
        if not is_src:
            copy_from_flat(flat, members, layout)
    for h in handles:
        h.wait()


def _broadcast_list(fn: str, tensors: list[Tensor], src: Any, group: Any, problem: Optional[Exception]) -> None:
    ws = _distributed_size(group)
    if problem is None and is_distributed():
        try:
            _t._check_rank(src, "src", fn, group, ws)
        except (TypeError, ValueError) as exc:
            problem = exc
    if ws <= 1:
        if problem is not None:
            raise problem
        return
    _agree(fn, tensors, group, problem=problem)
    _broadcast_flat(tensors, src, group)


def bcast_list_(tensors: Iterable[Tensor], src: int = 0, group: Optional[Any] = None) -> None:
    """Broadcast a list of tensors from rank ``src``, in place (MegEngine's ``bcast_list_``).

    Any dtypes; tensors are packed by dtype into flat buffers (one broadcast
    per ~32 MiB bucket; on CPU backends tensors of at least the driver's
    ``pack_max_bytes`` go as they are), sent asynchronously and copied back.
    Parameters that require grad work (their ``.data`` changes). One tiny
    check collective first: when the ranks hold different numbers, shapes
    or dtypes of tensors, every rank raises instead of waiting. Non-distributed: does nothing.

    Args:
        tensors: a list or generator of tensors (e.g. ``model.parameters()``).
        src: global rank to broadcast from.
        group: process group (default group if None).

    Raises:
        TypeError: an item is not a tensor (on every rank).
        ValueError: bad ``src``, or the ranks' lists differ (on every rank).

    Examples:
        >>> ts = [torch.full((2,), rank + 1.0), torch.tensor([rank])]
        >>> # rank 0: [1., 1.], [0]   rank 1: [2., 2.], [1]
        >>> hwdist.bcast_list_(ts, src=0)
        >>> # rank 0: [1., 1.], [0]   rank 1: [1., 1.], [0]
    """
    problem: Optional[Exception] = None
    items: list[Tensor] = []
    try:
        items = _tensor_list(tensors, "bcast_list_", "tensors")
    except TypeError as exc:
        problem = exc
    _broadcast_list("bcast_list_", items, src, group, problem)


def broadcast_tensors(tensors: Iterable[Tensor], src: int = 0, group: Optional[Any] = None) -> None:
    """Broadcast the floating-point and complex tensors of a list from ``src``, in place.

    demucs' ``broadcast_tensors`` (e.g. ``broadcast_tensors(model.parameters())``
    before training): integer and bool tensors are skipped. Before any data
    moves, one tiny collective checks that every rank holds the same number
    of such tensors (and their shapes and dtypes), so a mismatch raises on
    every rank instead of deadlocking. Same transport as [`bcast_list_`][hwdist.training.bcast_list_].
    Non-distributed: does nothing.

    Args:
        tensors: a list or generator of tensors.
        src: global rank to broadcast from.
        group: process group (default group if None).

    Raises:
        TypeError: an item is not a tensor (on every rank).
        ValueError: bad ``src``, or the ranks' lists differ (on every rank).

    Examples:
        >>> ts = [torch.tensor([rank + 0.5]), torch.tensor([rank])]
        >>> # rank 0: [0.5], [0]   rank 1: [1.5], [1]
        >>> hwdist.broadcast_tensors(ts)
        >>> # rank 0: [0.5], [0]   rank 1: [0.5], [1]   (the int tensor is skipped)
    """
    problem: Optional[Exception] = None
    items: list[Tensor] = []
    try:
        items = [t for t in _tensor_list(tensors, "broadcast_tensors", "tensors") if t.is_floating_point() or t.is_complex()]
    except TypeError as exc:
        problem = exc
    _broadcast_list("broadcast_tensors", items, src, group, problem)


def sync_buffer(buffers: Iterable[Tensor], average: bool = True, src: int = 0, group: Optional[Any] = None) -> None:
    """Make floating-point buffers (e.g. BatchNorm statistics) equal on every rank, in place.

    demucs' ``sync_buffer``: ``average=True`` replaces each buffer by its mean
    over the ranks (divided by the world size's *value*; the seed divided by
    the function ``world_size``); ``average=False`` broadcasts them from
    ``src``. Integer buffers (``num_batches_tracked``) are left alone. One
    tiny check collective first (same buffers on every rank, else every
    rank raises). Non-distributed or a one-rank group: does nothing.

    Args:
        buffers: a list or generator of tensors (e.g. ``model.buffers()``).
        average: average (default) or broadcast from ``src``.
        src: global rank to broadcast from when ``average=False``.
        group: process group (default group if None).

    Raises:
        TypeError: an item is not a tensor (on every rank).
        ValueError: bad ``src``, or the ranks' buffers differ (on every rank).

    Examples:
        >>> bufs = [torch.tensor([1.0 + rank])]
        >>> # rank 0: [1.]   rank 1: [2.]
        >>> hwdist.sync_buffer(bufs)                  # rank 0: [1.5]   rank 1: [1.5]
        >>> hwdist.sync_buffer(bufs, average=False)   # everyone gets rank 0's value
    """
    fn = "sync_buffer"
    problem: Optional[Exception] = None
    items: list[Tensor] = []
    try:
        items = [t for t in _tensor_list(buffers, fn, "buffers") if t.is_floating_point()]
    except TypeError as exc:
        problem = exc
    if not average:
        _broadcast_list(fn, items, src, group, problem)
        return
    if _distributed_size(group) <= 1:
        if problem is not None:
            raise problem
        return
    _agree(fn, items, group, problem=problem)
    all_reduce_params(items, op="mean", group=group)


def average_metrics(metrics: Mapping[str, Any], count: float = 1.0, group: Optional[Any] = None) -> dict[str, float]:
    """The count-weighted average of a dict of numbers over the ranks.

    demucs' ``average_metrics``: each rank passes its metrics (Python
    numbers or one-element tensors) and the number of samples they were
    computed on; every rank gets ``{key: sum_r(count_r * value_r) /
    sum_r(count_r)}`` as floats (``nan`` where the counts sum to 0; a rank
    with ``count=0`` contributes nothing, even a ``nan`` value). Sums
    travel in float64 where the backend reduces it (else float32), one
    collective for all keys, plus a tiny check that every rank passes the
    same keys (a mismatch or a bad value raises on every rank, naming it).
    Non-distributed: the metrics as floats.

    Args:
        metrics: ``{name: number}``; every rank must pass the same names.
        count: this rank's weight (e.g. its number of samples), ``>= 0``.
        group: process group (default group if None).

    Returns:
        A new dict with the same keys, in the given order.

    Raises:
        TypeError: ``metrics`` is not a dict of numbers with str keys (on every rank).
        ValueError: ``count`` is negative or not finite, or the ranks' keys differ (on every rank).

    Examples:
        >>> m = {"loss": 1.0 + rank}
        >>> # rank 0: {'loss': 1.0}, count 1   rank 1: {'loss': 2.0}, count 3
        >>> hwdist.average_metrics(m, count=1 + 2 * rank)
        >>> # rank 0: {'loss': 1.75}   rank 1: {'loss': 1.75}
    """
    fn = "average_metrics"
    problem: Optional[str] = None
    failure: Optional[Exception] = None
    values: dict[str, float] = {}
    weight = 0.0
    try:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics must be a dict of numbers, got {type(metrics).__name__}")
        for k, v in metrics.items():
            if not isinstance(k, str):
                raise TypeError(f"metrics keys must be str, got {type(k).__name__}: {k!r}")
            values[k] = _as_float(v, f"metrics[{k!r}]")
        weight = _as_float(count, "count")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"count must be a finite number >= 0, got {count!r}")
    except (TypeError, ValueError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
        failure = exc
    ws = _distributed_size(group)
    if ws <= 1:
        if failure is not None:
            raise type(failure)(f"{fn}: {failure}")
        return {k: (v if weight > 0 else math.nan) for k, v in values.items()}
    driver = registry.resolve(group, None)
    try:
        driver.plan("all_reduce", torch.float64, "sum")
        dtype = torch.float64
    except TypeError:  # the backend cannot reduce float64: float32 still sums counts exactly up to 2**24
        dtype = torch.float32
    keys = sorted(values) if problem is None else []
    cdev = driver.comm_device()
    # a zero weight contributes nothing, not even a NaN or inf value (nan * 0 is nan)
    data = {k: torch.tensor([values[k] * weight if weight > 0 else 0.0, weight], dtype=dtype, device=cdev) for k in keys}
    try:
        _verify(keys, data, problem, group, driver, ws)
    except ValueError as exc:
        text = str(exc).replace("all_reduce_dict: ", f"{fn}: ", 1)
        if failure is not None:
            raise type(failure)(f"{fn}: {failure}") from None
        raise ValueError(text.replace("keys, shapes and dtypes", "keys")) from None
    all_reduce_dict(data, "sum", group, verify=False)
    out: dict[str, float] = {}
    for k in values:
        total, n = data[k].tolist()
        out[k] = total / n if n > 0 else math.nan
    return out


def _as_float(value: Any, name: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{name} must be a number or a one-element tensor, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    if isinstance(value, (int, float)) or hasattr(value, "__float__"):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r:.60}")


# ---------------------------------------------------------------------------
# MegEngine / vis4d small helpers
# ---------------------------------------------------------------------------
@overload
def synchronized(func: F) -> F: ...
@overload
def synchronized(func: None = None, *, group: Optional[Any] = None) -> Callable[[F], F]: ...
def synchronized(func: Optional[F] = None, *, group: Optional[Any] = None) -> Any:
    """Decorator: run the function, then wait at a barrier until every rank has run it.

    MegEngine's ``synchronized``. Use as ``@synchronized`` or
    ``@synchronized(group=g)``. The barrier follows a normal return only (an
    exception propagates at once). Non-distributed: just runs the function.

    Examples:
        >>> @hwdist.synchronized
        ... def save(path):
        ...     if hwdist.get_rank() == 0:
        ...         torch.save(model.state_dict(), path)
        >>> save("ckpt.pt")   # every rank returns once rank 0 has saved
    """

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = f(*args, **kwargs)
            barrier(group)
            return result

        return wrapper  # type: ignore[return-value]

    if func is not None:
        if not callable(func):
            raise TypeError(f"synchronized: expected a function, got {type(func).__name__}")
        return decorate(func)
    return decorate


def synchronize(group: Optional[Any] = None) -> None:
    """Block until every rank of ``group`` arrives (vis4d's name for [`hwdist.barrier`][hwdist.info.barrier]).

    No-op when not distributed.
    """
    barrier(group)


def check_fork_safe(start_method: Optional[str] = None) -> None:
    """Raise if worker processes started with ``fork`` would inherit an initialised device.

    Call it right before starting workers (DataLoader workers, a
    ``multiprocessing.Pool``, ...). A CUDA-style device runtime initialised in
    the parent cannot be used in a forked child (the child fails or hangs at
    its first device call). Each registered driver says whether its device is
    initialised (``Driver.is_initialized``; no vendor package is imported).

    Args:
        start_method: ``'fork'``, ``'spawn'`` or ``'forkserver'``; default:
            multiprocessing's current (or default) start method. Only
            ``'fork'`` can fail.

    Raises:
        RuntimeError: ``fork`` with an initialised device (the message says what to do).
        ValueError: an unknown ``start_method``.

    Examples:
        >>> hwdist.check_fork_safe()          # fine before the first device call
        >>> hwdist.check_fork_safe("spawn")   # always fine
    """
    methods = multiprocessing.get_all_start_methods()
    method = start_method
    if method is None:
        # Without fixing the start method as a side effect: the first listed is the default.
        method = multiprocessing.get_start_method(allow_none=True) or methods[0]
    if method not in methods:
        raise ValueError(
            f"check_fork_safe: start_method must be one of {', '.join(repr(m) for m in methods)}, got {start_method!r}"
        )
    if method != "fork":
        return
    busy: dict[str, str] = {}
    for drv in registry.drivers():
        if drv.device_type not in busy and drv.is_initialized():
            busy[drv.device_type] = drv.name
    if busy:
        what = ", ".join(f"'{d}' (backend '{n}')" for d, n in busy.items())
        raise RuntimeError(
            f"check_fork_safe: the {what} device runtime is already initialised in this process and"
            " worker processes would be started with 'fork': a forked child cannot use an initialised"
            " device context (it fails or hangs at its first device call). Start the workers with the"
            " 'spawn' or 'forkserver' start method (multiprocessing.get_context('spawn'),"
            " torch.multiprocessing.spawn, DataLoader(multiprocessing_context='spawn')), or start them"
            " before the first device call"
        )


def is_module_wrapper(module: Any, wrappers: Sequence[type] = ()) -> bool:
    """Whether ``module`` is a data-parallel wrapper, possibly behind other wrappers.

    True for ``torch.nn.DataParallel`` and ``DistributedDataParallel``
    (subclasses included) and ``wrappers``; also for a module whose
    ``.module`` (followed recursively, as wrappers store what they wrap)
    is one. vis4d's ``is_module_wrapper``.

    Args:
        module: anything (non-modules give False).
        wrappers: extra wrapper classes to recognise.

    Examples:
        >>> hwdist.is_module_wrapper(torch.nn.DataParallel(torch.nn.Linear(1, 1)))
        True
        >>> hwdist.is_module_wrapper(torch.nn.Linear(1, 1))
        False
    """
    kinds = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel, *wrappers)
    seen: set[int] = set()
    current = module
    while isinstance(current, torch.nn.Module) and id(current) not in seen:
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = getattr(current, "module", None)
    return False
