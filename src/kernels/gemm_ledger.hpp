// SPDX-License-Identifier: BSD-3-Clause
// The work a pass issues, by label, for the cost model (bench_engine --profile
// and --predict): the GEMM entry points (kernels/blas.hpp's gemm and
// gemm_batched under a policy, gemm_mapped.hpp's queue) record 2 m n k per
// product by the unit a GPU runs it on: tensor cores (TF32 under the tf32
// policy, bfloat16 under bf16-amp, the batched attention's rounded operands
// in TF32), FP32 or FP64 without them; every kernel records the bytes it must
// move (its operands read and written once, in every plane it touches).
//
// Bytes are kept apart by how many of a model's scalable extents they span:
// sequence positions (T, and so the rows B T), widths (C, the MLP's, the
// vocabulary, a head's). A model whose extents are all s times smaller, at the
// same batch, layers, heads and directions (bench_engine --predict's
// miniature) records s^d times fewer of the bytes spanning d of them, and
// s^3 times fewer GEMM FLOPs (every product spans three: rows or positions by
// two widths, or positions by positions by a head's width), so the full
// shape's work follows from the miniature's exactly.
//
// Off unless a benchmark turns it on, so a pass costs one branch per call.
// Calls come from the thread that runs the engine.
#pragma once
#include <array>
#include <map>
#include <string>
#include <type_traits>

#include "core/types.hpp"

namespace gnh::kernels {

// Bytes spanning 0 .. 3 scalable extents.
constexpr int kScaledDims = 4;

// fused: the tensor-core products of a kernel that does more between them
// (attention_fused.hpp), priced at its own efficiency.
enum class GemmUnit { tensor = 0, fp32 = 1, fp64 = 2, fused = 3 };

struct LabelWork {
  std::array<double, kScaledDims> bytes{};
  // Products by shape: {m, n, k, unit, bytes an operand value, bytes a
  // result value moves} -> how many (a cost model's efficiency depends on
  // the shape).
  std::map<std::array<index_t, 6>, double> products;
  // GEMM FLOPs on a unit (spanning 3 extents); tensor counts the fused too.
  double flops(GemmUnit unit) const {
    double f = 0;
    for (const auto& [key, count] : products) {
      const GemmUnit u = GemmUnit(key[3]);
      if (u == unit || (unit == GemmUnit::tensor && u == GemmUnit::fused))
        f += 2.0 * double(key[0]) * double(key[1]) * double(key[2]) * count;
    }
    return f;
  }
  double total_bytes() const { return bytes[0] + bytes[1] + bytes[2] + bytes[3]; }
};

struct GemmWork {
  bool on = false;
  int paused = 0;  // inside an entry point that recorded its products already
  // The miniature's scale (bench_engine --predict): a kernel whose work
  // depends on tiles of a fixed size counts it at the full shape's extents.
  int scale = 1;
  std::map<std::string, LabelWork> labels;
  double flops(GemmUnit unit) const {
    double f = 0;
    for (const auto& [label, l] : labels) f += l.flops(unit);
    return f;
  }
};

inline GemmWork& gemm_work() {
  static GemmWork w;
  return w;
}

// `count` products of (m x k) by (k x n) under `label`; their operands of
// `operand_bytes` a value (2 for bfloat16 copies), the result of sizeof(T)
// written, and read first where it accumulates (beta != 0).
template <class T>
void record_gemm(const char* label, bool tensor, index_t m, index_t n, index_t k, index_t count,
                 std::size_t operand_bytes, bool accumulate) {
  GemmWork& w = gemm_work();
  if (!w.on || w.paused > 0) return;
  LabelWork& l = w.labels[label];
  const GemmUnit unit = std::is_same<T, double>::value ? GemmUnit::fp64 : tensor ? GemmUnit::tensor : GemmUnit::fp32;
  const double c = double(count);
  const index_t result = index_t(sizeof(T)) * (accumulate ? 2 : 1);
  l.products[{m, n, k, index_t(unit), index_t(operand_bytes), result}] += c;
  l.bytes[2] += c * (double(operand_bytes) * (double(m) * double(k) + double(k) * double(n)) +
                     double(result) * double(m) * double(n));
}

// `count` (fractional: a causal share) bfloat16 tensor-core products of
// (m x k) by (k x n) inside a fused kernel; its bytes are its Traffic's.
inline void record_fused_products(const char* label, index_t m, index_t n, index_t k, double count) {
  GemmWork& w = gemm_work();
  if (!w.on || w.paused > 0) return;
  w.labels[label].products[{m, n, k, index_t(GemmUnit::fused), 2, index_t(sizeof(float))}] += count;
}

// `bytes` that the kernel `label` moves, spanning `dims` scalable extents.
inline void record_traffic(const char* label, double bytes, int dims) {
  // Not paused: the bf16 copies inside an entry point are kernels of their own.
  GemmWork& w = gemm_work();
  if (!w.on) return;
  w.labels[label].bytes[std::size_t(dims)] += bytes;
}

// A fill of `values` elements of `value_bytes` (Kokkos::deep_copy of a
// scalar: Kokkos's ViewFill kernels, whatever their rank, or a memset).
inline void record_fill(double values, std::size_t value_bytes, int dims) {
  record_traffic("Kokkos::ViewFill", values * double(value_bytes), dims);
}

// The bytes of a kernel, term by term: Traffic(label).add(values, bytes a
// value, extents spanned) ... records on destruction.
class Traffic {
 public:
  explicit Traffic(const char* label) : label_(label) {}
  Traffic& add(double values, std::size_t value_bytes, int dims) {
    bytes_[std::size_t(dims)] += values * double(value_bytes);
    return *this;
  }
  ~Traffic() {
    for (int d = 0; d < kScaledDims; ++d)
      if (bytes_[std::size_t(d)] > 0) record_traffic(label_, bytes_[std::size_t(d)], d);
  }
  Traffic(const Traffic&) = delete;
  Traffic& operator=(const Traffic&) = delete;

 private:
  const char* label_;
  std::array<double, kScaledDims> bytes_{};
};

// While one lives, the entry points it wraps record nothing (their caller did).
struct GemmWorkPause {
  GemmWorkPause() { ++gemm_work().paused; }
  ~GemmWorkPause() { --gemm_work().paused; }
  GemmWorkPause(const GemmWorkPause&) = delete;
  GemmWorkPause& operator=(const GemmWorkPause&) = delete;
};

}  // namespace gnh::kernels
