"""The ``mpi`` launcher: processes started by ``mpirun``/``mpiexec`` (Open MPI, MPICH, Intel MPI, MVAPICH)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any, Optional

from ..launch_env import MPI_LOCAL_RANK_VARS, MPI_LOCAL_SIZE_VARS, MPI_RANK_VARS, MPI_SIZE_VARS
from .base import (
    Launcher,
    LaunchInfo,
    LauncherError,
    check_consistent,
    env_int,
)

__all__ = ["MpiLauncher", "RANK_VARS", "SIZE_VARS", "LOCAL_RANK_VARS", "LOCAL_SIZE_VARS"]

#: The MPI families' variables (Open MPI, MPICH/Intel MPI/PMI, MVAPICH), from the one launcher table.
RANK_VARS = MPI_RANK_VARS
SIZE_VARS = MPI_SIZE_VARS
LOCAL_RANK_VARS = MPI_LOCAL_RANK_VARS
LOCAL_SIZE_VARS = MPI_LOCAL_SIZE_VARS


class MpiLauncher(Launcher):
    """Reads ``OMPI_COMM_WORLD_*`` or ``PMI_RANK``/``PMI_SIZE``/``MPI_LOCALRANKID``.

    Without ``MASTER_ADDR``/``MASTER_PORT``, ranks agree on a rendezvous over
    MPI itself (mpi4py): rank 0 opens a TCP store on a free port and
    broadcasts its address.
    """

    name = "mpi"
    priority = 20
    description = "mpirun/mpiexec (OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, MPI_LOCALRANKID)"

    def detect(self, env: Mapping[str, str]) -> bool:
        """Any MPI world-size variable is set."""
        return any(v in env for v in SIZE_VARS)

    def resolve(self, env: Mapping[str, str]) -> LaunchInfo:
        """Read the MPI library's variables (see module constants)."""
        rank = env_int(env, *RANK_VARS)
        world = env_int(env, *SIZE_VARS)
        if rank is None or world is None:
            raise LauncherError(
                f"launcher 'mpi': no MPI rank/size variables ({', '.join(RANK_VARS + SIZE_VARS)});"
                " start the job with mpirun/mpiexec"
            )
        local_size = env_int(env, *LOCAL_SIZE_VARS)
        local = env_int(env, *LOCAL_RANK_VARS)
        if local is None:
            if world > 1 and local_size != world:
                raise LauncherError(
                    "launcher 'mpi': this MPI sets no local-rank variable"
                    f" ({', '.join(LOCAL_RANK_VARS)}); set LOCAL_RANK for each process"
                )
            local = rank
        for var, value, src in (
            ("RANK", rank, "MPI"),
            ("WORLD_SIZE", world, "MPI"),
            ("LOCAL_RANK", local, "MPI"),
        ):
            check_consistent(env, self.name, var, value, src)
        return self.launch_info(env, rank, world, local, local_size)  # the master address/port: env's

    def rendezvous(self, info: LaunchInfo, timeout: Any) -> Optional[Any]:
        """A TCP store agreed over MPI when ``MASTER_ADDR``/``MASTER_PORT`` are not both set."""
        if info.master_addr is not None and info.master_port is not None:
            return None
        if info.world_size == 1:
            return None
        try:
            from mpi4py import MPI
        except ImportError:
            raise LauncherError(
                "launcher 'mpi': MASTER_ADDR and MASTER_PORT are not set and mpi4py is not installed"
                " to agree on them; export both (e.g. mpirun -x MASTER_ADDR=host -x MASTER_PORT=29500)"
                " or `pip install mpi4py`"
            ) from None
        import socket

        import torch.distributed as dist

        comm = MPI.COMM_WORLD
        if comm.Get_size() != info.world_size or comm.Get_rank() != info.rank:
            raise LauncherError(
                f"launcher 'mpi': the environment says rank {info.rank} of {info.world_size} but MPI"
                f" says rank {comm.Get_rank()} of {comm.Get_size()}"
            )
        td = timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(minutes=30)
        names = comm.allgather(MPI.Get_processor_name())
        one_host = len(set(names)) == 1
        addr = "127.0.0.1" if one_host else (info.master_addr or socket.gethostname())
        store = None
        reply: tuple[str, Any] = ("", None)
        if info.rank == 0:
            try:
                store = dist.TCPStore(
                    addr, info.master_port or 0, info.world_size, True, td, wait_for_workers=False
                )
                reply = ("ok", (addr, store.port))
            except Exception as exc:  # every rank must hear about it, not hang
                reply = ("error", f"{type(exc).__name__}: {exc}")
        reply = comm.bcast(reply, root=0)
        if reply[0] != "ok":
            raise LauncherError(f"launcher 'mpi': rank 0 could not open the rendezvous store: {reply[1]}")
        addr, port = reply[1]
        if store is None:
            store = dist.TCPStore(addr, port, info.world_size, False, td)
        os.environ.setdefault("MASTER_ADDR", addr)
        os.environ.setdefault("MASTER_PORT", str(port))
        return store
