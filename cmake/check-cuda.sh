#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The CUDA variant, compiled here (no GPU needed): Kokkos and Kokkos Kernels
# built from their release archives in GNH_VENDOR_DIR (cmake/build-kokkos.sh,
# cached; this script always builds them, so it needs the archives: with an
# installed CUDA Kokkos, run `Kokkos_ROOT=PREFIX cmake --preset gh200` and
# `cmake --build --preset gh200` instead), then gnh, bench_engine and
# bench_kernels (the product; not the unit tests, which never run on a GPU
# here) for sm_90 with nvcc into build-gh200/ (the gh200 preset, unity
# batches of 8 sources: nvcc parses Kokkos' headers once per batch). Then:
#   - bench_engine and gnh hold sm_90 device code (cuobjdump --list-elf, or
#     perf/device/fatbin_archs.py where the toolkit has no cuobjdump);
#   - a kernel calling a host-only function (tests/cuda/host_call_in_kernel.cpp)
#     fails to compile with the same compiler and flags, so a host-only call in
#     one of gnh's kernels would fail the build above;
#   - every kernel's resources (ptxas's report, kept per object by the preset's
#     launcher cmake/ptxas-log.sh) pass cmake/check-cuda-resources.py: no spill
#     in gnh's kernels, the fused attention's shared memory a block within 48 KB
#     at the team scratch its plan requests for the reference shape and a
#     Pythia-1B shape (the host build's bench_engine --scratch: build/ must be
#     built, as cmake/test.sh leaves it), and its occupancy at least the cost
#     model's; the table goes to build-gh200/cuda-resources.md. The same check
#     fails on tests/cuda/spill_kernel.cu compiled with its registers capped.
# Prints the time of each step. CI runs it after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
source cmake/kokkos-variant.sh
# The product's targets: the unit tests and the oracles' probes never run on a
# GPU here (the device check builds bench_engine alone, perf/device/prepare.sh),
# and their nvcc compile took 6 min 40 s of this check (2 cores).
gnh_build_variant cuda gh200 gnh bench_engine bench_kernels
echo "check-cuda: Kokkos (CUDA, $Kokkos_ROOT) and gnh, bench_engine, bench_kernels compiled for sm_90 in $((SECONDS - t0)) s"

# cuobjdump where the toolkit has it, else perf/device/fatbin_archs.py (the
# same listing from the ELF's .nv_fatbin section).
for exe in bench_engine gnh; do
  if command -v cuobjdump >/dev/null; then
    n="$(cuobjdump --list-elf "build-gh200/bin/$exe" | grep -c "sm_90" || true)"
  else
    n="$(python3 perf/device/fatbin_archs.py "build-gh200/bin/$exe" | sed -n 's/^elf sm_90 x//p')"
  fi
  if [ -z "$n" ] || [ "$n" -eq 0 ]; then
    echo "check-cuda: build-gh200/bin/$exe has no sm_90 device code" >&2
    exit 1
  fi
  echo "check-cuda: build-gh200/bin/$exe: $n sm_90 ELF image(s)"
done

# The negative check: the flags of a core translation unit, on a kernel that
# calls a host-only function.
flags="$(sed -n 's/^CXX_FLAGS = //p' build-gh200/src/CMakeFiles/gnh_core.dir/flags.make)"
defines="$(sed -n 's/^CXX_DEFINES = //p' build-gh200/src/CMakeFiles/gnh_core.dir/flags.make)"
includes="$(sed -n 's/^CXX_INCLUDES = //p' build-gh200/src/CMakeFiles/gnh_core.dir/flags.make)"
compiler="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build-gh200/CMakeCache.txt)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# shellcheck disable=SC2086
if "$compiler" $defines $includes $flags -c tests/cuda/host_call_in_kernel.cpp -o "$out/x.o" > "$out/log" 2>&1; then
  echo "check-cuda: tests/cuda/host_call_in_kernel.cpp compiled: a host-only call in a kernel would go unnoticed" >&2
  exit 1
fi
grep -m1 -i "host.*function\|__host__" "$out/log" | sed 's/^/check-cuda: as expected: /' || true

# Resources: the plan's team scratch for two shapes, from the host build.
bench=build/bin/bench_engine
if [ ! -x "$bench" ]; then
  echo "check-cuda: $bench is missing: the resource check takes the plan's team scratch from the host build (cmake/build.sh)" >&2
  exit 1
fi
"$bench" --synthetic reference --batch 1 --scratch > "$out/reference.json"
"$bench" --synthetic 16,8,2048,50304 --family gpt-neox --context 2048 --batch 1 --scratch > "$out/pythia-1b.json"
python3 cmake/check-cuda-resources.py build-gh200 --scratch "$out/reference.json" --scratch "$out/pythia-1b.json" \
  --table build-gh200/cuda-resources.md | tail -1
# The negative check: a kernel made to spill fails the same parse.
mkdir -p "$out/spill"
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"  # as cmake/build-kokkos.sh finds it
"$nvcc_bin" -arch=sm_90 -Xptxas=-v -maxrregcount=32 -c tests/cuda/spill_kernel.cu -o "$out/spill/k.o" 2> "$out/spill/k.o.ptxas"
if python3 cmake/check-cuda-resources.py "$out/spill" > /dev/null 2> "$out/spill.log"; then
  echo "check-cuda: tests/cuda/spill_kernel.cu spilled unnoticed: the resource check would miss a spill" >&2
  exit 1
fi
sed 's/^/check-cuda: as expected: /' "$out/spill.log"
echo "check-cuda: passed in $((SECONDS - t0)) s"
