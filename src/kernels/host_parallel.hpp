// SPDX-License-Identifier: BSD-3-Clause
// Threads on one rank for the host fast paths (host_gemm.hpp,
// attention_host.hpp), which are plain C++ and know nothing of Kokkos: they
// run on every thread of the host execution-space instance they are given
// (OpenMP: OMP_NUM_THREADS of them; Serial: one), each thread on a disjoint
// part of the output, so the bits do not depend on the thread count.
#pragma once
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>

#include "kernels/host_gemm.hpp"

namespace gnh::kernels::host {

// body(first, last) over [0, n) cut into at most one contiguous range per
// thread of `space`; in the calling thread when there is one range.
template <class Space, class F>
void for_ranges(const Space& space, const char* label, std::int64_t n, const F& body) {
  const std::int64_t parts = std::max<std::int64_t>(1, std::min<std::int64_t>(space.concurrency(), n));
  if (parts == 1) {
    body(std::int64_t(0), n);
    return;
  }
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Space>(space, 0, parts),
                       [=](const std::int64_t i) { body(n * i / parts, n * (i + 1) / parts); });
}

// C = alpha op(A) op(B) + beta C on every thread of `space` (panels of C:
// host_gemm.hpp), with gnh's kernel `kernel` or, for none, the vendor BLAS
// called from each thread (one thread of its own). False, with nothing done,
// where that cannot run: the kernel is missing on this CPU, or it is none on
// one thread (the caller then takes the vendor BLAS through Kokkos Kernels).
template <class Space>
bool sgemm_on(const Space& space, GemmKernel kernel, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
              float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
              std::int64_t ldc) {
  // The BLAS runs on gnh's threads only. Two thread pools on the same cores
  // (a threaded BLAS under a threaded host space) slow both several-fold; and
  // on a one-thread space OpenBLAS would otherwise start a thread per core,
  // under every MPI rank of the node, and win the start-up probe against
  // gnh's one thread with all of them.
  vendor_single_threaded();
  const std::int64_t parts = panel_count(m, n, space.concurrency());
  if (kernel == GemmKernel::none ? parts == 1 || !vendor_panels_available() : !supported(kernel)) return false;
  if (parts == 1) return sgemm_using(kernel, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  Kokkos::parallel_for("gnh::host::sgemm", Kokkos::RangePolicy<Space>(space, 0, parts), [=](const std::int64_t i) {
    sgemm_panel(kernel, panel_of(m, n, parts, i), ta, tb, k, alpha, A, lda, B, ldb, beta, C, ldc);
  });
  return true;
}

}  // namespace gnh::kernels::host
