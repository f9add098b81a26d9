"""How a driver without a process-group factory starts (the start-up rule's fallback).

A driver whose device type is the CPU and that gives no
``process_group_factory`` runs over gloo under its own backend name: hwdist
registers this factory with torch for it. See ``docs/writing-a-driver.md``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

#: The device type whose drivers may omit a factory.
FALLBACK_DEVICE_TYPE = "cpu"


def gloo_process_group(store: Any, rank: int, size: int, timeout: Any) -> Any:
    """A gloo process group (the factory CPU drivers without one get)."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(store, rank, size, timeout)


def fallback_process_group_factory(device_type: str) -> Optional[Callable[..., Any]]:
    """The factory a driver without one starts with: gloo for CPU drivers, else None."""
    return gloo_process_group if device_type == FALLBACK_DEVICE_TYPE else None
