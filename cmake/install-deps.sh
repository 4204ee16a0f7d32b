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
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "gnh: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
