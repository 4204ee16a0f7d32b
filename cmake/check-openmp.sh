#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The OpenMP host variant: Kokkos and Kokkos Kernels with OpenMP built from
# their release archives in GNH_VENDOR_DIR (cmake/build-kokkos.sh openmp,
# cached; with an installed OpenMP Kokkos, configure the openmp preset with
# Kokkos_ROOT instead), gnh built against
# them into build-openmp/ (the openmp preset), and its unit and oracle tests
# run with OMP_NUM_THREADS threads (default 2), but the converter's (Python,
# no Kokkos: the default build's tests cover it).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
source cmake/kokkos-variant.sh
gnh_build_variant openmp openmp
t1=$SECONDS
echo "check-openmp: built in $((t1 - t0)) s"
source cmake/mpi-env.sh
OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_PROC_BIND=false ctest --test-dir build-openmp -L "unit|oracle" \
  -LE converter --output-on-failure -j 1
echo "check-openmp: unit and oracle tests passed in $((SECONDS - t1)) s"
