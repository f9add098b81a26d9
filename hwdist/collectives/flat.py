"""Flat buffers: pack many tensors into one 1-D buffer and split it back.

One collective on one flat buffer is much cheaper than one collective per
tensor (latency is paid once). These helpers are public so that other code
(metric dicts, parameter and gradient synchronisation) shares one
implementation. No function here communicates or looks at a backend.

Examples:
    >>> flat, layout = flatten_tensors([torch.ones(2, 3), torch.zeros(4)])
    >>> flat.shape, layout.offsets
    (torch.Size([10]), (0, 6))
    >>> [t.shape for t in unflatten_tensors(flat, layout)]
    [torch.Size([2, 3]), torch.Size([4])]
    >>> copy_from_flat(flat * 2, tensors, layout)   # write results back in place
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

import torch

__all__ = ["FlatLayout", "flatten_tensors", "unflatten_tensors", "copy_from_flat", "bucket_tensors"]

Tensor = torch.Tensor


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
        shapes, dtypes, offsets, numels = [], [], [], []
        pos = 0
        for t in tensors:
            n = t.numel()
            shapes.append(t.shape)
            dtypes.append(t.dtype)
            offsets.append(pos)
            numels.append(n)
            pos += n
        return cls(tuple(shapes), tuple(dtypes), tuple(offsets), tuple(numels))


def flatten_tensors(
    tensors: Sequence[Tensor],
    dtype: Optional[torch.dtype] = None,
    device: Union[torch.device, str, None] = None,
) -> tuple[Tensor, FlatLayout]:
    """Copy ``tensors`` into one new contiguous 1-D buffer (one copy per tensor, no more).

    Args:
        tensors: tensors of any shapes (and contiguity).
        dtype: dtype of the buffer; values are cast (choose a lossless one).
            Default: the tensors' common dtype (TypeError if they differ).
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
    with torch.no_grad():
        if all(t.device == device for t in tensors):
            d0, s0 = layout.dtypes[0], layout.shapes[0]
            if all(d == d0 for d in layout.dtypes):  # one dtype: no promotion inside cat/stack
                if all(sh == s0 for sh in layout.shapes):  # e.g. scalar metrics: stack is one cheap call
                    flat = torch.stack(tensors).reshape(-1)
                else:
                    flat = torch.cat([t.reshape(-1) for t in tensors])
                return (flat if d0 == dtype else flat.to(dtype)), layout
            flat = torch.empty(layout.total, dtype=dtype, device=device)
            torch.cat([t.reshape(-1) for t in tensors], out=flat)  # casts each input into dtype
            return flat, layout
        flat = torch.empty(layout.total, dtype=dtype, device=device)
        for t, off, n in zip(tensors, layout.offsets, layout.numels):
            flat[off : off + n].copy_(t.reshape(-1))
    return flat, layout


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

    Works on parameters that require grad (copies under ``torch.no_grad``).
    ``layout`` defaults to the layout of ``tensors`` packed in order.
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

    Order is kept inside each bucket; buckets come in order of first
    appearance. A tensor larger than ``bucket_bytes`` gets a bucket of its
    own. ``bucket_bytes <= 0``: one bucket per (dtype, device).

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

    A repeat is the same tensor object, or with ``same_memory=True`` any
    tensor that views the same memory the same way (data pointer, dtype,
    shape, strides and device): tied weights seen twice through
    ``state_dict().values()`` are two objects over one storage. Reducing such
    a tensor twice in place would count it twice.

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

