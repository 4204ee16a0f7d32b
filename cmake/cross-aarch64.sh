#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Arm check (the Grace host of GH200 nodes): installs what is missing
# (Debian's aarch64 cross compiler, qemu-user, arm64 Kokkos, Kokkos Kernels
# and OpenBLAS through multiarch), cross-builds the compute core, the
# benchmarks and the unit tests without MPI/HDF5 into build-aarch64/, and runs
# the unit tests and each benchmark at its smallest size under qemu-user.
# Idempotent like install-deps.sh; the x86 build in build/ is not touched.
# About 7 minutes on two shared cores from nothing installed, 4 of them compiling;
# the unit tests take about 40 s under qemu (test_fastmath samples every 1024th
# float here, GNH_FASTMATH_STRIDE, against every 64th natively: 99 s of qemu).
#   GNH_ARM_BUILD_DIR  build tree (default build-aarch64)
#   GNH_ARM_ARCH       -march for the Arm code (default armv9-a: Grace is
#                      Neoverse V2, Armv9.0-A with SVE2; qemu runs it)
#   GNH_BUILD_JOBS, GNH_TEST_JOBS  parallelism (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(realpath -m "${GNH_ARM_BUILD_DIR:-build-aarch64}")"
arch="${GNH_ARM_ARCH:-armv9-a}"

# Packages. The arm64 -dev packages are Multi-Arch: same and install beside
# the amd64 ones; Catch2 is Multi-Arch: foreign (amd64 only), its headers
# serve both and its main is compiled below.
packages=(
  cmake catch2 g++-aarch64-linux-gnu qemu-user
  libtrilinos-kokkos-dev:arm64 libtrilinos-kokkos-kernels-dev:arm64 libopenblas-dev:arm64
)
source cmake/apt.sh
gnh_apt_install "${packages[@]}"

# Catch2::Catch2WithMain for aarch64: Debian's headers and a main compiled by
# the cross compiler, exported as a CMake package in the build tree.
catch2="$build/catch2-aarch64"
if [ ! -f "$catch2/lib/cmake/Catch2/Catch2Config.cmake" ]; then
  echo "gnh: compiling Catch2's main for aarch64"
  mkdir -p "$catch2/include" "$catch2/lib/cmake/Catch2"
  ln -sfn /usr/include/catch2 "$catch2/include/catch2"  # only Catch2's headers, not the amd64 /usr/include
  printf '#define CATCH_CONFIG_MAIN\n#include <catch2/catch.hpp>\n' >"$catch2/catch_main.cpp"
  aarch64-linux-gnu-g++ -std=c++17 -O2 -I"$catch2/include" -c "$catch2/catch_main.cpp" -o "$catch2/catch_main.o"
  aarch64-linux-gnu-ar rcs "$catch2/lib/libCatch2WithMain.a" "$catch2/catch_main.o"
  cp /usr/lib/cmake/Catch2/Catch2ConfigVersion.cmake "$catch2/lib/cmake/Catch2/"
  cat >"$catch2/lib/cmake/Catch2/Catch2Config.cmake.tmp" <<'EOF'
# Written by cmake/cross-aarch64.sh: Debian's Catch2 v2 headers, main compiled for aarch64.
if(NOT TARGET Catch2::Catch2)
  get_filename_component(_gnh_catch2 "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
  add_library(Catch2::Catch2 INTERFACE IMPORTED)
  set_target_properties(Catch2::Catch2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_gnh_catch2}/include")
  add_library(Catch2::Catch2WithMain STATIC IMPORTED)
  set_target_properties(Catch2::Catch2WithMain PROPERTIES
    IMPORTED_LOCATION "${_gnh_catch2}/lib/libCatch2WithMain.a" INTERFACE_LINK_LIBRARIES Catch2::Catch2)
endif()
EOF
  mv "$catch2/lib/cmake/Catch2/Catch2Config.cmake.tmp" "$catch2/lib/cmake/Catch2/Catch2Config.cmake"
fi

cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake -DCMAKE_BUILD_TYPE=Release \
  -DGNH_ENABLE_MPI=OFF -DGNH_HOST_ARCH="$arch" -DCatch2_DIR="$catch2/lib/cmake/Catch2" \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 >/dev/null
echo "gnh: aarch64 installed and configured (${SECONDS}s)"
cmake --build "$build" -j "${GNH_BUILD_JOBS:-2}"
echo "gnh: aarch64 built (${SECONDS}s)"

# Under qemu: the unit tests, then each benchmark once at its smallest size.
# bench_engine runs in fp64: in fp32 it also times two 512^3 sgemm rates,
# which take two minutes under qemu and say nothing about Arm hardware.
qemu_cpu="$(sed -n 's/^GNH_QEMU_CPU:STRING=//p' "$build/CMakeCache.txt")"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export GNH_FASTMATH_STRIDE="${GNH_FASTMATH_STRIDE:-1024}"
ctest --test-dir "$build" -L unit --output-on-failure -j "${GNH_TEST_JOBS:-2}"
echo "gnh: aarch64 unit tests passed under qemu (${SECONDS}s)"
bench() {
  local name=$1
  shift
  if ! qemu-aarch64 -cpu "$qemu_cpu" "$build/bin/$name" "$@" >"$build/${name}_tiny.json" 2>"$build/${name}_tiny.log"; then
    cat "$build/${name}_tiny.log" >&2
    echo "gnh: $name $* failed under qemu" >&2
    exit 1
  fi
}
bench bench_engine --synthetic tiny --batch 2 --repeats 0 --precision fp64 --validation
bench bench_kernels --shape tiny --repeats 1 --directions 2
echo "gnh: aarch64 benchmarks ran under qemu (${SECONDS}s): $build/bench_*_tiny.json"
