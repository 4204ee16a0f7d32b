#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The demo: install, build, make a small demo campaign (a tiny nanoGPT trained
# for three epochs on /usr/share/common-licenses), convert it and analyse it
# on two MPI ranks. Leaves build/demo/results/demo.h5.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
bash cmake/build.sh
source cmake/mpi-env.sh
apps/gnh-demo-campaign build/demo
echo "+ mpirun -np 2 build/bin/gnh run inputs/demo.toml"
mpirun -np 2 build/bin/gnh run inputs/demo.toml
