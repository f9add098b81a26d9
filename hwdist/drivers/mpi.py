"""MPI: CPU collectives through torch's own MPI backend or, on stock PyPI torch
(built without MPI), through a Python process group over mpi4py."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ._common import vendor_missing
from ._mpi_facts import MPI_REDUCE_DTYPES as MPI_REDUCE_DTYPES
from ._mpi_facts import PY_MPI_BACKEND as PY_MPI_BACKEND
from .base import ALL_OPS, Driver


# torch's ProcessGroupMPI maps these dtypes to MPI types and lacks reduce_scatter.
_NATIVE_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32, torch.float64}
)
_NATIVE_OPS = ALL_OPS - {"reduce_scatter"}
# What the mpi4py process group reduces: float16 too (natively or through float32).
_PY_REDUCE_DTYPES = MPI_REDUCE_DTYPES | {torch.float16}


def _native() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_mpi_available())


def _create_process_group(store: Any, rank: int, size: int, timeout: Any) -> Any:
    """The mpi4py process group (imported on first use: mpi4py starts MPI when imported)."""
    from ._mpi_pg import create_mpi_process_group

    return create_mpi_process_group(store, rank, size, timeout)


class MpiDriver(Driver):
    """MPI on the CPU (native torch MPI, else mpi4py)."""

    name = "mpi"
    device_type = "cpu"
    # Below gloo: chosen when asked for, or by the MPI launcher, never by default.
    priority = -10
    description = "MPI (CPU): torch's MPI backend, else mpi4py"
    env_vars = ("OMPI_MCA_*", "MPICH_*", "I_MPI_*", "HYDRA_*", "MPIEXEC_TIMEOUT")
    # Every rank must be a process of one MPI job (``hwdist check`` starts mpiexec for it).
    required_launcher = "mpi"
    # What torch reports for the mpi4py process group maps back to this driver.
    aliases = (PY_MPI_BACKEND,)

    def __init__(self) -> None:
        super().__init__()
        # The table depends on which process group runs: torch's own ProcessGroupMPI (fixed dtypes, no
        # reduce_scatter) or the mpi4py one (hwdist/drivers/_mpi_pg.py: raw bytes, every op). Which one is
        # a fact of the installed torch, known once.
        if _native():
            self.torch_backend = "mpi"
            self.native_ops = _NATIVE_OPS
            self.dtypes = self.reduce_dtypes = _NATIVE_DTYPES
        else:
            self.torch_backend = PY_MPI_BACKEND
            self.native_ops = ALL_OPS
            self.dtypes = None  # the mpi4py group moves raw bytes: every dtype
            # bfloat16 (numpy has none) is widened to float32 by the plan.
            self.reduce_dtypes = _PY_REDUCE_DTYPES
            self.process_group_factory = _create_process_group

    def unavailable_reason(self) -> Optional[str]:
        """Why the backend cannot run here, or None if it can."""
        if _native():
            return None
        return vendor_missing("mpi4py")

    def details(self) -> dict[str, Any]:
        """Whether torch has MPI built in, the mpi4py version, MPI launchers on PATH."""
        import shutil
        from importlib import metadata

        version = None
        if vendor_missing("mpi4py") is None:
            try:
                version = metadata.version("mpi4py")
            except metadata.PackageNotFoundError:
                version = "unknown"
        launchers = {n: shutil.which(n) for n in ("mpirun", "mpiexec", "srun")}
        return {
            "torch built with MPI": _native(),
            "mpi4py": version,  # mpi4py.MPI is not imported: that would start MPI
            "launchers on PATH": {k: v for k, v in launchers.items() if v},
        }
