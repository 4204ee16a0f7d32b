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
// Every mode evaluates silu, silu' and silu'' once per element at the primal
// point (the float exponential of core/fastmath.hpp) and applies them to
// every direction's planes, as GELU does: on a host space a task is a chunk
// of 64 elements of one row, its coefficients kept while the K planes stream
// past (vectorised along the row); on a GPU one element per thread. Saves
// nothing; the caller keeps x.
#pragma once
#include <type_traits>

#include "core/fastmath.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/cloned.hpp"
#include "kernels/op.hpp"
#include "kernels/instances.hpp"
#include "kernels/cut.hpp"

namespace gnh::kernels {

namespace detail {

// Elements of a row per host task (1 on a GPU: an element per thread).
inline constexpr index_t kSwigluChunk = std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace> &&
                                                Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible
                                            ? 64
                                            : 1;

// silu(a), silu'(a) and silu''(a) = sigma (1 - sigma) (2 + a (1 - 2 sigma)).
template <class T>
KOKKOS_INLINE_FUNCTION void silu_coefficients(const T a, T& silu, T& s1, T& s2) {
  const T sg = T(1) / (T(1) + fast_exp(-a));
  silu = a * sg;
  s1 = sg * (T(1) + a * (T(1) - sg));
  s2 = sg * (T(1) - sg) * (T(2) + a * (T(1) - T(2) * sg));
}

// f(n, j0, m) for every chunk of m <= kSwigluChunk elements (n, j0 .. j0 +
// m - 1) of the (N, F) gate.
template <class F>
void for_gate_chunks(const ExecSpace& space, const char* label, index_t N, index_t Fw, const F& f) {
  const index_t per_row = (Fw + kSwigluChunk - 1) / kSwigluChunk;
  Kokkos::parallel_for(label, range(space, N * per_row), cloned(KOKKOS_LAMBDA(const index_t i) {
                         const index_t n = i / per_row, j0 = (i - n * per_row) * kSwigluChunk;
                         f(n, j0, Fw - j0 < kSwigluChunk ? Fw - j0 : kSwigluChunk);
                       }));
}

// The gate's output column j from its input's planes (x = [a | b], F
// columns each), for elementwise_cut.
// y = silu(a) b, c = (silu(a), silu'(a), silu''(a), b).
template <class T>
struct SwigluElement {
  static constexpr int kCoefficients = 4;
  index_t F;
  KOKKOS_INLINE_FUNCTION void primal(const T* x, index_t j, T& y, T* c) const {
    silu_coefficients(x[j], c[0], c[1], c[2]);
    c[3] = x[F + j];
    y = c[0] * c[3];
  }
  KOKKOS_INLINE_FUNCTION void tangents(const T* c, const T* xd, const T* xdd, index_t j, T& y1, T& y2) const {
    const T silu = c[0], s1 = c[1], s2 = c[2], b = c[3], ad = xd[j], bd = xd[F + j];
    y1 = s1 * ad * b + silu * bd;
    if (xdd) y2 = (s2 * ad * ad + s1 * xdd[j]) * b + T(2) * s1 * ad * bd + silu * xdd[F + j];
    else y2 = s2 * ad * ad * b + T(2) * s1 * ad * bd;  // x'' null: zero
  }
};

}  // namespace detail

// The second-order forward with an adjoint cut at its output (as
// gelu_forward_cut): y and y' as swiglu_forward<Jet2<T>> writes them, y''
// contracted with the cut's adjoint adj (N, F) into acc (K, N), not stored.
template <class T, class D = T>
void swiglu_forward_cut(const ExecSpace& space, Act2<T> y, Act2<T> x, Act2<T> adj, View2<double> acc,
                        D* rounded = nullptr) {
  elementwise_cut(space, "gnh::swiglu::forward::cut", y, x, adj, acc, 2, detail::SwigluElement<T>{y.cols()}, rounded);
}

template <class S>
void swiglu_forward(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> x) {
  keep_planes<S>(y, x);
  using T = base_t<S>;
  const index_t N = x.rows(), F = y.cols(), K = has_tangents_v<S> ? x.d.extent(0) : 0;
  const bool second = has_second_v<S>;
  require_extent("gnh::swiglu::forward", "y rows", y.rows(), N);
  require_extent("gnh::swiglu::forward", "x cols (2 F)", x.cols(), 2 * F);
  Traffic("gnh::swiglu::forward").add(double(3 * (1 + K * (second ? 2 : 1)) * N * F), sizeof(T), 2);
  detail::for_gate_chunks(
      space, "gnh::swiglu::forward", N, F, KOKKOS_LAMBDA(const index_t n, const index_t j0, const index_t m) {
        T silu[detail::kSwigluChunk], s1[detail::kSwigluChunk], s2[detail::kSwigluChunk];
        const T* a = &x.v(n, j0);
        const T* b = a + F;
        T* out = &y.v(n, j0);
        for (index_t j = 0; j < m; ++j) {
          detail::silu_coefficients(a[j], silu[j], s1[j], s2[j]);
          out[j] = silu[j] * b[j];
        }
        for (index_t k = 0; k < K; ++k) {
          const T* ad = &x.d(k, n, j0);
          const T* bd = ad + F;
          T* yd = &y.d(k, n, j0);
          for (index_t j = 0; j < m; ++j) yd[j] = s1[j] * ad[j] * b[j] + silu[j] * bd[j];
          if (!second) continue;
          const T* add = &x.dd(k, n, j0);
          const T* bdd = add + F;
          T* ydd = &y.dd(k, n, j0);
          for (index_t j = 0; j < m; ++j)
            ydd[j] = (s2[j] * ad[j] * ad[j] + s1[j] * add[j]) * b[j] + T(2) * s1[j] * ad[j] * bd[j] + silu[j] * bdd[j];
        }
      });
}

// The primal forward with y (N, F) written only as the next product's
// rounded input (rounded: N x F values in the GEMMs' bfloat16 storage), the
// values swiglu_forward's y rounds to (the gradient engine under bf16-amp
// keeps them for its reverse, model/gpt_impl.hpp).
template <class T, class D>
void swiglu_forward_rounded(const ExecSpace& space, D* rounded, Act2<T> x, index_t F) {
  const index_t N = x.rows();
  require_extent("gnh::swiglu::forward", "x cols (2 F)", x.cols(), 2 * F);
  Traffic("gnh::swiglu::forward").add(double(2 * N * F), sizeof(T), 2).add(double(N * F), 2, 2);
  detail::for_gate_chunks(
      space, "gnh::swiglu::forward", N, F, KOKKOS_LAMBDA(const index_t n, const index_t j0, const index_t m) {
        const T* a = &x.v(n, 0) + j0;
        D* out = rounded + n * F + j0;
        for (index_t j = 0; j < m; ++j) {
          T silu, s1, s2;
          detail::silu_coefficients(a[j], silu, s1, s2);
          out[j] = bf16_as<D>(silu * a[F + j]);
        }
      });
}

// dx (N, 2F) = [dy silu'(a) b | dy silu(a)], overwritten; with tangents
// (Dual), da' = dy' silu' b + dy (silu'' a' b + silu' b') and db' = dy' silu + dy silu' a'.
template <class S>
void swiglu_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Act2<base_t<S>> dy, Act2<base_t<S>> x) {
  keep_planes<S>(dx, dy, x);
  using T = base_t<S>;
  const index_t N = x.rows(), F = dy.cols(), K = has_tangents_v<S> ? x.d.extent(0) : 0;
  require_extent("gnh::swiglu::reverse", "dy rows", dy.rows(), N);
  require_extent("gnh::swiglu::reverse", "dx rows", dx.rows(), N);
  require_extent("gnh::swiglu::reverse", "x cols (2 F)", x.cols(), 2 * F);
  Traffic("gnh::swiglu::reverse").add(double(5 * (1 + K) * N * F), sizeof(T), 2);
  detail::for_gate_chunks(
      space, "gnh::swiglu::reverse", N, F, KOKKOS_LAMBDA(const index_t n, const index_t j0, const index_t m) {
        T silu[detail::kSwigluChunk], s1[detail::kSwigluChunk], s2[detail::kSwigluChunk];
        const T* a = &x.v(n, j0);
        const T* b = a + F;
        const T* g = &dy.v(n, j0);
        T* da = &dx.v(n, j0);
        T* db = da + F;
        for (index_t j = 0; j < m; ++j) {
          detail::silu_coefficients(a[j], silu[j], s1[j], s2[j]);
          da[j] = g[j] * s1[j] * b[j];
          db[j] = g[j] * silu[j];
        }
        for (index_t k = 0; k < K; ++k) {
          const T* ad = &x.d(k, n, j0);
          const T* bd = ad + F;
          const T* gd = &dy.d(k, n, j0);
          T* dad = &dx.d(k, n, j0);
          T* dbd = dad + F;
          for (index_t j = 0; j < m; ++j) {
            dad[j] = gd[j] * s1[j] * b[j] + g[j] * (s2[j] * ad[j] * b[j] + s1[j] * bd[j]);
            dbd[j] = gd[j] * silu[j] + g[j] * s1[j] * ad[j];
          }
        }
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
