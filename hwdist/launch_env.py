"""The environment variables each launcher family sets: one table, read by everything that needs it.

The launchers (``hwdist.launch``) resolve a job from it; ``hwdist.get_local_rank`` /
``get_local_size`` read the local rank and size from it before any process group
exists; ``hwdist env`` lists it. It is data only and imports nothing of hwdist, so
every part of the package can read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "LauncherVariables",
    "TORCHRUN_VARIABLES",
    "SLURM_VARIABLES",
    "OPENMPI_VARIABLES",
    "PMI_VARIABLES",
    "MVAPICH_VARIABLES",
    "LAUNCHER_VARIABLES",
    "MPI_RANK_VARS",
    "MPI_SIZE_VARS",
    "MPI_LOCAL_RANK_VARS",
    "MPI_LOCAL_SIZE_VARS",
    "LOCAL_RANK_VARS",
    "LOCAL_SIZE_VARS",
]


@dataclass(frozen=True)
class LauncherVariables:
    """The environment variables one launcher family sets, by what they carry (most specific first).

    The one table of launcher variables: the launchers read it, and so do
    ``hwdist.get_local_rank``/``get_local_size`` and ``hwdist env``.
    """

    family: str
    rank: tuple[str, ...] = ()
    size: tuple[str, ...] = ()
    local_rank: tuple[str, ...] = ()
    local_size: tuple[str, ...] = ()
    #: Further variables ``hwdist env`` shows for this family.
    other: tuple[str, ...] = ()
    #: Name patterns (``'SLURM_*'``) ``hwdist env`` shows.
    patterns: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every variable named, once, in table order."""
        return tuple(dict.fromkeys(self.rank + self.size + self.local_rank + self.local_size + self.other))


TORCHRUN_VARIABLES = LauncherVariables(
    "torchrun",
    rank=("RANK",),
    size=("WORLD_SIZE",),
    local_rank=("LOCAL_RANK",),
    local_size=("LOCAL_WORLD_SIZE",),
    other=("GROUP_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"),
    patterns=("TORCHELASTIC_*", "MASTER_*"),
)
SLURM_VARIABLES = LauncherVariables(
    "slurm", rank=("SLURM_PROCID",), size=("SLURM_NTASKS",), local_rank=("SLURM_LOCALID",),
    local_size=("SLURM_NTASKS_PER_NODE",), other=("SLURM_NODEID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST"),
    patterns=("SLURM_*",),
)
OPENMPI_VARIABLES = LauncherVariables(
    "openmpi", rank=("OMPI_COMM_WORLD_RANK",), size=("OMPI_COMM_WORLD_SIZE",),
    local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",), local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",),
    patterns=("OMPI_COMM_WORLD_*",),
)
#: MPICH, Intel MPI and PMIx (also ``srun --mpi=pmi2/pmix``).
PMI_VARIABLES = LauncherVariables(
    "pmi",
    rank=("PMI_RANK", "PMIX_RANK"),
    size=("PMI_SIZE",),
    local_rank=("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
    local_size=("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
    patterns=("PMI_*", "PMIX_RANK", "MPI_LOCAL*"),
)
MVAPICH_VARIABLES = LauncherVariables(
    "mvapich", rank=("MV2_COMM_WORLD_RANK",), size=("MV2_COMM_WORLD_SIZE",),
    local_rank=("MV2_COMM_WORLD_LOCAL_RANK",), local_size=("MV2_COMM_WORLD_LOCAL_SIZE",),
    patterns=("MV2_COMM_WORLD_*",),
)
#: Every launcher family's variables, in the order ``hwdist env`` reports them.
LAUNCHER_VARIABLES = (
    TORCHRUN_VARIABLES,
    SLURM_VARIABLES,
    OPENMPI_VARIABLES,
    PMI_VARIABLES,
    MVAPICH_VARIABLES,
)
_MPI_FAMILIES = (OPENMPI_VARIABLES, PMI_VARIABLES, MVAPICH_VARIABLES)

#: The global rank, per MPI family.
MPI_RANK_VARS = tuple(v for f in _MPI_FAMILIES for v in f.rank)
#: The world size, per MPI family.
MPI_SIZE_VARS = tuple(v for f in _MPI_FAMILIES for v in f.size)
#: The local rank under MPI; ``srun --mpi=pmi2/pmix`` sets PMI_RANK but only Slurm's local rank.
MPI_LOCAL_RANK_VARS = tuple(v for f in _MPI_FAMILIES for v in f.local_rank) + SLURM_VARIABLES.local_rank
#: The local world size under MPI.
MPI_LOCAL_SIZE_VARS = tuple(v for f in _MPI_FAMILIES for v in f.local_size)
#: Any launcher's local rank, most specific first (torchrun's, then MPI's, then Slurm's: ``mpirun`` inside
#: an ``sbatch`` allocation inherits ``SLURM_*`` variables that do not describe its ranks).
LOCAL_RANK_VARS = TORCHRUN_VARIABLES.local_rank + MPI_LOCAL_RANK_VARS
#: Any launcher's local world size, most specific first.
LOCAL_SIZE_VARS = TORCHRUN_VARIABLES.local_size + MPI_LOCAL_SIZE_VARS + SLURM_VARIABLES.local_size
