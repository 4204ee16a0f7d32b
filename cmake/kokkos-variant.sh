# SPDX-License-Identifier: BSD-3-Clause
# Sourced by cmake/check-cuda.sh and cmake/check-openmp.sh.
# gnh_build_variant VARIANT PRESET [TARGET...]: the Debian packages (cmake/install-deps.sh),
# Kokkos of VARIANT: an installed one where Kokkos_ROOT names it (a cluster's
# module, Spack; Kokkos >= 4.6 with that backend and Kokkos Kernels beside it
# or in KokkosKernels_ROOT), else built by cmake/build-kokkos.sh (cached; from
# KOKKOS_SRC and KOKKOSKERNELS_SRC, or the release archives in GNH_VENDOR_DIR);
# PRESET's build directory configured afresh when it was made against another
# prefix (or, for CUDA, without the preset's ptxas report launcher); then built
# (the TARGETs only, where given).
gnh_build_variant() {
  local variant="$1" preset="$2" dir prefix
  shift 2
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  dir="build-$preset"
  bash cmake/install-deps.sh
  if [ -n "${Kokkos_ROOT:-}" ]; then
    prefix="$Kokkos_ROOT"
    echo "gnh: $variant variant against the installed Kokkos in $prefix" >&2
  else
    prefix="$(bash cmake/build-kokkos.sh "$variant" | tail -1)"
  fi
  export Kokkos_ROOT="$prefix"
  # Configured afresh too where a CUDA tree predates the preset's ptxas report
  # launcher (cmake/check-cuda.sh reads its reports).
  if [ ! -f "$dir/CMakeCache.txt" ] || ! grep -q "Kokkos_DIR:PATH=$prefix" "$dir/CMakeCache.txt" ||
    { [ "$variant" = cuda ] && ! grep -q "ptxas-log.sh" "$dir/CMakeCache.txt"; }; then
    rm -rf "$dir"
    cmake --preset "$preset"
  fi
  cmake --build "$dir" -j "${GNH_BUILD_JOBS:-2}" "${targets[@]}"
}
