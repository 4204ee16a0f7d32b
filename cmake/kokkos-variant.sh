# SPDX-License-Identifier: BSD-3-Clause
# Sourced by cmake/check-cuda.sh and cmake/check-openmp.sh.
# gnh_build_variant VARIANT PRESET: the Debian packages (cmake/install-deps.sh),
# Kokkos of VARIANT (cmake/build-kokkos.sh, cached; needs its release
# archives in GNH_VENDOR_DIR), exported as Kokkos_ROOT; PRESET's build directory configured
# afresh when it was made against another prefix; then built.
gnh_build_variant() {
  local variant="$1" preset="$2" dir prefix
  dir="build-$preset"
  bash cmake/install-deps.sh
  prefix="$(bash cmake/build-kokkos.sh "$variant" | tail -1)"
  export Kokkos_ROOT="$prefix"
  if [ ! -f "$dir/CMakeCache.txt" ] || ! grep -q "Kokkos_DIR:PATH=$prefix" "$dir/CMakeCache.txt"; then
    rm -rf "$dir"
    cmake --preset "$preset"
  fi
  cmake --build "$dir" -j "${GNH_BUILD_JOBS:-2}"
}
