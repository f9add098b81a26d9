"""The ``pytorch`` launcher: torchrun, ``torch.distributed.launch`` or a hand-set environment."""

from __future__ import annotations

from collections.abc import Mapping

from .base import Launcher, LaunchInfo, env_int, require_int

__all__ = ["TorchrunLauncher"]


class TorchrunLauncher(Launcher):
    """Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_*``."""

    name = "pytorch"
    priority = 30
    description = "torchrun / torch.distributed.launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)"

    def detect(self, env: Mapping[str, str]) -> bool:
        """``WORLD_SIZE`` is set (mmengine's rule)."""
        return "WORLD_SIZE" in env

    def resolve(self, env: Mapping[str, str]) -> LaunchInfo:
        """Read torchrun's variables; ``LOCAL_RANK`` defaults to ``RANK % LOCAL_WORLD_SIZE`` (or ``RANK``)."""
        rank = require_int(env, self.name, "RANK")
        world = require_int(env, self.name, "WORLD_SIZE")
        local_size = env_int(env, "LOCAL_WORLD_SIZE")
        local = env_int(env, "LOCAL_RANK")
        if local is None:
            local = rank % local_size if local_size else rank
        return self.launch_info(env, rank, world, local, local_size, env_int(env, "GROUP_RANK", "NODE_RANK"))
