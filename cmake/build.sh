#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Configures (once) and builds gnh into build/. Installs nothing: the
# dependencies are cmake/install-deps.sh's (cmake/demo.sh and cmake/test.sh
# run it first); `cmake/build.sh --install-deps` runs it here too.
#   GNH_BUILD_JOBS   parallel compile jobs (default: the processors here)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--install-deps" ]; then
  bash cmake/install-deps.sh
elif [ -n "${1:-}" ]; then
  echo "build.sh: unknown argument '$1' (only --install-deps)" >&2
  exit 2
fi
# CI (CI=true) builds once from nothing: unity batches of 8 sources parse
# Kokkos' headers once per batch. Developers keep one translation unit per file.
if [ ! -f build/CMakeCache.txt ]; then
  if [ "${CI:-}" = true ]; then
    cmake --preset cpu-release -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8
  else
    cmake --preset cpu-release
  fi
fi
cmake --build build -j "${GNH_BUILD_JOBS:-$(nproc)}"
