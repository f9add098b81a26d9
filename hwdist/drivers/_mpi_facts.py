"""What the MPI driver (``drivers.mpi``) and its mpi4py process group (``_mpi_pg``, ``_mpi_ops``) both
need to know, in one place both import: the name the group registers under and the dtypes MPI reduces."""

from __future__ import annotations

import torch

from .. import _compat

#: Name the mpi4py process group is registered under with torch (torch
#: reserves the name 'mpi' for its own, possibly absent, MPI backend).
PY_MPI_BACKEND = "hwdist_mpi"

# Dtype sets are written out per library on purpose (drivers are data; see nccl.py's own list).
# Dtypes MPI reduces as they are (numpy knows them; bool through MPI's logical ops).
MPI_REDUCE_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    }
    | set(_compat.WIDE_UNSIGNED_DTYPES)
)
