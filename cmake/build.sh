#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what is missing, configures (once) and builds gnh into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
if [ ! -f build/CMakeCache.txt ]; then
  cmake --preset cpu-release
fi
cmake --build build -j "${GNH_BUILD_JOBS:-2}"
