#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The tests: install what is missing, build, run every CTest but the timing
# assertions (label bench; `ctest --test-dir build -L bench` runs those on a
# quiet machine).
#   GNH_TEST_JOBS   tests run at once (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
bash cmake/build.sh
source cmake/mpi-env.sh
ctest --test-dir build --output-on-failure -j "${GNH_TEST_JOBS:-2}" -LE bench
