#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The GPU check (issues #7 and #16), one command on the GPU machine that
# builds nothing there: validate a small model's loss, gradient and curvature
# against CPU results shipped with it, in float, tf32 and bf16-amp, then time
# the reference configuration (SPEC section 1: 20.4M parameters) per batch of
# 64 x 1024 tokens for the gradient and both curvature paths, in fp32, tf32
# and bf16-amp, extrapolated to the 9,963-block epoch. Results go to
# perf/baselines/<machine>/.
#
#   perf/device/prepare.sh        # on a build machine: build-device/bin/bench_engine (sm_90)
#   perf/device/run.sh [--out DIR] [--bench PATH] [--config reference] [--batch 64]
#   perf/device/run.sh --build [--arch HOPPER90]   # or build here (a cluster with its own Kokkos)
#   perf/device/run.sh --cpu      # the host build of this checkout (tests this script)
#
# Without --bench, --build or --cpu it runs build-device/bin/bench_engine,
# which perf/device/prepare.sh built elsewhere, and stops with a clear error
# if that is missing or lacks a library it links (the CUDA 13 runtime and
# cuBLAS). --build: Kokkos >= 4 with CUDA and Kokkos Kernels from Kokkos_ROOT
# and KokkosKernels_ROOT (as clusters provide them), or built first from the
# source trees KOKKOS_SRC and KOKKOSKERNELS_SRC into GNH_DEVICE_PREFIX
# (default /tmp/gnh-device-kokkos), outside the repository.
#   --bench  use this bench_engine, build nothing
#   --config, --batch   time another synthetic preset or batch (tests: tiny, 2)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
ARCH=HOPPER90
OUT=""
BENCH=""
CPU=0
BUILD_HERE=0
CONFIG=reference
B=64
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --bench) BENCH="$2"; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --build) BUILD_HERE=1; shift ;;
    --config) CONFIG="$2"; shift 2 ;;
    --batch) B="$2"; shift 2 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
JOBS="$(nproc 2>/dev/null || echo 4)"
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "run.sh: python3 is needed for the validation" >&2; exit 1; }
say() { printf '\n== %s\n' "$*"; }

if [ -z "$BENCH" ] && [ "$CPU" = 0 ] && [ "$BUILD_HERE" = 0 ]; then
  BENCH="$ROOT/build-device/bin/bench_engine"
  [ -x "$BENCH" ] || {
    echo "run.sh: $BENCH is missing: build it on a build machine with perf/device/prepare.sh and carry it" \
         "here, or pass --bench PATH, or --build to build on this machine" >&2
    exit 1
  }
fi
if [ -n "$BENCH" ]; then
  [ -x "$BENCH" ] || { echo "run.sh: $BENCH is not an executable" >&2; exit 1; }
  # (ldd fails on a static binary, or where it is missing: nothing to check then.)
  missing="$({ ldd "$BENCH" 2>/dev/null || true; } | sed -n 's/^[[:space:]]*\([^ ]*\) => not found$/\1/p' | tr '\n' ' ')"
  if [ -n "$missing" ]; then
    echo "run.sh: $BENCH needs libraries this machine lacks: $missing(LD_LIBRARY_PATH, or the CUDA 13 toolkit)" >&2
    exit 1
  fi
fi

if [ -z "$BENCH" ]; then
  if [ "$CPU" = 1 ]; then
    BUILD="$ROOT/build-device-cpu"
    say "host build (compute core and bench_engine only) in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGNH_ENABLE_MPI=OFF -DGNH_ENABLE_TESTS=OFF >/dev/null
  else
    if [ -z "${Kokkos_ROOT:-}" ]; then
      [ -n "${KOKKOS_SRC:-}" ] && [ -n "${KOKKOSKERNELS_SRC:-}" ] || {
        echo "run.sh: set Kokkos_ROOT (and KokkosKernels_ROOT) to a CUDA Kokkos >= 4, or KOKKOS_SRC and" \
             "KOKKOSKERNELS_SRC to their source trees" >&2
        exit 1
      }
      PREFIX="${GNH_DEVICE_PREFIX:-/tmp/gnh-device-kokkos}"
      if [ ! -f "$PREFIX/lib64/cmake/Kokkos/KokkosConfig.cmake" ] && [ ! -f "$PREFIX/lib/cmake/Kokkos/KokkosConfig.cmake" ]; then
        say "building Kokkos (CUDA, $ARCH) into $PREFIX"
        cmake -S "$KOKKOS_SRC" -B "$PREFIX/build-kokkos" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
          -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ARCH_"$ARCH"=ON \
          -DKokkos_ENABLE_CUDA_LAMBDA=ON -DCMAKE_CXX_STANDARD=17 >/dev/null
        cmake --build "$PREFIX/build-kokkos" -j "$JOBS" --target install >/dev/null
        say "building Kokkos Kernels (cuBLAS) into $PREFIX"
        cmake -S "$KOKKOSKERNELS_SRC" -B "$PREFIX/build-kk" -DCMAKE_BUILD_TYPE=Release \
          -DCMAKE_INSTALL_PREFIX="$PREFIX" -DKokkos_ROOT="$PREFIX" -DKokkosKernels_ENABLE_TPL_CUBLAS=ON \
          -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
          -DKokkosKernels_INST_DOUBLE=ON -DKokkosKernels_INST_FLOAT=ON >/dev/null
        cmake --build "$PREFIX/build-kk" -j "$JOBS" --target install >/dev/null
      fi
      export Kokkos_ROOT="$PREFIX" KokkosKernels_ROOT="$PREFIX"
    fi
    BUILD="$ROOT/build-device"
    say "GPU build against $Kokkos_ROOT in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGNH_ENABLE_MPI=OFF -DGNH_ENABLE_TESTS=OFF \
      -DKokkos_ROOT="$Kokkos_ROOT" -DKokkosKernels_ROOT="${KokkosKernels_ROOT:-$Kokkos_ROOT}" \
      -DCMAKE_CXX_COMPILER="$Kokkos_ROOT/bin/nvcc_wrapper" >/dev/null
  fi
  cmake --build "$BUILD" -j "$JOBS" --target bench_engine >/dev/null
  BENCH="$BUILD/bin/bench_engine"
fi

if [ "$CPU" = 1 ]; then MACHINE="${GNH_MACHINE:-devbox-cpu}"; else MACHINE="${GNH_MACHINE:-h200}"; fi
OUT="${OUT:-$ROOT/perf/baselines/$MACHINE}"
mkdir -p "$OUT"
DEVICE="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
[ -n "$DEVICE" ] || DEVICE="host: $(uname -m), $(nproc) cores"
export OPENBLAS_NUM_THREADS=1
echo "device: $DEVICE"

say "validation: synthetic small model, float, against $ROOT/perf/device/validation_small.json"
"$BENCH" --synthetic small --batch 4 --directions 4 --validation --repeats 1 > "$OUT/device_validation.json"
"$PY" "$ROOT/perf/device/summarize.py" validate "$ROOT/perf/device/validation_small.json" "$OUT/device_validation.json"

say "validation of the tf32 and bf16-amp policies (5%, the seed's criterion for reduced precision)"
python_tol() { "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
ref = json.load(open(sys.argv[1]))
ref["tolerance_relative"] = float(sys.argv[2])
ref["tolerance_reason"] = "reduced-precision policy against fp64: the seed's 5% criterion"
json.dump(ref, sys.stdout)
PYEOF
}
python_tol "$ROOT/perf/device/validation_small.json" 0.05 > "$OUT/validation_small_5pct.json"
for policy in tf32 bf16-amp; do
  "$BENCH" --synthetic small --batch 4 --directions 4 --validation --repeats 1 --precision "$policy" \
    > "$OUT/device_validation_$policy.json"
  "$PY" "$ROOT/perf/device/summarize.py" validate "$OUT/validation_small_5pct.json" "$OUT/device_validation_$policy.json"
done

say "$CONFIG configuration, batch $B sequences"
# Forward-over-reverse keeps every layer's activations for 1 + K planes
# (17 GB at K=1); K=4 is the largest that fits with room on a 139 GB GPU.
"$BENCH" --synthetic "$CONFIG" --batch "$B" --passes gradient,curvature --methods second-order-forward \
  --directions 1,16 --repeats 2 > "$OUT/device_reference_sof.json"
"$BENCH" --synthetic "$CONFIG" --batch "$B" --passes curvature --methods forward-over-reverse \
  --directions 1,4 --repeats 2 > "$OUT/device_reference_for.json"
for policy in tf32 bf16-amp; do
  "$BENCH" --synthetic "$CONFIG" --batch "$B" --passes gradient,curvature --methods second-order-forward \
    --directions 1,16 --repeats 2 --precision "$policy" > "$OUT/device_reference_sof_$policy.json"
done
"$PY" "$ROOT/perf/device/summarize.py" epoch "$OUT/device_epoch.json" "$OUT/device_reference_sof.json" \
  "$OUT/device_reference_for.json" --device "$DEVICE"
for policy in tf32 bf16-amp; do
  "$PY" "$ROOT/perf/device/summarize.py" epoch "$OUT/device_epoch_$policy.json" \
    "$OUT/device_reference_sof_$policy.json" --device "$DEVICE ($policy)"
done
say "results in $OUT"
