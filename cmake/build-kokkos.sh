#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds Kokkos 4.6.01 and Kokkos Kernels 4.6.02 with gnh's CUDA 13 patch
# (cmake/kokkos-4.6.01-cuda13.patch) into a prefix outside the clone, from
#   - source trees: KOKKOS_SRC and KOKKOSKERNELS_SRC (a checkout of the 4.6.01
#     and 4.6.02 tags, or the unpacked release archives; they are copied, not
#     patched in place), or
#   - the release archives in GNH_VENDOR_DIR (default ../shared/vendor beside
#     the clone, where CI keeps them): kokkos-4.6.01.tar.gz and
#     kokkos-kernels-4.6.02.tar.gz with a SHA256SUMS file listing both.
# With an installed
# Kokkos >= 4.6 (a cluster module, Spack) none of this is needed: set
# Kokkos_ROOT to its prefix and configure the preset directly (README,
# "Building by hand").
#
#   cmake/build-kokkos.sh cuda     Serial host space + CUDA (Hopper, sm_90), static,
#                                  Kokkos Kernels with cuBLAS, no ETI
#   cmake/build-kokkos.sh openmp   Serial + OpenMP host spaces, static,
#                                  Kokkos Kernels with the host BLAS (OpenBLAS), no ETI
#
# The prefix is ${GNH_KOKKOS_CACHE:-$HOME/.cache/gnh}/kokkos-<variant>-<key>,
# the key a hash of the two archives, the patch, this script and the variant:
# a second call with the same inputs builds nothing. The last line printed is
# the prefix, for `Kokkos_ROOT=$(cmake/build-kokkos.sh cuda | tail -1)`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
variant="${1:-}"
case "$variant" in
  cuda|openmp) ;;
  *) echo "usage: [KOKKOS_SRC=DIR KOKKOSKERNELS_SRC=DIR | GNH_VENDOR_DIR=DIR] cmake/build-kokkos.sh cuda|openmp" \
          "(source trees, or the release archives and their SHA256SUMS; with an installed Kokkos, set Kokkos_ROOT" \
          "instead)" >&2; exit 2 ;;
esac
patch_file="$here/kokkos-4.6.01-cuda13.patch"
if [ -n "${KOKKOS_SRC:-}" ] || [ -n "${KOKKOSKERNELS_SRC:-}" ]; then
  for d in "${KOKKOS_SRC:-}" "${KOKKOSKERNELS_SRC:-}"; do
    [ -n "$d" ] && [ -f "$d/CMakeLists.txt" ] || { echo "build-kokkos: set both KOKKOS_SRC and KOKKOSKERNELS_SRC" \
      "to source trees (each with its CMakeLists.txt); got '${KOKKOS_SRC:-}' and '${KOKKOSKERNELS_SRC:-}'" >&2; exit 1; }
  done
  # The trees' contents (names and bytes) make the cache key.
  sources="$(tar c --sort=name --mtime=@0 --owner=0 --group=0 --exclude=.git -C "$KOKKOS_SRC" . \
               -C "$KOKKOSKERNELS_SRC" . | sha256sum | cut -c1-64)"
else
  vendor="${GNH_VENDOR_DIR:-$root/../shared/vendor}"
  kokkos_tgz="$vendor/kokkos-4.6.01.tar.gz"
  kernels_tgz="$vendor/kokkos-kernels-4.6.02.tar.gz"
  for f in "$kokkos_tgz" "$kernels_tgz"; do
    [ -f "$f" ] || { echo "build-kokkos: $f not found: set KOKKOS_SRC and KOKKOSKERNELS_SRC to source trees, or" \
                          "GNH_VENDOR_DIR to a directory with kokkos-4.6.01.tar.gz, kokkos-kernels-4.6.02.tar.gz and" \
                          "their SHA256SUMS, or configure against an installed Kokkos with Kokkos_ROOT" >&2; exit 1; }
  done
  (cd "$vendor" && sha256sum -c --quiet SHA256SUMS) || { echo "build-kokkos: $vendor fails its SHA256SUMS" >&2; exit 1; }
  sources="$(cat "$kokkos_tgz" "$kernels_tgz" | sha256sum | cut -c1-64)"
fi
jobs="${GNH_BUILD_JOBS:-2}"
key="$(cat <(echo "$sources") "$patch_file" "$0" <(echo "$variant") | sha256sum | cut -c1-16)"
prefix="${GNH_KOKKOS_CACHE:-$HOME/.cache/gnh}/kokkos-$variant-$key"
if [ -f "$prefix/.complete" ]; then
  echo "build-kokkos: $variant is cached in $prefix" >&2
  echo "$prefix"
  exit 0
fi

if [ "$variant" = cuda ]; then
  nvcc_bin="$(command -v nvcc || true)"
  [ -n "$nvcc_bin" ] || nvcc_bin=/usr/local/cuda/bin/nvcc
  [ -x "$nvcc_bin" ] || { echo "build-kokkos: nvcc not found (install the CUDA toolkit or put it on PATH)" >&2; exit 1; }
  export PATH="$(dirname "$nvcc_bin"):$PATH"
fi
if [ "$variant" = openmp ]; then
  # The host BLAS Kokkos Kernels calls for float GEMMs.
  source "$here/apt.sh"
  gnh_apt_install libopenblas-dev
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/gnh-kokkos.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if [ -n "${KOKKOS_SRC:-}" ]; then
  cp -a "$KOKKOS_SRC" "$work/kokkos-4.6.01"
  cp -a "$KOKKOSKERNELS_SRC" "$work/kokkos-kernels-4.6.02"
else
  tar xzf "$kokkos_tgz" -C "$work"
  tar xzf "$kernels_tgz" -C "$work"
fi
# A tree that carries the patch already (a site's own copy) is used as it is.
if ! patch -d "$work/kokkos-4.6.01" -p1 --dry-run -R --quiet < "$patch_file" >/dev/null 2>&1; then
  patch -d "$work/kokkos-4.6.01" -p1 --quiet < "$patch_file"
fi
rm -rf "$prefix"
start=$SECONDS

common=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17
        -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON)
if [ "$variant" = cuda ]; then
  kokkos_opts=(-DCMAKE_CXX_COMPILER="$work/kokkos-4.6.01/bin/nvcc_wrapper" -DKokkos_ENABLE_SERIAL=ON
               -DKokkos_ENABLE_CUDA=ON -DKokkos_ARCH_HOPPER90=ON -DKokkos_ENABLE_CUDA_CONSTEXPR=ON)
  kernels_opts=(-DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DKokkosKernels_ENABLE_TPL_CUBLAS=ON
                -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF -DKokkosKernels_ENABLE_TPL_CUSOLVER=OFF)
else
  kokkos_opts=(-DCMAKE_CXX_COMPILER=g++ -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON)
  kernels_opts=(-DCMAKE_CXX_COMPILER=g++ -DKokkosKernels_ENABLE_TPL_BLAS=ON)
fi
cmake -S "$work/kokkos-4.6.01" -B "$work/build-kokkos" "${common[@]}" "${kokkos_opts[@]}" \
  -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF >&2
cmake --build "$work/build-kokkos" -j "$jobs" >&2
cmake --install "$work/build-kokkos" >&2
# Kokkos Kernels: the BLAS component only, nothing pre-instantiated (gnh's
# translation units instantiate what they use).
cmake -S "$work/kokkos-kernels-4.6.02" -B "$work/build-kernels" "${common[@]}" "${kernels_opts[@]}" \
  -DKokkos_ROOT="$prefix" -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
  -DKokkosKernels_ENABLE_COMPONENT_BATCHED=OFF -DKokkosKernels_ENABLE_COMPONENT_SPARSE=OFF \
  -DKokkosKernels_ENABLE_COMPONENT_GRAPH=OFF -DKokkosKernels_ENABLE_COMPONENT_LAPACK=OFF \
  -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF \
  -DKokkosKernels_ENABLE_PERFTESTS=OFF >&2
cmake --build "$work/build-kernels" -j "$jobs" >&2
cmake --install "$work/build-kernels" >&2
echo "variant=$variant key=$key seconds=$((SECONDS - start))" > "$prefix/.complete"
echo "build-kokkos: $variant built in $((SECONDS - start)) s into $prefix" >&2
echo "$prefix"
