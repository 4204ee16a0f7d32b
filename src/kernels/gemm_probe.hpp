// SPDX-License-Identifier: BSD-3-Clause
// The start-up choice of the host's dense float GEMM: gnh's own kernel
// (host_gemm.hpp) or the vendor BLAS through Kokkos Kernels, whichever
// multiplies the model's GEMM shapes faster on this machine. A distribution
// BLAS may run generic kernels on one CPU and tuned ones on another, and gnh's
// kernel may lose to a tuned BLAS: the probe measures instead of guessing.
//
// The choice changes rounding only (each is a correct FP32 GEMM); it is
// printed, recorded in every output, and the same on every rank of a run (rank
// 0 probes, the others take its answer). GNH_HOST_GEMM=avx2|avx512|vendor pins
// it without probing.
#pragma once
#include <string>
#include <vector>

#include "core/types.hpp"
#include "kernels/host_gemm.hpp"

namespace gnh::kernels {

struct GemmShape {
  bool ta = false, tb = false;  // op(A), op(B) transposed
  index_t m = 0, n = 0, k = 0;
  std::string what;  // e.g. "c_fc forward"
};

struct GemmProbeEntry {
  GemmShape shape;
  double native_seconds = 0, vendor_seconds = 0;  // best of the repeats
  double gflops(double seconds) const {
    return 2.0 * double(shape.m) * double(shape.n) * double(shape.k) / seconds * 1e-9;
  }
};

struct GemmProbe {
  host::GemmKernel native = host::GemmKernel::none;  // gnh's kernel for this CPU
  host::GemmKernel chosen = host::GemmKernel::none;  // none: the vendor BLAS
  bool probed = false;                               // false: nothing to compare, or pinned by GNH_HOST_GEMM
  int threads = 1;                                   // host threads gnh's kernel ran on
  std::string reason;                                // one line for the log
  std::vector<GemmProbeEntry> entries;
  double native_total() const;
  double vendor_total() const;
  std::string json() const;  // for outputs and benchmark reports
};

// The dense GEMMs of one layer of width n_embd and of the LM head over
// vocab_size entries at `rows` tokens (capped at 512: the rates no longer
// depend on the row count there), in every orientation the engine uses
// (forward N,T; input adjoint N,N; weight adjoint T,N).
std::vector<GemmShape> model_gemm_shapes(index_t n_embd, index_t vocab_size, index_t rows);

// Times gnh's kernel (on every thread of the default host space) and the
// vendor BLAS on each shape (a warm-up of each, then the best of `repeats` runs
// of each, the two taking turns) and picks the one with the smaller total time.
// Does not select.
GemmProbe probe_host_gemm(const std::vector<GemmShape>& shapes, int repeats = 3);

// What `gnh run` does: probe (unless pinned or there is no choice), select the
// winner, return the record. `chosen` of another rank's probe can be applied
// with host::select_kernel.
GemmProbe choose_host_gemm(index_t n_embd, index_t vocab_size, index_t rows);

}  // namespace gnh::kernels
