"""demucs' ``average_metrics``: a count-weighted average of a dict of numbers over the ranks."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import torch

from .. import registry
from ..collectives.call_entry import collective
from ..collectives.params import all_reduce_dict, check_same_dicts
from .arguments import distributed_size


@collective(2)
def average_metrics(
    metrics: Mapping[str, Any], count: float = 1.0, group: Optional[Any] = None
) -> dict[str, float]:
    """The count-weighted average of a dict of numbers over the ranks.

    demucs' ``average_metrics``: each rank passes its metrics (Python
    numbers or one-element tensors) and the number of samples they were
    computed on; every rank gets ``{key: sum_r(count_r * value_r) /
    sum_r(count_r)}`` as floats (``nan`` where the counts sum to 0; a rank
    with ``count=0`` contributes nothing, even a ``nan`` value). Sums
    travel in float64 where the backend reduces it (else float32), one
    collective for all keys, plus a tiny check that every rank passes the
    same keys (a mismatch or a bad value raises on every rank, naming it).
    Not distributed (one process): ``metrics`` itself, unchanged, as demucs does.

    Args:
        metrics: ``{name: number}``; every rank must pass the same names.
        count: this rank's weight (e.g. its number of samples), ``>= 0``.
        group: process group (default group if None).

    Returns:
        A new dict with the same keys, in the given order (``metrics`` itself on one process).

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
        failure = exc
    ws = distributed_size(group)
    if ws <= 1:
        if failure is not None:
            raise type(failure)(f"{fn}: {failure}")
        return metrics  # type: ignore[return-value]  # demucs: unchanged when not distributed
    driver = registry.resolve(group, None)
    try:
        driver.plan("all_reduce", torch.float64, "sum")
        dtype = torch.float64
    except TypeError:  # the backend cannot reduce float64: float32 still sums counts exactly up to 2**24
        dtype = torch.float32
    keys = sorted(values) if failure is None else []
    cdev = driver.comm_device()
    # a zero weight contributes nothing, not even a NaN or inf value (nan * 0 is nan)
    data = {
        k: torch.tensor([values[k] * weight if weight > 0 else 0.0, weight], dtype=dtype, device=cdev)
        for k in keys
    }
    # every rank raises together: the bad rank its own error, the others a ValueError naming it
    problem = None if failure is None else ValueError(f"{type(failure).__name__}: {failure}")
    try:
        check_same_dicts(fn, keys, [data[k] for k in keys], problem, group, driver=driver, what="keys")
    except ValueError:
        if failure is not None:
            raise type(failure)(f"{fn}: {failure}") from None
        raise
    all_reduce_dict(data, "sum", group, verify=False)
    out: dict[str, float] = {}
    for k in values:
        total, n = data[k].tolist()
        out[k] = total / n if n > 0 else math.nan
    return out


def _as_float(value: Any, name: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"{name} must be a number or a one-element tensor, got a tensor of shape {tuple(value.shape)}"
            )
        return float(value.item())
    if isinstance(value, (int, float)) or hasattr(value, "__float__"):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r:.60}")
