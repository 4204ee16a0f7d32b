// SPDX-License-Identifier: BSD-3-Clause
// Must NOT compile for CUDA: a kernel that calls a host-only function. The
// CUDA check (cmake/check-cuda.sh) compiles this with the build's
// nvcc_wrapper and flags and fails if it compiles, which proves that a
// host-only call slipped into one of gnh's kernels breaks that check too.
#include <Kokkos_Core.hpp>

#include <cstdlib>

namespace {
double host_only(double x) { return x * std::strtod("2", nullptr); }  // no __device__ version
}  // namespace

void run(Kokkos::View<double*> v) {
  Kokkos::parallel_for(
      "host_call_in_kernel", v.extent(0), KOKKOS_LAMBDA(const int i) { v(i) = host_only(v(i)); });
}
