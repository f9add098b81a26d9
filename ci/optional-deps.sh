#!/usr/bin/env bash
# Optional extras CI uses when the registry has them (MPI). Failure here is not fatal.
set -euo pipefail
python3 -m pip install -q 'mpi4py>=3.1' mpich
