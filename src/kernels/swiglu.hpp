// SPDX-License-Identifier: BSD-3-Clause
// The gate of the Llama family's SwiGLU MLP (SPEC §11): a row x = [a | b] of
// 2F values (gate_proj's and up_proj's outputs side by side: their weights
// are consecutive in the canonical order, so one linear layer forms both)
// gives y = silu(a) * b, F values, with silu(a) = a sigma(a):
//   silu'(a)  = sigma (1 + a (1 - sigma))
//   tangent:  y' = silu'(a) a' b + silu(a) b'
//   second:   y'' = silu''(a) a'^2 b + silu'(a) a'' b + 2 silu'(a) a' b' + silu(a) b''
//   reverse:  da = dy silu'(a) b,  db = dy silu(a)
//   tangent of reverse: the reverse in Dual arithmetic
// Every mode evaluates the element in its own scalar (core/jet.hpp), one
// thread per output element over the directions in turn. Saves nothing; the
// caller keeps x.
#pragma once
#include "core/jet.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

namespace detail {

// sigma(a), in any scalar of core/jet.hpp.
template <class S>
KOKKOS_INLINE_FUNCTION S swiglu_sigma(const S& a) {
  return base_t<S>(1) / (base_t<S>(1) + jexp(-a));
}

// f(k, n, j, a, b) for every output element (n, j) of an (N, F) gate and
// every plane k, the element's a and b in S: one thread an element, the
// planes in turn.
template <class S, class F>
void for_gate_elements(const ExecSpace& space, const char* label, Act2<base_t<S>> x, index_t N, index_t Fw, index_t K,
                       const F& f) {
  using io = Io<S>;
  Kokkos::parallel_for(
      label, range(space, N * Fw), KOKKOS_LAMBDA(const index_t i) {
        const index_t n = i / Fw, j = i - n * Fw;
        for (int k = 0; k < K; ++k) f(k, n, j, io::get(x, k, n, j), io::get(x, k, n, Fw + j));
      });
}

}  // namespace detail

template <class S>
void swiglu_forward(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> x) {
  keep_planes<S>(y, x);
  using io = Io<S>;
  const index_t N = x.rows(), F = y.cols(), K = directions_of<S>(x);
  require_extent("gnh::swiglu::forward", "y rows", y.rows(), N);
  require_extent("gnh::swiglu::forward", "x cols (2 F)", x.cols(), 2 * F);
  detail::for_gate_elements<S>(
      space, "gnh::swiglu::forward", x, N, F, K,
      KOKKOS_LAMBDA(const int k, const index_t n, const index_t f, const S& a, const S& b) {
        io::put(y, k, n, f, a * detail::swiglu_sigma(a) * b);
      });
}

// dx (N, 2F) = [dy silu'(a) b | dy silu(a)], overwritten.
template <class S>
void swiglu_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Act2<base_t<S>> dy, Act2<base_t<S>> x) {
  keep_planes<S>(dx, dy, x);
  using io = Io<S>;
  using T = base_t<S>;
  const index_t N = x.rows(), F = dy.cols(), K = directions_of<S>(x);
  require_extent("gnh::swiglu::reverse", "dy rows", dy.rows(), N);
  require_extent("gnh::swiglu::reverse", "dx rows", dx.rows(), N);
  require_extent("gnh::swiglu::reverse", "x cols (2 F)", x.cols(), 2 * F);
  detail::for_gate_elements<S>(
      space, "gnh::swiglu::reverse", x, N, F, K,
      KOKKOS_LAMBDA(const int k, const index_t n, const index_t f, const S& a, const S& b) {
        const S g = io::get(dy, k, n, f), sigma = detail::swiglu_sigma(a), silu = a * sigma;
        const S slope = sigma * (T(1) + a * (T(1) - sigma));
        io::put(dx, k, n, f, g * slope * b);
        io::put(dx, k, n, F + f, g * silu);
      });
}

// The op contract (kernels/op.hpp): no parameters, nothing saved; (N, 2F)
// in, (N, F) out. As the model uses it: F = 4C rows of a microbatch.
template <class T>
struct SwigluOp {
  static constexpr const char* name = "swiglu";
  index_t N, F;
  SwigluOp(index_t N_, index_t F_) : N(N_), F(F_) {}
  static SwigluOp at(const OpDims& d, index_t) { return SwigluOp(d.B * d.T, 4 * d.C); }
  OpSizes sizes() const { return {N, 2 * F, F, 0}; }
  std::vector<OpExtent> saved() const { return {}; }
  double flops(OpMode, index_t) const { return 0.0; }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T>, const OpSaved<T>&) const {
    swiglu_forward<S>(space, y, x);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T>, Act2<T> dy, Act2<T> x, Act2<T>, Params<T>,
               const OpSaved<T>&) const {
    swiglu_reverse<S>(space, dx, dy, x);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_SWIGLU_FORWARD(EXT, S) \
  EXT template void swiglu_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>);
#define GNH_SWIGLU_REVERSE(EXT, S) \
  EXT template void swiglu_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>, Act2<base_t<S>>);
#define GNH_SWIGLU(EXT, T) \
  GNH_FORWARD_SCALARS(GNH_SWIGLU_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_SWIGLU_REVERSE, EXT, T)
GNH_SWIGLU(extern, float)
GNH_SWIGLU(extern, double)

}  // namespace gnh::kernels
