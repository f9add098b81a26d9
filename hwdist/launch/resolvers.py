"""Launcher resolvers: what a launcher told this process, read from its environment.

A [`Launcher`][hwdist.launch.resolvers.Launcher] knows how to recognise its environment (``detect``) and
how to turn it into a [`LaunchInfo`][hwdist.launch.resolvers.LaunchInfo] (``resolve``): global rank, world
size, local rank, node and rendezvous address. Resolvers are pure: they read
a mapping (``os.environ`` by default) and never write it; ``init_dist``
exports the result with
[`LaunchInfo.exports`][hwdist.launch.resolvers.LaunchInfo.exports], which
never overwrites a variable the user already set.

Launchers are registered like backends: the built-in ones (``pytorch``,
``mpi``, ``slurm``, ``none``) at import, third-party ones with
[`register_launcher`][hwdist.launch.resolvers.register_launcher] or the
``hwdist.launchers`` entry-point group.
[`infer_launcher`][hwdist.launch.resolvers.infer_launcher] tries them in ``priority`` order.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, TypeVar, Union, overload

from .._plugins import load_plugins, register_or_decorate

__all__ = [
    "LaunchInfo",
    "Launcher",
    "LauncherError",
    "register_launcher",
    "unregister_launcher",
    "get_launcher",
    "list_launchers",
    "infer_launcher",
    "LAUNCHER_ENTRY_POINT_GROUP",
    "NoLauncher",
    "LauncherVariables",
    "LAUNCHER_VARIABLES",
    "LOCAL_RANK_VARS",
    "LOCAL_SIZE_VARS",
]

LAUNCHER_ENTRY_POINT_GROUP = "hwdist.launchers"


from ..errors import LauncherError  # noqa: E402


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job, as a launcher describes it.

    Attributes:
        launcher: launcher name ('pytorch', 'slurm', 'mpi', ...).
        rank: global rank. world_size: number of ranks.
        local_rank: rank on this node (the device is bound by it).
        local_world_size: ranks on this node, if known.
        node_rank: index of this node, if the launcher says; in what ``init_dist`` returns, always
            set (from the hosts, in rank order, when the launcher does not say, as under mpiexec).
        master_addr: rendezvous host, if known. master_port: its port, if known.
        backend: the backend chosen (filled in by ``init_dist``).
        extra: further variables to export (a custom launcher's own).
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: Optional[int] = None
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    backend: Optional[str] = None
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise LauncherError(f"{self.launcher}: world size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise LauncherError(
                f"{self.launcher}: rank {self.rank} is outside world size {self.world_size}"
            )
        if self.local_rank < 0:
            raise LauncherError(f"{self.launcher}: local rank must be >= 0, got {self.local_rank}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise LauncherError(
                f"{self.launcher}: the rendezvous port (MASTER_PORT) must be in 1..65535,"
                f" got {self.master_port}"
            )
        if self.local_world_size is not None and not 0 <= self.local_rank < self.local_world_size:
            raise LauncherError(
                f"{self.launcher}: local rank {self.local_rank} is outside local world size"
                f" {self.local_world_size}"
            )

    def exports(self) -> dict[str, str]:
        """The torch environment variables this launch implies (``RANK``, ``MASTER_ADDR``, ...)."""
        out = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
        }
        if self.local_world_size is not None:
            out["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        if self.node_rank is not None:
            out["GROUP_RANK"] = str(self.node_rank)
        if self.master_addr is not None:
            out["MASTER_ADDR"] = self.master_addr
        if self.master_port is not None:
            out["MASTER_PORT"] = str(self.master_port)
        out.update(self.extra)
        return out


def env_int(env: Mapping[str, str], *names: str, what: str = "") -> Optional[int]:
    """The first of ``names`` set in ``env``, as an int (None if none is set).

    Raises:
        LauncherError: the variable is set but is not an integer.
    """
    for name in names:
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            return int(raw.strip())
        except ValueError:
            raise LauncherError(
                f"environment variable {name} must be an integer{' (' + what + ')' if what else ''},"
                f" got {raw!r}"
            ) from None
    return None


def require_int(env: Mapping[str, str], launcher: str, *names: str) -> int:
    """Like [`env_int`][hwdist.launch.resolvers.env_int] but raises a clear error naming the variables when
    unset."""
    value = env_int(env, *names)
    if value is None:
        raise LauncherError(
            f"launcher {launcher!r}: none of {', '.join(names)} is set; is this process started by"
            f" the {launcher} launcher?"
        )
    return value


def check_consistent(env: Mapping[str, str], launcher: str, name: str, value: int, source: str) -> None:
    """Raise if the user set torch variable ``name`` to something other than ``value``."""
    user = env_int(env, name)
    if user is not None and user != value:
        raise LauncherError(
            f"launcher {launcher!r}: {name}={user} is set in the environment but {source} says"
            f" {value}; unset {name}, or use launcher='pytorch' to take {name} as given"
        )


# The launcher variable table lives in hwdist.launch_env (data every part reads); re-exported here.
from ..launch_env import LAUNCHER_VARIABLES, LOCAL_RANK_VARS, LOCAL_SIZE_VARS, LauncherVariables  # noqa: E402



class Launcher:
    """Base class for launcher resolvers; subclass and set ``name`` and ``priority``."""

    #: Name users pass to ``init_dist(launcher=...)``.
    name: ClassVar[str] = ""
    #: ``infer_launcher`` order: higher is tried first.
    priority: ClassVar[int] = 0
    #: One line for docs and errors.
    description: ClassVar[str] = ""
    #: Whether ``init_dist`` creates a process group for this launcher.
    distributed: ClassVar[bool] = True

    def detect(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` looks like this launcher started the process."""
        return False

    def resolve(self, env: Mapping[str, str]) -> LaunchInfo:
        """The [`LaunchInfo`][hwdist.launch.resolvers.LaunchInfo] for ``env`` (pure: reads, never writes)."""
        raise NotImplementedError

    def rendezvous(self, info: LaunchInfo, timeout: Any) -> Optional[Any]:
        """A torch Store for ranks without ``MASTER_ADDR``/``MASTER_PORT``, or None for ``env://``."""
        return None

    def launch_info(
        self,
        env: Mapping[str, str],
        rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: Optional[int] = None,
        node_rank: Optional[int] = None,
        master_addr: Optional[str] = None,
        master_port: Optional[int] = None,
    ) -> LaunchInfo:
        """This launcher's [`LaunchInfo`][hwdist.launch.resolvers.LaunchInfo]: what ``resolve`` returns.

        ``master_addr``/``master_port`` left None are read from ``env``'s ``MASTER_ADDR``/``MASTER_PORT``.
        """
        return LaunchInfo(
            launcher=self.name,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
            master_addr=(env.get("MASTER_ADDR") or None) if master_addr is None else master_addr,
            master_port=env_int(env, "MASTER_PORT") if master_port is None else master_port,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


_lock = threading.RLock()
_launchers: dict[str, Launcher] = {}
#: Other names accepted for a launcher.
_ALIASES = {"torchrun": "pytorch"}
_entry_points_loaded = False
L = TypeVar("L", bound=Union[Launcher, type])


def _register(name: str, launcher: Any, override: bool) -> Launcher:
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise LauncherError(f"launcher name must be a non-empty str without spaces, got {name!r}")
    key = name.lower()
    if key in ("auto",):
        raise LauncherError(f"cannot register launcher {name!r}: the name is reserved")
    inst = launcher() if isinstance(launcher, type) else launcher
    for member in ("detect", "resolve", "priority"):
        if not hasattr(inst, member):
            raise LauncherError(
                f"launcher {name!r} ({type(inst).__name__}) lacks {member!r}; expected a"
                " hwdist.Launcher subclass"
            )
    inst.name = key  # type: ignore[misc]
    with _lock:
        if key in _launchers and not override:
            raise LauncherError(
                f"launcher {key!r} is already registered ({_launchers[key]!r}); pass override=True"
                f" to replace it. Registered: {', '.join(_launchers)}"
            )
        _launchers[key] = inst
    return inst


@overload
def register_launcher(name: str, launcher: None = None, *, override: bool = False) -> Callable[[L], L]: ...
@overload
def register_launcher(name: str, launcher: Any, *, override: bool = False) -> Launcher: ...
def register_launcher(name: str, launcher: Any = None, *, override: bool = False) -> Any:
    """Register a launcher resolver under ``name``; also usable as a class decorator.

    Args:
        name: the name users pass to ``init_dist(launcher=...)``.
        launcher: a [`Launcher`][hwdist.launch.resolvers.Launcher] instance or subclass
            (omit for decorator use).
        override: replace an existing registration instead of raising.

    Raises:
        LauncherError: duplicate name without ``override``, malformed launcher.

    Examples:
        >>> @hwdist.register_launcher("mycluster")
        ... class MyCluster(hwdist.Launcher):
        ...     priority = 25
        ...     def detect(self, env): return "MYCLUSTER_RANK" in env
        ...     def resolve(self, env): ...
    """
    return register_or_decorate(_register, name, launcher, override)  # hwdist.register_backend's style


def unregister_launcher(name: str) -> Launcher:
    """Remove launcher ``name`` and return it.

    Raises:
        LauncherError: ``name`` is not registered.
    """
    with _lock:
        try:
            return _launchers.pop(name.lower())
        except KeyError:
            raise LauncherError(f"unknown launcher {name!r}; registered: {', '.join(_launchers)}") from None


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    load_plugins(
        LAUNCHER_ENTRY_POINT_GROUP,
        "launcher",
        _launchers.__contains__,
        lambda n, obj: _register(n, obj, False),
    )


def list_launchers() -> list[str]:
    """Registered launcher names, in ``infer_launcher`` order (highest priority first)."""
    _load_entry_points()
    with _lock:
        items = list(_launchers.values())
    return [x.name for x in sorted(items, key=lambda x: -x.priority)]


def get_launcher(name: str) -> Launcher:
    """The launcher registered under ``name``.

    Raises:
        LauncherError: unknown name (the message lists the registered ones).
    """
    if not isinstance(name, str):
        raise LauncherError(f"launcher must be a str, got {type(name).__name__}: {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    found = _launchers.get(key)
    if found is None:
        _load_entry_points()
        found = _launchers.get(key)
    if found is None:
        raise LauncherError(
            f"unknown launcher {name!r}; expected 'auto' or one of: {', '.join(list_launchers())}"
        )
    return found


def _mmengine_rules() -> list[tuple[str, str]]:
    """mmengine's ``infer_launcher`` rules, in its order: the first variable set names the launcher."""
    from .mpi import MpiLauncher
    from .slurm import SlurmLauncher
    from .torchrun import TorchrunLauncher

    return [
        ("WORLD_SIZE", TorchrunLauncher.name),
        ("SLURM_NTASKS", SlurmLauncher.name),
        ("OMPI_COMM_WORLD_LOCAL_RANK", MpiLauncher.name),
    ]


def infer_launcher(env: Optional[Mapping[str, str]] = None) -> str:
    """The launcher that started this process, from its environment (mmengine's answer).

    Every environment mmengine recognises gets mmengine's answer, in its order:
    ``WORLD_SIZE`` set: ``'pytorch'`` (torchrun, ``torch.distributed.launch``,
    manual env); else ``SLURM_NTASKS``: ``'slurm'``; else
    ``OMPI_COMM_WORLD_LOCAL_RANK``: ``'mpi'``. So ``mpirun`` inside an
    ``sbatch`` allocation is ``'slurm'``, as in mmengine: pass
    ``init_dist('mpi')`` there. Where mmengine answers ``'none'``, hwdist
    goes on: a launcher registered with a higher priority than the built-in
    one that matched is tried first, and the built-in launchers' own
    detection adds MPICH/Intel MPI/MVAPICH (``PMI_SIZE``, ``MV2_COMM_WORLD_SIZE``)
    as ``'mpi'``; else ``'none'``.

    Args:
        env: the environment to read (default ``os.environ``).

    Returns:
        A registered launcher name.

    Examples:
        >>> hwdist.infer_launcher({"SLURM_NTASKS": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
        'slurm'
        >>> hwdist.infer_launcher({"PMI_RANK": "0", "PMI_SIZE": "2"})   # mmengine: 'none'
        'mpi'
    """
    import os

    env = os.environ if env is None else env
    rules = _mmengine_rules()
    answer = next((name for var, name in rules if var in env), None)
    builtin = {name for _, name in rules}
    for name in list_launchers():
        if name == answer:
            return name
        if name in builtin and answer is not None:
            continue  # a built-in launcher never overrides mmengine's answer
        if _launchers[name].detect(env):
            return name
    return answer or "none"


class NoLauncher(Launcher):
    """``'none'``: a single, non-distributed process (``init_dist`` creates no group)."""

    name = "none"
    priority = -1000
    description = "not distributed: no process group"
    #: Whether ``init_dist`` creates a process group for this launcher.
    distributed = False

    def detect(self, env: Mapping[str, str]) -> bool:
        """Never detected; it is what ``infer_launcher`` returns when nothing else matches."""
        return False

    def resolve(self, env: Mapping[str, str]) -> LaunchInfo:
        """Rank 0 of 1, on node 0."""
        return LaunchInfo(
            launcher=self.name, rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0
        )
