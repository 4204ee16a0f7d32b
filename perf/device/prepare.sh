#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The GPU check's binary, built on this machine (no GPU needed), so that the
# GPU machine builds nothing: Kokkos and Kokkos Kernels for CUDA (Kokkos_ROOT,
# or cmake/build-kokkos.sh cuda, cached), then bench_engine
# alone for sm_90 into build-device/ (the gh200-device preset: no MPI, HDF5
# or tests, static Kokkos). Checks that it holds sm_90 code and that it is
# under 64 MiB, then prints what to carry and the one command to run there:
#
#   perf/device/prepare.sh                      # here
#   perf/device/run.sh                          # there: takes build-device/bin/bench_engine
#
# The GPU machine needs the CUDA 13 runtime and cuBLAS (libcudart.so.13,
# libcublas.so.13: from the system, or from the Python CUDA wheels, where
# run.sh finds them) and python3 with torch; run.sh checks the libraries first.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$SECONDS
bash cmake/install-deps.sh
# An installed CUDA Kokkos >= 4.6 where Kokkos_ROOT names it, else built
# (cmake/build-kokkos.sh: source trees or release archives, cached).
prefix="${Kokkos_ROOT:-$(bash cmake/build-kokkos.sh cuda | tail -1)}"
export Kokkos_ROOT="$prefix"
if [ ! -f build-device/CMakeCache.txt ] || ! grep -q "Kokkos_DIR:PATH=$prefix" build-device/CMakeCache.txt; then
  rm -rf build-device
  cmake --preset gh200-device >/dev/null
fi
cmake --build build-device -j "${GNH_BUILD_JOBS:-2}" --target bench_engine
exe=build-device/bin/bench_engine
if command -v cuobjdump >/dev/null; then
  n="$(cuobjdump --list-elf "$exe" | grep -c "sm_90" || true)"
else
  n="$(python3 perf/device/fatbin_archs.py "$exe" | sed -n 's/^elf sm_90 x//p')"
fi
if [ -z "$n" ] || [ "$n" -eq 0 ]; then
  echo "prepare: $exe has no sm_90 device code" >&2
  exit 1
fi
bytes="$(stat -c %s "$exe")"
if [ "$bytes" -ge $((64 * 1024 * 1024)) ]; then
  echo "prepare: $exe is $bytes bytes, over the 64 MiB a GPU check may carry" >&2
  exit 1
fi
libs="$(ldd "$exe")"
if grep -E "libmpi|libhdf5" <<<"$libs" >/dev/null; then
  echo "prepare: $exe links MPI or HDF5, which the GPU machine may not have" >&2
  exit 1
fi
# The GPU machine's glibc must be at least the newest version the binary asks
# for; libstdc++ and libgcc are linked statically (the gh200-device preset),
# so the C++ runtime of this machine travels inside the binary.
glibc="$(objdump -T "$exe" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
echo "prepare: $exe needs ${glibc:-no versioned glibc symbols} (this machine: $(ldd --version | head -1))"
if grep -q "libstdc++" <<<"$libs"; then
  echo "prepare: $exe still links libstdc++ dynamically: the GPU machine's must be at least this machine's" >&2
else
  echo "prepare: libstdc++ and libgcc are linked statically"
fi
echo "prepare: shared libraries it needs:"
sed 's/^/  /' <<<"$libs"
echo "prepare: $exe: $n sm_90 ELF image(s), $((bytes / 1024 / 1024)) MiB, built in $((SECONDS - t0)) s"
echo "prepare: carry build-device/bin/bench_engine; on the GPU machine run: perf/device/run.sh"
