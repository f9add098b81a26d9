"""Create and destroy the default process group through a driver.

``init_backend`` is the one place a process group is created: it binds the
device by LOCAL rank, registers custom backends with torch in this process,
and passes ``device_id`` where torch supports it. Launcher resolvers
(torchrun, Slurm, MPI) build on it.
"""

from __future__ import annotations

import datetime
from typing import Any, Optional, Union

import torch.distributed as torch_dist

from .. import _compat, info, registry

__all__ = ["init_backend", "destroy", "as_timedelta"]


def as_timedelta(timeout: Union[None, float, int, datetime.timedelta]) -> Optional[datetime.timedelta]:
    """Seconds (or a timedelta, or None) as a timedelta (or None)."""
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return datetime.timedelta(seconds=float(timeout))


def init_backend(
    backend: str,
    *,
    rank: int,
    world_size: int,
    local_rank: int = 0,
    init_method: Optional[str] = None,
    store: Optional[Any] = None,
    timeout: Union[None, float, datetime.timedelta] = None,
    **kwargs: Any,
) -> Any:
    """Initialise the default process group on ``backend``'s driver.

    Args:
        backend: a registered backend name, used as named (never replaced).
        rank: global rank. world_size: number of ranks.
        local_rank: rank on this node; the device is bound by it.
        init_method: torch init method (``env://``, ``tcp://``, ``file://``).
        store: a torch Store instead of ``init_method``.
        timeout: seconds (or timedelta) for collectives and rendezvous.
        **kwargs: passed on to ``torch.distributed.init_process_group``.

    Returns:
        The driver of the new default group.

    Raises:
        hwdist.BackendError: unknown or unavailable backend (lists available ones).
    """
    driver = registry.get_driver(backend)
    why = driver.unavailable_reason()
    if why is not None:
        raise registry.BackendError(
            f"backend {driver.name!r} is not available here: {why}."
            f" Available: {', '.join(registry.available_backends())}"
        )
    registry.ensure_torch_backend(driver)
    driver.set_device(local_rank)
    if _compat.INIT_HAS_DEVICE_ID and "device_id" not in kwargs:
        device_id = driver.device_id(local_rank)
        if device_id is not None:
            kwargs["device_id"] = device_id
    td = as_timedelta(timeout)
    if td is not None:
        kwargs["timeout"] = td
    if store is not None:
        kwargs["store"] = store
    elif init_method is not None:
        kwargs["init_method"] = init_method
    torch_dist.init_process_group(backend=driver.torch_name, rank=rank, world_size=world_size, **kwargs)
    registry.clear_cache()
    return driver


def destroy() -> None:
    """Destroy every process group hwdist or torch created; safe to call twice."""
    info._set_local_group(None)
    registry.clear_cache()
    if _compat.DIST_AVAILABLE and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
