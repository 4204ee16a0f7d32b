#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what is missing, configures (once) and builds gnh into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash cmake/install-deps.sh
# CI (CI=true) builds once from nothing: unity batches of 8 sources parse
# Kokkos' headers once per batch. Developers keep one translation unit per file.
if [ ! -f build/CMakeCache.txt ]; then
  if [ "${CI:-}" = true ]; then
    cmake --preset cpu-release -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8
  else
    cmake --preset cpu-release
  fi
fi
cmake --build build -j "${GNH_BUILD_JOBS:-2}"
