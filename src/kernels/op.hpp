// SPDX-License-Identifier: BSD-3-Clause
// The contract every op of the derivative engine meets, beside its free
// kernels, so that one test adapter (tests/support/ops.hpp), one benchmark loop
// (perf/bench_kernels.cpp) and the registry (kernels/ops.hpp) serve them all.
//
// An op O<T> is a small struct that holds its sizes, its options (a GELU kind,
// a bias flag) and its non-differentiable inputs (tokens, targets), and maps
//   x (rows, in) and theta (params)  ->  y (rows, out)
// in every mode. The mode follows from the scalar type S (core/jet.hpp): T is
// the primal, Dual<T> the tangent (forward) or tangent of the reverse, Jet2<T>
// the second-order forward. Each kernel takes the planes of S from what it is
// given (planes_of, core/planes.hpp) and neither reads nor writes the others,
// so a caller may pass buffers allocated for a higher mode.
//
//   static constexpr const char* name;       "gelu": its name in benchmarks
//   OpSizes sizes() const;                    rows, in, out, params
//   std::vector<OpExtent> saved() const;      (rows, cols) of each buffer the
//                                             forward leaves for the reverse or
//                                             the reverse uses as scratch; the
//                                             caller allocates them with the
//                                             planes of S, in this order
//   double flops(OpMode, index_t K) const;    analytic count of a GEMM-bound
//                                             op, 0 for the others
//   (What a call costs is recorded as it runs: its kernels' and products'
//   bytes and its GEMM FLOPs by unit in the work ledger (gemm_ledger.hpp),
//   its launches by the profiler; bench_kernels prints them for every op,
//   mode and K beside flops(), and bench_engine --predict prices them.)
//   static O at(const OpDims&, index_t K);    the op as the model uses it at
//                                             a model's sizes (benchmarks)
//   template <class S> void forward(space, Act2<T> y, Act2<T> x, Params<T> p,
//                                   const OpSaved<T>& s);
//     (forward may keep scratch in the op, so it need not be const)
//   template <class S> void reverse(space, Act2<T> dx, Grads<T> g, Act2<T> dy,
//                                   Act2<T> x, Act2<T> y, Params<T> p,
//                                   const OpSaved<T>& s);
//     S = T or Dual<T>, after forward<S> on the same x, p and s; dx is
//     overwritten (zeroed where the op has no input), g accumulated (in the
//     primal, per sequence where g is so split: Grads::per_sequence, each
//     row's terms into its sequence's gradient, or refused).
//
// A loss op (the head) declares static constexpr bool is_loss = true: its
// reverse seeds every row with 1 itself and does not read dy.
//
// Kernels run on the execution-space instance they are given; none fences.
#pragma once
#include <array>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "core/planes.hpp"

namespace gnh::kernels {

enum class OpMode { forward, tangent, second_order, reverse, tangent_reverse };
constexpr std::array<OpMode, 5> kOpModes = {OpMode::forward, OpMode::tangent, OpMode::second_order, OpMode::reverse,
                                            OpMode::tangent_reverse};

inline const char* op_mode_name(OpMode m) {
  switch (m) {
    case OpMode::forward:
      return "forward";
    case OpMode::tangent:
      return "tangent";
    case OpMode::second_order:
      return "second-order";
    case OpMode::reverse:
      return "reverse";
    case OpMode::tangent_reverse:
      return "tangent-reverse";
  }
  return "?";
}

// The GEMM work of a mode relative to its primal pass, for a product x W: each
// of the K tangent planes costs two GEMMs (x' W + x W'), each second-order
// plane two more (x'' W + 2 x' W'; W'' = 0), and the tangent of a reverse
// carries its tangents the same way.
inline double gemm_multiplier(OpMode m, index_t K) {
  switch (m) {
    case OpMode::forward:
    case OpMode::reverse:
      return 1.0;
    case OpMode::tangent:
    case OpMode::tangent_reverse:
      return 1.0 + 2.0 * double(K);
    case OpMode::second_order:
      return 1.0 + 4.0 * double(K);
  }
  return 0.0;
}

struct OpSizes {
  index_t rows = 0, in = 0, out = 0, params = 0;
};
struct OpExtent {
  index_t rows = 0, cols = 0;
};
// A model's sizes, at which the benchmarks instantiate every op.
struct OpDims {
  index_t B = 0, T = 0, H = 0, C = 0, V = 0;
};

template <class O, class = void>
struct is_loss_op : std::false_type {};
template <class O>
struct is_loss_op<O, std::enable_if_t<O::is_loss>> : std::true_type {};

// The saved buffers of one call, in the order of O::saved().
template <class T>
struct OpSaved {
  static constexpr int kMax = 4;
  std::array<Act2<T>, kMax> buf{};
  int count = 0;
  const Act2<T>& operator[](int i) const {
    if (i >= count) throw std::logic_error("gnh::kernels::OpSaved: the op asked for more buffers than it declared");
    return buf[i];
  }
  // Buffer i seen as one flat (rows * cols) vector, as per-row statistics are.
  Act1<T> flat(int i) const {
    const Act2<T>& a = (*this)[i];
    const index_t n = a.rows() * a.cols();
    Act1<T> r;
    r.v = Span1<T>(a.v.data(), n);
    if (a.d.extent(0) > 0) r.d = Span2<T>(a.d.data(), a.d.extent(0), n);
    if (a.dd.extent(0) > 0) r.dd = Span2<T>(a.dd.data(), a.dd.extent(0), n);
    return r;
  }
};

}  // namespace gnh::kernels
