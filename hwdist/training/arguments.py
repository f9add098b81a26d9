"""The argument checks of the training helpers, and the one check that makes every rank raise together."""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import torch
import torch.distributed as torch_dist

from .. import registry
from ..collectives import tensor as _t
from ..collectives.engine import view
from ..collectives.protocol import agree
from ..info import is_distributed

Tensor = torch.Tensor
MiB = 1024 * 1024


def _digest(value: object) -> tuple[int, int]:
    """Two 31-bit words of a hash of ``repr(value)``."""
    raw = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(raw[:4], "little") >> 1, int.from_bytes(raw[4:], "little") >> 1


def _describe(tensors: Sequence[Tensor]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in tensors]


def check_same_tensors(
    fn: str,
    tensors: Sequence[Tensor],
    group: Any,
    *,
    problem: Optional[Exception] = None,
    flag: int = 0,
    config: Optional[dict[str, Any]] = None,
) -> int:
    """Check that every rank holds the same number, shapes and dtypes of ``tensors`` (and ``config``).

    One ``collectives.protocol.agree`` exchange of the count, a
    62-bit fingerprint of shapes and dtypes, a 31-bit one of ``config``
    (arguments that decide the collectives, e.g. the bucket sizes) and
    ``flag``. When a rank's input was invalid (``problem``: raised there; a
    [`CollectiveArgumentError`][hwdist.collectives.objects.CollectiveArgumentError] naming
    that rank on the others) or the layouts differ, every rank raises.
    Returns the MAX of ``flag`` over the ranks. Needs an initialised process group.
    """
    driver = registry.resolve(group, tensors[0].device if tensors and problem is None else None)
    n = len(tensors)
    words = (n, *_digest(_describe(tensors)), _digest(sorted((config or {}).items()))[0])
    agreed = agree(fn, group, problem=problem, words=words, flag=flag, driver=driver)
    if agreed.same:
        return agreed.flag
    me = torch_dist.get_rank()
    if agreed.highest[0] != agreed.lowest[0]:
        raise ValueError(
            f"{fn}: every rank must pass the same number of tensors; rank {me} passed {n},"
            f" the ranks passed between {agreed.lowest[0]} and {agreed.highest[0]}"
        )
    if agreed.highest[1:3] != agreed.lowest[1:3]:
        shown = ", ".join(f"{s}:{d}" for s, d in _describe(tensors)[:6])
        raise ValueError(
            f"{fn}: every rank must pass tensors of the same shapes and dtypes in the same order;"
            f" they differ across ranks (rank {me}: {n} tensors: {shown}{', ...' if n > 6 else ''})"
        )
    given = ", ".join(f"{k}={v!r}" for k, v in (config or {}).items())
    raise ValueError(
        f"{fn}: every rank must pass the same {', '.join(config or {})} (they decide the collectives each"
        f" rank issues); they differ across ranks (rank {me}: {given})"
    )


def tensor_list(values: Any, fn: str, argname: str) -> list[Tensor]:
    """``values`` (a list or generator) as a list of tensors; TypeError naming the bad item."""
    if isinstance(values, torch.Tensor):
        raise TypeError(f"{fn}: {argname} must be a list or iterable of tensors, got a single tensor")
    try:
        items = list(values)
    except TypeError:
        raise TypeError(
            f"{fn}: {argname} must be a list or iterable of tensors, got {type(values).__name__}"
        ) from None
    for i, t in enumerate(items):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {argname}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    return items


def grad_op(op: Any, fn: str) -> str:
    """``op`` as 'mean' or 'sum'; ValueError for any other reduce op."""
    rop = _t.normalize_reduce_op(op, "op", fn)
    if rop not in ("sum", "mean"):
        raise ValueError(f"{fn}: op must be 'mean' or 'sum' for gradients, got {op!r}")
    return rop


def distributed_size(group: Any) -> int:
    """The size of ``group``, or 1 without a process group."""
    return torch_dist.get_world_size(group) if is_distributed() else 1


def check_rank(value: Any, argname: str, fn: str, group: Any) -> int:
    """``value`` as a global rank of ``group`` (TypeError / ValueError naming ``argname``)."""
    return view(group).check_rank(value, argname, fn)  # type: ignore[no-any-return]
