// SPDX-License-Identifier: BSD-3-Clause
// The GEMM work the entry points issue (kernels/blas.hpp's gemm and
// gemm_batched under a policy, gemm_mapped.hpp's queue), 2 m n k per
// product, by the unit a GPU runs it on: tensor cores (TF32 under the tf32
// policy, bfloat16 under bf16-amp, the batched attention's rounded operands
// in TF32), FP32 or FP64 without them. Off unless a benchmark turns it on
// (bench_engine --profile), so a pass costs one branch per GEMM call. Calls
// come from the thread that runs the engine.
#pragma once
#include <type_traits>

#include "core/types.hpp"

namespace gnh::kernels {

struct GemmWork {
  double tensor = 0, fp32 = 0, fp64 = 0;  // FLOPs
  bool on = false;
  int paused = 0;  // inside an entry point that recorded its products already
};

inline GemmWork& gemm_work() {
  static GemmWork w;
  return w;
}

template <class T>
void record_gemm(bool tensor, index_t m, index_t n, index_t k, index_t count) {
  GemmWork& w = gemm_work();
  if (!w.on || w.paused > 0) return;
  const double f = 2.0 * double(m) * double(n) * double(k) * double(count);
  if (std::is_same<T, double>::value) w.fp64 += f;
  else if (tensor) w.tensor += f;
  else w.fp32 += f;
}

// While one lives, the entry points it wraps record nothing (their caller did).
struct GemmWorkPause {
  GemmWorkPause() { ++gemm_work().paused; }
  ~GemmWorkPause() { --gemm_work().paused; }
  GemmWorkPause(const GemmWorkPause&) = delete;
  GemmWorkPause& operator=(const GemmWorkPause&) = delete;
};

}  // namespace gnh::kernels
