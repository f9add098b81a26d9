"""``mmengine.dist.utils`` by name: ``from mmengine.dist.utils import master_only`` ports as
``from hwdist.utils import master_only``.

Every public function of ``mmengine.dist.utils`` (mmengine 0.10), each the
hwdist function of the same name (also at ``hwdist``'s top level): process
and group queries, ``master_only``, ``barrier``, the device helpers, and
launching (``init_dist``, ``init_local_group``, ``infer_launcher``).
"""

from __future__ import annotations

from .collectives.tensor import barrier
from .info import (
    cast_data_device,
    get_backend,
    get_comm_device,
    get_data_device,
    get_default_group,
    get_dist_info,
    get_local_group,
    get_local_rank,
    get_local_size,
    get_rank,
    get_world_size,
    is_distributed,
    is_main_process,
    master_only,
)
from .launch import infer_launcher, init_dist, init_local_group

# In mmengine.dist.utils' order.
__all__ = [
    "is_distributed",
    "get_local_group",
    "get_default_group",
    "infer_launcher",
    "init_dist",
    "init_local_group",
    "get_backend",
    "get_world_size",
    "get_rank",
    "get_local_size",
    "get_local_rank",
    "get_dist_info",
    "is_main_process",
    "master_only",
    "barrier",
    "get_data_device",
    "get_comm_device",
    "cast_data_device",
]
