"""The bucket layout of [`GradientSynchronizer`][hwdist.training.GradientSynchronizer]: which gradients travel
together."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..collectives.params import FlatLayout, bucket_tensors

Tensor = torch.Tensor


class Bucket:
    """Parameters whose gradients travel together, and one step's state.

    A *direct* bucket holds one large gradient reduced in place (no packing
    copy, where the driver's ``pack_max_bytes`` says copies cost more than they
    save); a packed bucket copies its gradients into one flat buffer.
    """

    __slots__ = (
        "index",
        "params",
        "direct",
        "slot",
        "remaining",
        "flat_dtype",
        "handle",
        "flat",
        "layout",
        "present",
        "in_backward",
    )

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


def plan_buckets(
    plist: list[Tensor], bucket_bytes: int, first_bytes: int, direct_bytes: int
) -> tuple[list[Bucket], list[int]]:
    """Split the parameters into buckets, in launch order; the same layout on every rank (same params, same
    driver).

    Args:
        plist: the parameters.
        bucket_bytes: the bucket limit (``<= 0``: one bucket per dtype).
        first_bytes: the first bucket's limit (``<= 0``: no special first bucket).
        direct_bytes: gradients of at least this size that fill a bucket alone are reduced in
            place (0: none).

    Returns:
        The buckets, and for each parameter the index of its bucket.
    """
    arrival = list(reversed(range(len(plist))))  # gradients arrive roughly back to front
    pos = {i: k for k, i in enumerate(arrival)}

    def nbytes(i: int) -> int:
        return plist[i].numel() * plist[i].element_size()

    # In place only what would fill a bucket alone anyway: no extra collective, one copy less.
    alone = max(direct_bytes, bucket_bytes) if direct_bytes > 0 and bucket_bytes > 0 else 0
    big = [i for i in arrival if alone > 0 and nbytes(i) >= alone]
    small = [i for i in arrival if not (alone > 0 and nbytes(i) >= alone)]
    groups: list[tuple[list[int], bool]] = [([i], True) for i in big]
    first = first_bytes
    if bucket_bytes > 0:
        first = min(first, bucket_bytes) if first > 0 else -1
    else:
        first = -1  # one bucket per dtype: no early first bucket either
    if small and first > 0:
        head = [small[j] for j in bucket_tensors([plist[i] for i in small], first)[0]]
        groups.append((head, False))
        taken = set(head)
        small = [i for i in small if i not in taken]
    for b in bucket_tensors([plist[i] for i in small], bucket_bytes):
        groups.append(([small[j] for j in b], False))
    groups.sort(key=lambda g: max(pos[i] for i in g[0]))  # launch order: when the last gradient arrives
    buckets: list[Bucket] = []
    where = [0] * len(plist)
    slot = 0
    for n, (index, direct) in enumerate(groups):
        for i in index:
            where[i] = n
        buckets.append(Bucket(index, [plist[i] for i in index], direct, slot))
        slot += direct
    return buckets, where
