"""Tensors and numpy arrays in pickle streams: hwdist's reducers and the rebuild functions they name.

A dense CPU tensor travels as its bytes (large ones out of band: the receiver's tensor aliases
them), dtype name, shape and ``requires_grad``; a sparse one as its index and value tensors; a
quantized one as its integer values and parameters; other tensors keep torch's own format
(``docs/objects.md``). Tensors land on the CPU, or on the decode's ``map_location``. This module is
the bottom of ``hwdist.serialization`` (the restricted loader rebuilds through it): it imports
nothing of hwdist.
"""

from __future__ import annotations

import contextvars
import functools
import pickle
from typing import Any, Optional, Union, cast

import numpy as np
import torch

__all__ = [
    "OOB_THRESHOLD",
    "MapLocation",
    "SPARSE_LAYOUTS",
    "QUANTIZED_INTS",
    "QSCHEMES",
    "plain_dtype",
    "rebuild_tensor",
    "rebuild_sparse",
    "rebuild_quantized",
    "reduce_tensor",
    "reduce_ndarray",
]

#: Buffers at least this large travel out of band (not copied into the pickle stream).
OOB_THRESHOLD = 64 * 1024

MapLocation = Union[None, str, torch.device]
#: The device tensors are rebuilt on during a decode (None: the CPU).
MAP_LOCATION: contextvars.ContextVar[Optional[torch.device]] = contextvars.ContextVar(
    "hwdist_map_location", default=None
)


def plain_dtype(dt: Any) -> bool:
    """A numpy dtype that any bytes are a valid value of: bool, ints, floats, complex, one element."""
    numeric = isinstance(dt, np.dtype) and dt.kind in "biufc"
    return numeric and dt.fields is None and dt.subdtype is None and dt.metadata is None


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as one flat uint8 tensor, C order (a view when ``t`` is contiguous); any strides.

    A tensor of at most one element counts as contiguous whatever its strides, and keeps them
    through ``reshape(-1)``; ``view(uint8)`` needs stride 1, so such a tensor gets it here.
    """
    flat = t.reshape(-1)
    n = flat.numel()
    if n == 0 and (flat.stride(0) != 1 or flat.storage_offset()):
        flat = flat.as_strided((0,), (1,), 0)
    elif n == 1 and flat.stride(0) != 1:
        flat = flat.as_strided((1,), (1,))
    elif flat.stride(0) != 1:
        flat = flat.contiguous()
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def rebuild_tensor(buf: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> torch.Tensor:
    """Rebuild a tensor from its bytes (no copy when the buffer is writable).

    Streams name this function (``hwdist.serialization.tensors.rebuild_tensor``); the restricted
    loader checks its arguments, then calls it.
    """
    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype):
        raise pickle.UnpicklingError(f"tensor payload names an unknown dtype {dtype!r}")
    if type(buf) is not bytearray:  # in band, the encoder sends a bytearray: writable, this tensor's own
        buf = memoryview(buf).cast("B")
        if buf.readonly and buf.nbytes:
            buf = bytearray(buf)
    if len(buf) == 0:
        out = torch.empty(shape, dtype=dt)
    else:
        out = torch.frombuffer(buf, dtype=dt)
        if len(shape) != 1 or out.shape[0] != shape[0]:
            out = out.reshape(shape)
    loc = MAP_LOCATION.get()
    if loc is not None and out.device != loc:
        out = out.to(loc)
    if requires_grad:
        out.requires_grad_(True)
    return out


@functools.lru_cache(maxsize=None)
def _tensor_kind(dt: torch.dtype) -> tuple[str, bool]:
    """``dt``'s name in streams, and whether ``Tensor.numpy()`` takes it."""
    try:
        torch.empty(0, dtype=dt).numpy()
        return str(dt).replace("torch.", ""), True
    except (TypeError, RuntimeError):  # bfloat16, complex32, float8 kinds: no numpy dtype
        return str(dt).replace("torch.", ""), False


def reduce_tensor(t: torch.Tensor) -> Any:
    """The pickle reduction of ``t``: hwdist's forms for dense, sparse and quantized tensors, else torch's."""
    if t.layout != torch.strided or t.is_quantized or t.is_meta or t.is_nested:
        if t.layout in _SPARSE_NAMES:
            return _reduce_sparse(t)
        if t.is_quantized and t.dtype in QUANTIZED_INTS and t.qscheme() in _QSCHEME_NAMES:
            return _reduce_quantized(t)
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # torch's own format
    d = t.detach() if t.requires_grad else t
    if not d.is_cpu:
        d = d.cpu()  # tensors land on CPU (or map_location) on the other side
    d = d.resolve_conj().resolve_neg()  # each returns ``d`` itself when its bit is not set
    name, numpy_ok = _tensor_kind(d.dtype)
    shape = tuple(t.shape)
    if numpy_ok and d.numel() * d.element_size() < OOB_THRESHOLD:
        # small: in band, a bytearray copy of the elements in C order (any strides), which the loader's
        # tensor owns; through a memoryview, as a 0-d integer array would be taken as a length
        small = bytearray(memoryview(cast(Any, d.numpy())))
        return rebuild_tensor, (small, name, shape, bool(t.requires_grad))
    data: Any = _byte_view(d).numpy()  # any strides (Any: numpy's stubs on 3.9)
    return rebuild_tensor, (pickle.PickleBuffer(data), name, shape, bool(t.requires_grad))


# ---- sparse and quantized tensors ------------------------------------------------------------

#: The sparse layouts by their names in streams.
SPARSE_LAYOUTS: dict[str, torch.layout] = {
    name: getattr(torch, name)
    for name in ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
}
_SPARSE_NAMES = {v: k for k, v in SPARSE_LAYOUTS.items()}
#: Quantized dtype -> the integer dtype of its values (``int_repr()``).
QUANTIZED_INTS: dict[torch.dtype, torch.dtype] = {
    torch.quint8: torch.uint8,
    torch.qint8: torch.int8,
    torch.qint32: torch.int32,
}
#: The quantization schemes by their names in streams (the ones torch rebuilds from integer values).
QSCHEMES: dict[str, torch.qscheme] = {
    name: getattr(torch, name)
    for name in ("per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams")
}
_QSCHEME_NAMES = {v: k for k, v in QSCHEMES.items()}


def _reduce_sparse(t: torch.Tensor) -> Any:
    d = t.detach()
    layout = t.layout
    coalesced = False
    if layout is torch.sparse_coo:
        parts: tuple[torch.Tensor, ...] = (d._indices(), d._values())
        coalesced = d.is_coalesced()
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (d.crow_indices(), d.col_indices(), d.values())
    else:
        parts = (d.ccol_indices(), d.row_indices(), d.values())
    return rebuild_sparse, (_SPARSE_NAMES[layout], parts, tuple(t.shape), coalesced, bool(t.requires_grad))


def rebuild_sparse(
    layout: str, parts: tuple[torch.Tensor, ...], shape: tuple[int, ...], coalesced: bool, requires_grad: bool
) -> torch.Tensor:
    """Rebuild a sparse tensor from its index and value tensors, checking torch's invariants.

    ``parts`` is ``(indices, values)`` for ``sparse_coo``, else ``(compressed indices, plain
    indices, values)``. An index out of ``shape``, or indices that do not describe the layout,
    raise (torch's ``check_invariants``), as torch's own loader does after a load.
    """
    lay = SPARSE_LAYOUTS.get(layout) if isinstance(layout, str) else None
    if lay is None:
        raise pickle.UnpicklingError(f"sparse tensor payload names an unknown layout {layout!r}")
    if lay is torch.sparse_coo:
        indices, values = parts
        out = torch.sparse_coo_tensor(
            indices, values, shape, check_invariants=True, is_coalesced=bool(coalesced)
        )
    else:
        compressed, plain, values = parts
        out = torch.sparse_compressed_tensor(
            compressed, plain, values, shape, layout=lay, check_invariants=True
        )
    if requires_grad:
        out.requires_grad_(True)
    return out


def _reduce_quantized(t: torch.Tensor) -> Any:
    scheme = _QSCHEME_NAMES[t.qscheme()]
    if t.qscheme() is torch.per_tensor_affine:
        params: tuple[Any, ...] = (scheme, float(t.q_scale()), int(t.q_zero_point()))
    else:
        axis = int(t.q_per_channel_axis())
        params = (scheme, t.q_per_channel_scales(), t.q_per_channel_zero_points(), axis)
    return rebuild_quantized, (t.int_repr(), params)


def rebuild_quantized(values: torch.Tensor, params: tuple[Any, ...]) -> torch.Tensor:
    """Rebuild a quantized tensor from its integer values and quantization parameters, exactly.

    ``params`` is ``('per_tensor_affine', scale, zero_point)`` or
    ``(per-channel scheme name, scales, zero_points, axis)``; the quantized dtype follows the
    values' (``uint8``: ``quint8``, ``int8``: ``qint8``, ``int32``: ``qint32``).
    """
    if params[0] == "per_tensor_affine":
        return torch._make_per_tensor_quantized_tensor(values, params[1], params[2])
    if params[0] in QSCHEMES:
        return torch._make_per_channel_quantized_tensor(values, params[1], params[2], params[3])
    raise pickle.UnpicklingError(f"quantized tensor payload names an unknown scheme {params[0]!r}")


#: ``plain_dtype`` kept per dtype: the test alone is about 15 % of a small array's encoding.
_plain_cached = functools.lru_cache(maxsize=None)(plain_dtype)


def reduce_ndarray(a: np.ndarray) -> Any:
    """The pickle reduction of ``a``: large ones out of band, small 1-D ones as ``numpy.frombuffer``."""
    nbytes = a.nbytes
    if nbytes >= OOB_THRESHOLD:
        return a.__reduce_ex__(5)  # numpy's own: the buffer out of band
    if nbytes and a.ndim == 1:
        dt = a.dtype
        if _plain_cached(dt):  # the restricted loader's test of the dtype too
            # A small 1-D array: numpy.frombuffer over a bytearray copy (writable and owned on load,
            # as numpy's own form gives); stock pickle and the restricted loader both read it.
            return np.frombuffer, (bytearray(memoryview(cast(Any, a))), dt)
    if not a.dtype.isnative:
        # numpy's protocol-2 form loses a non-native byte order (``>i4`` comes back ``<i4`` through
        # pickle.loads): numpy's protocol-5 form of a C-ordered copy keeps the dtype, in band
        return (a if a.flags.c_contiguous else a.copy(order="C")).__reduce_ex__(5)
    return a.__reduce__()  # in band; loads faster than protocol 5's small buffers
