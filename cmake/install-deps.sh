#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs gnh's Debian dependencies. Idempotent: does nothing when all are present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev
  libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
  libcli11-dev catch2 libtomlplusplus-dev nlohmann-json3-dev
  python3-torch python3-h5py python3-numpy python3-matplotlib
  slurmctld slurmd slurm-client munge
  qemu-user
)

source "$(dirname "$0")/apt.sh"
gnh_apt_install "${packages[@]}"
