"""Training-loop helpers: gradient, parameter, buffer and metric synchronisation.

Everything here dispatches through the group's driver like the collectives
([`hwdist.all_reduce`][hwdist.collectives.tensor.all_reduce],
[`hwdist.broadcast`][hwdist.collectives.tensor.broadcast]), packs many tensors with the flat-buffer
helpers of [`hwdist.collectives.params`][hwdist.collectives.params], and validates its input so that a bad
or mismatched argument raises on *every* rank (one tiny check collective) instead of leaving the others
waiting. See docs/training.md.

Helpers from the prior art: MegEngine ([`GradientSynchronizer`][hwdist.training.GradientSynchronizer],
[`bcast_list_`][hwdist.training.bcast_list_], [`synchronized`][hwdist.training.synchronized],
[`check_fork_safe`][hwdist.training.check_fork_safe]), demucs' ``distrib.py``
([`sync_grad`][hwdist.training.sync_grad], [`broadcast_tensors`][hwdist.training.broadcast_tensors],
[`sync_buffer`][hwdist.training.sync_buffer], [`average_metrics`][hwdist.training.average_metrics],
``rank``/``world_size``) and vis4d ([`synchronize`][hwdist.training.synchronize],
[`is_module_wrapper`][hwdist.training.is_module_wrapper]; ``rank_zero_only`` and ``get_local_rank`` live in
[`hwdist.info`][hwdist.info]).

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

from ..info import get_rank, get_world_size
from .broadcasts import bcast_list_, broadcast_tensors, sync_buffer
from .grads import sync_grad
from .helpers import check_fork_safe, is_module_wrapper, synchronize, synchronized
from .metrics import average_metrics
from .synchronizer import GradientSynchronizer

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

rank = get_rank
"""Alias of [`hwdist.get_rank`][hwdist.info.get_rank] (demucs' ``distrib.rank()``)."""
world_size = get_world_size
"""Alias of [`hwdist.get_world_size`][hwdist.info.get_world_size] (demucs' ``distrib.world_size()``)."""
