"""[`GradientSynchronizer`][hwdist.training.GradientSynchronizer]: gradients averaged over the ranks while
backward runs."""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
import torch.distributed as torch_dist

from .. import registry
from ..collectives import tensor as _t
from ..collectives.params import flatten_tensors, mib_bytes, unflatten_tensors, unique_tensors
from ..info import is_distributed
from ..drivers.tuning import tuning
from .broadcasts import broadcast_flat
from .buckets import Bucket, plan_buckets
from .arguments import check_rank, check_same_tensors, distributed_size, grad_op, tensor_list

Tensor = torch.Tensor
MiB = 1024 * 1024


class GradientSynchronizer:
    """Average (or sum) gradients over ranks, overlapping communication with backward.

    MegEngine's gradient all-reduce callback for a plain training loop, without ``DistributedDataParallel``.
    Parameters are packed by dtype (and device) into buckets of about ``bucket_size_mb`` MiB, in reverse
    order (gradients arrive from the last layer to the first; like DDP, the first bucket is capped at
    ``first_bucket_mb`` so communication starts early). A hook on every parameter
    (``Tensor.register_post_accumulate_grad_hook``) counts the gradients as backward produces them; as soon
    as a bucket is complete its gradients are copied into one flat buffer and all-reduced *asynchronously*
    while backward goes on. [`wait`][hwdist.training.GradientSynchronizer.wait] (after backward) launches
    the buckets still open, waits for all of them and writes the results back into each ``.grad`` in its own
    dtype and device. A gradient that fills a bucket alone is reduced in place instead (no packing copy)
    where the driver's ``pack_max_bytes`` says copies are costly (CPU backends; never on accelerators, where
    ``pack_max_bytes`` is 0).

    Buckets are launched strictly in bucket order on every rank (a complete bucket waits for the ones before
    it), so the collectives match across ranks even when gradients arrive in another order. On torch without
    the hook every bucket is launched by [`wait`][hwdist.training.GradientSynchronizer.wait] (no overlap,
    same result).

    Unused parameters: a parameter whose ``.grad`` is None on a rank counts as zeros there. After
    [`wait`][hwdist.training.GradientSynchronizer.wait] it holds the reduced gradient if any rank produced
    one, and stays None if no rank did -- the same on every rank, so optimizers skip it everywhere. The mean
    divides by the world size (DDP's rule), not by the number of ranks that used the parameter. Packed
    buckets carry one presence flag per parameter for this; in-place gradients share one small extra
    all_reduce of flags per step.

    Construction is collective when a process group exists: one tiny
    all_reduce checks that every rank passed the same parameters (count,
    shapes, dtypes) and the same ``op``, ``bucket_size_mb``,
    ``first_bucket_mb`` and ``broadcast_from``, then the parameters are broadcast from
    ``broadcast_from`` so every rank starts from the same weights (pass
    None to skip). Without a process group (or with one rank) it does
    nothing, so the same script runs in a single process. ``.grad`` values
    are undefined between the end of backward and [`wait`][hwdist.training.GradientSynchronizer.wait].

    Gradient accumulation: run the backward passes that must not synchronise inside
    [`no_sync`][hwdist.training.GradientSynchronizer.no_sync]; the last one (outside) launches the buckets
    with the accumulated gradients. A second backward before
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
            self._op = grad_op(op, fn)
            plist = unique_tensors(p for p in tensor_list(params, fn, "params") if p.requires_grad)
            self._bucket_bytes = mib_bytes(bucket_size_mb, "bucket_size_mb", fn)
            self._first_bytes = mib_bytes(first_bucket_mb, "first_bucket_mb", fn)
        except (TypeError, ValueError) as exc:
            problem = exc
            self._op = "mean"
        self._group = group
        self._params = plist
        self._lock = threading.Lock()
        self._enabled = True
        self._verified = False
        self._hooks: list[Any] = []
        self._overlap = bool(overlap)
        self._ws: Optional[int] = None  # world size of the current step (None: step not started)
        self._next = 0  # next bucket to launch (buckets go in order on every rank)
        self._seen = [False] * len(plist)
        self._last_overlapped = 0
        self._flags_handle: Any = None
        self._flags: Optional[Tensor] = None
        self._buckets: list[Bucket] = []
        self._where: list[int] = []
        self._direct_bytes: Optional[int] = None
        if is_distributed():
            ws = torch_dist.get_world_size(group)
            if problem is None and broadcast_from is not None:
                try:
                    broadcast_from = check_rank(broadcast_from, "broadcast_from", fn, group)
                except (TypeError, ValueError) as exc:
                    problem = exc
            if ws > 1:
                check_same_tensors(fn, plist, group, problem=problem, config=self._config(broadcast_from))
                self._verified = True
                self._build(self._driver_pack_bytes())
                if broadcast_from is not None:
                    broadcast_flat(plist, broadcast_from, group)
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
        """Each bucket's parameters as indices into [`params`][hwdist.training.GradientSynchronizer.params].

        In launch order.
        """
        return [list(b.index) for b in self._buckets]

    @property
    def launched(self) -> int:
        """Buckets launched so far in the current step.

        During backward or by [`wait`][hwdist.training.GradientSynchronizer.wait].
        """
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
        """Remove the hooks.

        [`wait`][hwdist.training.GradientSynchronizer.wait] still synchronises (after backward, no overlap).
        """
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._overlap = False

    def __enter__(self) -> "GradientSynchronizer":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """``with sync: loss.backward()`` calls [`wait`][hwdist.training.GradientSynchronizer.wait].

        On a clean exit only.
        """
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
        return tuning(driver).pack_max_bytes

    def _build(self, direct_bytes: int) -> None:
        """Split the parameters into buckets (see [`plan_buckets`][hwdist.training.buckets.plan_buckets])."""
        self._buckets, self._where = plan_buckets(
            self._params, self._bucket_bytes, self._first_bytes, direct_bytes
        )
        self._direct_bytes = direct_bytes

    def _start_step(self) -> int:
        if self._ws is None:
            self._ws = distributed_size(self._group)
            if self._ws > 1:
                if not self._verified:  # built before the process group existed
                    check_same_tensors(
                        "GradientSynchronizer", self._params, self._group, config=self._config()
                    )
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
                    f"GradientSynchronizer: the gradient of params[{i}]"
                    f" (shape {tuple(self._params[i].shape)})"
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

    def _finish(self, bucket: Bucket) -> None:
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
