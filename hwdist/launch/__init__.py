"""Process-group start-up: launcher resolvers, init_dist and local groups.

One resolver per launcher (``torchrun.py``, ``slurm.py``, ``mpi.py``), kept
in a registry like the backends ([`register_launcher`][hwdist.launch.resolvers.register_launcher]).
"""

from __future__ import annotations

from .core import LEGACY_BACKEND_IDS, destroy, init_backend, init_dist, init_local_group, new_group
from .mpi import MpiLauncher
from .resolvers import (
    Launcher,
    LauncherError,
    LaunchInfo,
    NoLauncher,
    get_launcher,
    infer_launcher,
    list_launchers,
    register_launcher,
    unregister_launcher,
)
from .slurm import SlurmLauncher
from .torchrun import TorchrunLauncher

#: Registered at import (a dict insert each).
BUILTIN_LAUNCHERS = (TorchrunLauncher, MpiLauncher, SlurmLauncher, NoLauncher)
for _cls in BUILTIN_LAUNCHERS:
    register_launcher(_cls.name, _cls, override=False)
del _cls

__all__ = [
    "init_backend",
    "destroy",
    "init_dist",
    "init_local_group",
    "new_group",
    "infer_launcher",
    "Launcher",
    "LaunchInfo",
    "LauncherError",
    "register_launcher",
    "unregister_launcher",
    "get_launcher",
    "list_launchers",
    "LEGACY_BACKEND_IDS",
]
