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
// it without probing. A campaign probes once per CPU class and reuses the
// record (driver/gemm_record.hpp).
//
// Near-ties are decided without the clock: the vendor BLAS is chosen only when
// it is faster by more than kProbeMargin, the spread of the probe's own
// measurements; within it gnh's kernel is kept (its rounding is the same on
// every node of a class, whatever BLAS build the node has), so that two probes
// of one machine agree.
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

// The probe's noise: over 30 probes of one machine (perf/probe_noise.py, an
// AVX-512 AMD EPYC Zen 5 VM of 2 cores) the ratio of the two kernels' totals
// lay within 2.6% of its median on a quiet machine and within 13.8% with
// another job spinning beside it; the margin covers the busy case
// (perf/NOTES.md, "The host GEMM's tie rule"). It costs at most that much of
// the dense GEMMs' rate where the vendor BLAS is faster by less than it.
constexpr double kProbeMargin = 0.15;

// The fixed rule on the two totals: the vendor BLAS (none) only when gnh's
// kernel takes more than (1 + margin) times its time, else `native`.
host::GemmKernel decide_host_gemm(host::GemmKernel native, double native_seconds, double vendor_seconds,
                                  double margin = kProbeMargin);

struct GemmProbe {
  host::GemmKernel native = host::GemmKernel::none;  // gnh's kernel for this CPU
  host::GemmKernel chosen = host::GemmKernel::none;  // none: the vendor BLAS
  bool probed = false;                               // false: nothing to compare, or pinned by GNH_HOST_GEMM
  int threads = 1;                                   // host threads gnh's kernel ran on
  double margin = kProbeMargin;                      // the tie rule's margin
  std::string forced_by_test;                        // GNH_TEST_ONLY_PROBE_WINNER's value, when a test decided instead
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
// of each, the two taking turns) and picks by decide_host_gemm. Does not select.
// GNH_TEST_ONLY_PROBE_WINNER=native|vendor (for tests only: it stands for a
// probe that came out the other way) replaces the decision after measuring.
GemmProbe probe_host_gemm(const std::vector<GemmShape>& shapes, int repeats = 3);

// What `gnh run` does: probe (unless pinned or there is no choice), select the
// winner, return the record. `chosen` of another rank's probe can be applied
// with host::select_kernel.
GemmProbe choose_host_gemm(index_t n_embd, index_t vocab_size, index_t rows);

}  // namespace gnh::kernels
