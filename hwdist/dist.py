"""``mmengine.dist.dist`` by name: ``from mmengine.dist.dist import all_reduce_dict`` ports as
``from hwdist.dist import all_reduce_dict``.

Every public function of ``mmengine.dist.dist`` (mmengine 0.10), each the
hwdist collective of the same name (also at ``hwdist``'s top level). The
names ``mmengine.dist.dist`` imports from its ``utils`` module
(``get_rank``, ``barrier``, ...) are attributes here too, as they are there.
"""

from __future__ import annotations

from .collectives.objects import all_gather_object, broadcast_object_list, gather_object
from .collectives.params import all_reduce_dict, all_reduce_params
from .collectives.results import collect_results, collect_results_cpu, collect_results_gpu
from .collectives.tensor import all_gather, all_reduce, broadcast, gather, sync_random_seed
from .collectives.tensor import barrier  # noqa: F401  (mmengine.dist.dist imports it from its utils module)
from .info import (  # noqa: F401  (what mmengine.dist.dist imports from its utils module)
    cast_data_device,
    get_backend,
    get_comm_device,
    get_data_device,
    get_default_group,
    get_dist_info,
    get_rank,
    get_world_size,
)

# In mmengine.dist.dist's order.
__all__ = [
    "all_reduce",
    "all_gather",
    "gather",
    "broadcast",
    "sync_random_seed",
    "broadcast_object_list",
    "all_reduce_dict",
    "all_gather_object",
    "gather_object",
    "collect_results",
    "collect_results_cpu",
    "collect_results_gpu",
    "all_reduce_params",
]
