# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the helper scripts: lets Open MPI's mpirun run as root (containers,
# CI) and oversubscribe a small machine. Harmless for other users.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
# Debian's torch and OpenBLAS: one thread each unless the user says otherwise.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
