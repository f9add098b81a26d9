"""hwdist: torch.distributed code that runs unchanged on any hardware.

``import hwdist as dist`` is a drop-in for ``mmengine.dist``. Importing it
changes no global state and imports no vendor package.
"""

from __future__ import annotations

from . import info as _info
from . import launch as _launch
from . import registry as _registry
from . import training as _training
from .collectives import objects as _objects
from .collectives import params as _params
from .collectives import results as _results
from .collectives import tensor as _tensor
from .collectives.objects import *  # noqa: F401,F403
from .collectives.params import *  # noqa: F401,F403
from .collectives.results import *  # noqa: F401,F403
from .collectives.tensor import *  # noqa: F401,F403
# The function hwdist.detect; its module is hwdist.detection (so neither hides the other).
from .detection import Detection, detect, get_device
from .drivers.base import Driver, Plan, PlanError
from .info import *  # noqa: F401,F403
from .launch import *  # noqa: F401,F403
from .training import *  # noqa: F401,F403
from .registry import (  # noqa: F401  (in __all__ through _registry.__all__)
    BackendError,
    available_backends,
    get_driver,
    list_backends,
    register_backend,
    resolve,
    unregister_backend,
)

from .verify import CollectiveMismatch, set_verification, verification, verification_enabled
from .errors import HwdistError
from .flight import dump_flight_record

__version__ = "0.1.0"

# The package's public surface: each submodule's public names (the registry's without its plug-in
# plumbing, ENTRY_POINT_GROUP and record_group), and the single names re-exported from elsewhere.
__all__ = [
    "__version__",
    "Driver",
    "Plan",
    "PlanError",
    "HwdistError",
    *(n for n in _registry.__all__ if n not in ("ENTRY_POINT_GROUP", "record_group")),
    "Detection",
    "detect",
    "get_device",
    "CollectiveMismatch",
    "verification",
    "set_verification",
    "verification_enabled",
    "dump_flight_record",
    *_info.__all__,
    *_launch.__all__,
    *_tensor.__all__,
    *_params.__all__,
    *_objects.__all__,
    *_results.__all__,
    *_training.__all__,
]
