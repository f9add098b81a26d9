"""The kinds of torch object that torch's ``weights_only=True`` loader accepts, and a comparison for them.

Used by the serialization tests in one process and by the object collectives' tests on real ranks:
a module's ``state_dict()`` (an ``OrderedDict`` carrying ``_metadata``), sparse tensors of every
layout, quantized tensors of every scheme torch rebuilds from integer values, and meta tensors.
Everything is built from a seed, so each rank can build what every other rank sent.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def model(seed: int) -> torch.nn.Module:
    """A small model with BatchNorm whose running statistics have moved off their defaults."""
    gen = torch.Generator().manual_seed(seed)
    nn = torch.nn
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    m.train()
    m(torch.randn(8, 3, generator=gen))  # running_mean, running_var, num_batches_tracked change
    return m


def sparse_tensors(seed: int) -> dict[str, torch.Tensor]:
    """One sparse tensor of each layout (COO coalesced or not, hybrid; CSR, CSC, BSR, BSC)."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])  # (0, 2) twice: uncoalesced
    values = torch.randn(4, generator=gen)
    def sparse(i: torch.Tensor, v: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.sparse_coo_tensor(i, v, shape, check_invariants=True)

    coo = sparse(idx, values, (2, 3))
    dense = torch.randn(4, 4, generator=gen) * (torch.rand(4, 4, generator=gen) > 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        return {
            "coo": coo,
            "coo_coalesced": coo.coalesce(),
            "coo_hybrid": sparse(idx, torch.randn(4, 2, generator=gen), (2, 3, 2)),
            "coo_requires_grad": coo.coalesce().requires_grad_(True),
            "coo_int32_values": sparse(idx, torch.arange(4, dtype=torch.int32), (2, 3)),
            "csr": dense.to_sparse_csr(),
            "csc": dense.to_sparse_csc(),
            "bsr": dense.to_sparse_bsr((2, 2)),
            "bsc": dense.to_sparse_bsc((2, 2)),
        }


def quantized_tensors(seed: int) -> dict[str, torch.Tensor]:
    """One quantized tensor of each dtype and scheme torch rebuilds from its integer values."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13+: quantized dtypes are deprecated
        return {
            "per_tensor_quint8": torch.quantize_per_tensor(x, 0.05, 7, torch.quint8),
            "per_tensor_qint8": torch.quantize_per_tensor(x, 0.02, -3, torch.qint8),
            "per_tensor_qint32": torch.quantize_per_tensor(x, 0.001, 11, torch.qint32),
            "per_channel_qint8": torch.quantize_per_channel(
                x, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), torch.tensor([0, 1, -1]), 0,
                torch.qint8,
            ),
            "per_channel_axis1": torch.quantize_per_channel(
                x, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), torch.tensor([1, 2, 3, 4]), 1,
                torch.quint8,
            ),
            "per_channel_float_qparams": torch.quantize_per_channel(
                x, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.0, 0.5, 1.0]), 0, torch.quint8
            ),
        }


def everything(seed: int) -> dict[str, Any]:
    """A state_dict, the sparse and quantized tensors, and a meta tensor, in one object."""
    return {
        "state_dict": model(seed).state_dict(),
        **sparse_tensors(seed),
        **quantized_tensors(seed),
        "meta": torch.empty(2, 3, device="meta"),
    }


def same_tensor(a: torch.Tensor, b: Any) -> bool:
    """Equal kind, layout, dtype, shape, requires_grad and values (quantization parameters included)."""
    if not isinstance(b, torch.Tensor) or type(a) is not type(b):
        return False
    kind = (a.layout, a.dtype, a.shape, a.requires_grad, a.is_meta)
    if kind != (b.layout, b.dtype, b.shape, b.requires_grad, b.is_meta):
        return False
    if a.is_meta:
        return True
    if a.is_quantized:
        if a.qscheme() != b.qscheme() or not torch.equal(a.int_repr(), b.int_repr()):
            return False
        if a.qscheme() == torch.per_tensor_affine:
            return (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point())
        return (
            torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales())
            and torch.equal(a.q_per_channel_zero_points(), b.q_per_channel_zero_points())
            and a.q_per_channel_axis() == b.q_per_channel_axis()
        )
    if a.layout == torch.sparse_coo and a.is_coalesced() != b.is_coalesced():
        return False
    if a.layout != torch.strided:
        return torch.equal(a.detach().to_dense(), b.detach().to_dense())
    return torch.equal(a.detach(), b.detach())


def same(a: Any, b: Any) -> bool:
    """Deep equality of what :func:`everything` builds, ``_metadata`` of an OrderedDict included."""
    if isinstance(a, torch.Tensor):
        return same_tensor(a, b)
    if isinstance(a, dict):
        if type(a) is not type(b) or list(a) != list(b):
            return False
        if getattr(a, "__dict__", {}) != getattr(b, "__dict__", {}):  # a state_dict's _metadata
            return False
        return all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)
