#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The tests: install, build, run every CTest label.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/build.sh
source cmake/mpi-env.sh
ctest --test-dir build --output-on-failure -j "${GNH_TEST_JOBS:-2}"
