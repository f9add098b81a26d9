"""hwdist: torch.distributed code that runs unchanged on any hardware.

``import hwdist as dist`` is a drop-in for ``mmengine.dist``. Importing it
changes no global state and imports no vendor package.

``__all__`` is the public surface: ``mmengine.dist``'s 31 names, the
collectives of ``torch.distributed`` that mmengine does not wrap, and hwdist's
core (the backend registry, ``Driver``/``Plan``, ``detect``, the error root,
verification mode). Everything else has its home in a submodule:
[`hwdist.serialization`][hwdist.serialization] (serializers, the restricted
loader), [`hwdist.launch`][hwdist.launch], [`hwdist.training`][hwdist.training],
[`hwdist.errors`][hwdist.errors], [`hwdist.flight`][hwdist.flight],
``hwdist.testing``; [`hwdist.utils`][hwdist.utils] and
[`hwdist.dist`][hwdist.dist] mirror ``mmengine.dist.utils`` and
``mmengine.dist.dist``. Names that left ``__all__`` stay attributes of
``hwdist`` (``hwdist.PickleSerializer``, ``hwdist.sync_grad``, ...), so code
written against the earlier surface keeps working; new code imports them
from their home.
"""

from __future__ import annotations

# ---- the public surface (__all__) -------------------------------------------------------------
from . import dist, utils  # mmengine.dist.dist and mmengine.dist.utils, by name
from .collectives.objects import scatter_object_list
from .collectives.tensor import all_to_all, irecv, isend, recv, reduce, reduce_scatter, scatter, send
from .collectives.verify import CollectiveMismatch, set_verification, verification, verification_enabled

# The function hwdist.detect; its module is hwdist.detection (so neither hides the other).
from .detection import Detection, detect, get_device
from .dist import *  # noqa: F401,F403  (mmengine.dist.dist's 13 names)
from .drivers.base import Driver, Plan, PlanError
from .errors import HwdistError
from .registry import (
    available_backends,
    get_driver,
    list_backends,
    register_backend,
    resolve,
    unregister_backend,
)
from .utils import *  # noqa: F401,F403  (mmengine.dist.utils' 18 names)

# ---- kept as attributes for code written against the earlier surface (not in __all__) ----------
from .collectives.objects import *  # noqa: F401,F403
from .collectives.results import *  # noqa: F401,F403
from .collectives.tensor import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403
from .flight import dump_flight_record  # noqa: F401
from .info import *  # noqa: F401,F403
from .launch import *  # noqa: F401,F403
from .serialization import (  # noqa: F401
    PickleSerializer,
    RestrictedPickleSerializer,
    RestrictedUnpickler,
    Serializer,
    UnpicklingRefused,
    get_serializer,
    obj2tensor,
    object_to_tensor,
    register_safe_class,
    restricted_loads,
    safe_globals,
    set_serializer,
    tensor2obj,
    tensor_to_object,
    use_serializer,
)
from .training import *  # noqa: F401,F403

__version__ = "0.1.0"

__all__ = [
    *dist.__all__,  # mmengine.dist's 31 names: its dist module's 13 and its utils module's 18
    *utils.__all__,
    # torch.distributed's collectives that mmengine does not wrap
    "reduce",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "send",
    "recv",
    "isend",
    "irecv",
    "scatter_object_list",
    # the backend registry and drivers
    "register_backend",
    "unregister_backend",
    "get_driver",
    "list_backends",
    "available_backends",
    "resolve",
    "Driver",
    "Plan",
    "PlanError",
    # detection
    "detect",
    "Detection",
    "get_device",
    # the error root, and verification mode
    "HwdistError",
    "CollectiveMismatch",
    "verification",
    "set_verification",
    "verification_enabled",
]
