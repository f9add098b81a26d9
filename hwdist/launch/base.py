"""What every launcher resolver is made of: [`LaunchInfo`][hwdist.launch.base.LaunchInfo] (what a launcher
told this process), the [`Launcher`][hwdist.launch.base.Launcher] base class and the helpers that read a
launcher's environment variables. The registry of launchers is ``launch.resolvers``; each built-in
launcher (``torchrun.py``, ``slurm.py``, ``mpi.py``) builds on this module alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from ..errors import LauncherError

__all__ = ["LaunchInfo", "Launcher", "env_int", "require_int", "check_consistent"]


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
            raise LauncherError(f"{self.launcher}: rank {self.rank} is outside world size {self.world_size}")
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
    """Like [`env_int`][hwdist.launch.base.env_int] but raises a clear error naming the variables when
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
        """The [`LaunchInfo`][hwdist.launch.base.LaunchInfo] for ``env`` (pure: reads, never writes)."""
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
        """This launcher's [`LaunchInfo`][hwdist.launch.base.LaunchInfo]: what ``resolve`` returns.

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
