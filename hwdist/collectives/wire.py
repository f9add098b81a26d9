"""The wire helpers of the collective engine, for the other parts of hwdist that apply a plan.

hwdist/collectives/_wire.py holds them; the ``hwdist`` torch backend (hwdist/backend/) applies a
driver's plan around torch's own calls with the same helpers, so a call travels exactly as the same
hwdist collective would.
"""

from __future__ import annotations

from ._wire import (
    comm_device,
    comm_numel,
    copy_source,
    exact_mean,
    finish_reduction,
    from_comm,
    join_mean,
    prepare,
    restore,
    split_mean,
    torch_op,
)

__all__ = [
    "comm_device",
    "comm_numel",
    "copy_source",
    "exact_mean",
    "finish_reduction",
    "from_comm",
    "join_mean",
    "prepare",
    "restore",
    "split_mean",
    "torch_op",
]
