// SPDX-License-Identifier: BSD-3-Clause
// GELU, exact (erf, nanoGPT's default) or the tanh approximation.
//   erf:   y = x Phi(x) = x/2 (1 + erf(x/sqrt2)),  y' = Phi(x) + x phi(x)
//   tanh:  y = x/2 (1 + tanh u),  u = sqrt(2/pi)(x + 0.044715 x^3),
//          y' = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) u'
//   reverse: dx = dy y'(x); the derivative modes apply y', y'' at the primal
//   point to each direction (gelu_derivatives).
// Saves nothing: the other modes recompute from the pre-activation x.
#pragma once
#include <type_traits>

#include "core/fastmath.hpp"
#include "core/gelu_kind.hpp"
#include "core/planes.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/cloned.hpp"
#include "kernels/host_vec.hpp"
#include "kernels/op.hpp"
#include "kernels/cut.hpp"
#include "kernels/instances.hpp"

namespace gnh::kernels {

// The primal value and first two derivatives at x (erf: phi = exp(-x^2/2)/
// sqrt(2 pi), f'' = phi (2 - x^2); tanh: with t = tanh u, f'' = (1 - t^2)
// (u' + x/2 (u'' - 2 t u'^2))). The kernels evaluate them once per element and
// apply them to every direction: y' = f' x', y'' = f'' x'^2 + f' x'' (forward);
// dx = f' dy, dx' = f' dy' + f'' x' dy (reverse and its tangent).
template <bool Exact, int Order, class T>
KOKKOS_FORCEINLINE_FUNCTION void gelu_derivatives(T x, T& f, T& f1, T& f2) {
  if constexpr (Exact) {
    if constexpr (Order == 0) {
      f = x * (T(0.5) * (fast_erf(x * T(0.70710678118654752440)) + T(1)));
      return;
    }
    // phi from the exponential erf evaluates anyway: exp(-(x/sqrt2)^2).
    T e;
    const T Phi = T(0.5) * (fast_erf_exp(x * T(0.70710678118654752440), e) + T(1));
    f = x * Phi;
    if constexpr (Order >= 1) {
      const T phi = e * T(0.39894228040143267794);  // 1/sqrt(2 pi)
      f1 = Phi + x * phi;
      f2 = phi * (T(2) - x * x);
    }
  } else {
    const T a = T(0.79788456080286535588), b = T(0.044715);
    const T t = kmath::tanh(a * (x + b * x * x * x));
    f = T(0.5) * x * (t + T(1));
    if constexpr (Order >= 1) {
      const T du = a * (T(1) + T(3) * b * x * x), ddu = T(6) * a * b * x, sech2 = T(1) - t * t;
      f1 = T(0.5) * (t + T(1)) + T(0.5) * x * sech2 * du;
      f2 = sech2 * (du + T(0.5) * x * (ddu - T(2) * t * du * du));
    }
  }
}

// The value plane is one flat loop. The derivative modes evaluate f, f', f''
// once per element and apply them to all K directions: a work item is a
// chunk of GeluChunk elements, whose f' and f'' stay in L1 or L2 while the
// directions' planes stream past. On a host space a chunk is 8192 elements,
// so each plane's loop over it vectorises and is one long stream (with 256,
// the planes' 4 K streams changed every 1 KiB: on the Zen 4, AVX2 build,
// bench_kernels --op gelu at K = 16, second order 5.4-6.3 -> 3.5-3.6 ms,
// tangent 3.0-3.8 -> 2.2-2.4 ms, tangent of the reverse 4.7-5.1 -> 3.2-3.5
// ms; 2048 sat between); on a GPU it is one element per thread, its
// directions in a loop, coalesced across threads. (Re-evaluating f', f''
// per direction, as before, cost 0.55 ms per direction and layer in the
// second order at preset small on AVX2.)
namespace detail {
constexpr index_t GeluChunk = Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible ? 8192 : 1;

// The chunk of NC elements on this space: GeluChunk, halved (down to 256)
// while that leaves fewer than 4 chunks a thread, so that many host threads
// (72 on a Grace) still share a small layer.
inline index_t gelu_chunk(const ExecSpace& space, index_t NC) {
  index_t L = GeluChunk;
  const index_t threads = index_t(space.concurrency());
  while (L > 256 && (NC + L - 1) / L < 4 * threads) L /= 2;
  return L;
}

// y = f(x) over NC elements of kind E, and with the slope f'(x) (slope may be
// x). On host builds exact GELU in float goes to host_vec.cpp in chunks (a
// loop compiled for the processor's vector width in a portable binary).
template <bool E, class T>
void gelu_value_plane(const ExecSpace& space, const T* xv, T* yv, index_t NC) {
  Kokkos::parallel_for(
      "gnh::gelu::forward", range(space, NC), KOKKOS_LAMBDA(const index_t i) {
        T f, f1, f2;
        gelu_derivatives<E, 0>(xv[i], f, f1, f2);
        yv[i] = f;
      });
}
template <bool E, class T>
void gelu_value_slope_kind(const ExecSpace& space, T* y, T* slope, const T* x, index_t NC) {
  Kokkos::parallel_for(
      "gnh::gelu::forward::slope", range(space, NC), KOKKOS_LAMBDA(const index_t i) {
        T f, f1, f2;
        gelu_derivatives<E, 1>(x[i], f, f1, f2);
        y[i] = f;
        slope[i] = f1;
      });
}
// The GPU-shaped gradient's pair (the gradient engine under bf16-amp keeps
// its layers' inputs rounded, model/gpt_impl.hpp): the forward writes y =
// f(x) rounded (D its storage) and keeps x; the reverse forms f'(x) from x
// again, and writes dx = dy f'(x) rounded for the next products (and in T
// where dx is not null). Both evaluate f and f' as gelu_value_slope_kind
// does, so y and f' have its bits; on host builds exact GELU in float takes
// host_vec.cpp's loop over the same chunks, the values it does not keep in a
// chunk's buffer on the stack.
#if !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL)
constexpr bool kHostGelu = true;
#else
constexpr bool kHostGelu = false;
#endif
// On a host space, exact GELU's f(x) and f'(x) in float formed by
// host_vec.cpp chunk by chunk (gelu_chunk elements) into buffers on the
// stack, and use(i0, n, f, f') called on each chunk's.
template <class Use>
void host_gelu_chunks(const ExecSpace& space, const char* label, const float* x, index_t NC, Use use) {
  const index_t L = gelu_chunk(space, NC);
  Kokkos::parallel_for(label, range(space, (NC + L - 1) / L), [=](const index_t c) {
    const index_t i0 = c * L, n = NC - i0 < L ? NC - i0 : L;
    float f[GeluChunk], f1[GeluChunk];
    host::gelu_erf_value_slope(x + i0, f, f1, n);
    use(i0, n, f, f1);
  });
}
template <bool E, class T, class D>
void gelu_value_rounded_kind(const ExecSpace& space, D* y, const T* x, index_t NC) {
  if constexpr (kHostGelu && E && std::is_same<T, float>::value && std::is_same<D, float>::value) {
    host_gelu_chunks(space, "gnh::gelu::forward::slope", x, NC,
                     [=](index_t i0, index_t n, const float* f, const float*) {
                       for (index_t j = 0; j < n; ++j) y[i0 + j] = round_bf16(f[j]);
                     });
    return;
  }
  Kokkos::parallel_for(
      "gnh::gelu::forward::slope", range(space, NC), KOKKOS_LAMBDA(const index_t i) {
        T f, f1, f2;
        gelu_derivatives<E, 1>(x[i], f, f1, f2);
        y[i] = bf16_as<D>(f);
      });
}
template <bool E, class T, class D>
void gelu_reverse_rounded_kind(const ExecSpace& space, T* dx, const T* dy, const T* x, D* rounded, index_t NC) {
  if constexpr (kHostGelu && E && std::is_same<T, float>::value && std::is_same<D, float>::value) {
    host_gelu_chunks(space, "gnh::gelu::reverse::slope", x, NC,
                     [=](index_t i0, index_t n, const float*, const float* slope) {
                       for (index_t j = 0; j < n; ++j) {
                         const float v = dy[i0 + j] * slope[j];
                         rounded[i0 + j] = round_bf16(v);
                         if (dx) dx[i0 + j] = v;
                       }
                     });
    return;
  }
  Kokkos::parallel_for(
      "gnh::gelu::reverse::slope", range(space, NC), KOKKOS_LAMBDA(const index_t i) {
        T f, f1, f2;
        gelu_derivatives<E, 1>(x[i], f, f1, f2);
        const T v = dy[i] * f1;
        rounded[i] = bf16_as<D>(v);
        if (dx) dx[i] = v;
      });
}
#if !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL)
template <>
inline void gelu_value_plane<true, float>(const ExecSpace& space, const float* xv, float* yv, index_t NC) {
  const index_t L = gelu_chunk(space, NC);
  Kokkos::parallel_for("gnh::gelu::forward", range(space, (NC + L - 1) / L), [=](const index_t c) {
    const index_t i0 = c * L;
    host::gelu_erf_value(xv + i0, yv + i0, NC - i0 < L ? NC - i0 : L);
  });
}
template <>
inline void gelu_value_slope_kind<true, float>(const ExecSpace& space, float* y, float* slope, const float* x,
                                               index_t NC) {
  const index_t L = gelu_chunk(space, NC);
  Kokkos::parallel_for("gnh::gelu::forward::slope", range(space, (NC + L - 1) / L), [=](const index_t c) {
    const index_t i0 = c * L;
    host::gelu_erf_value_slope(x + i0, y + i0, slope + i0, NC - i0 < L ? NC - i0 : L);
  });
}
#endif

// The loops of one GELU kind E (a template parameter, so that they have no
// branch on it and vectorise; a named function rather than a generic lambda,
// which nvcc does not allow around device lambdas).
template <bool E, class S>
void gelu_forward_kind(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> x, index_t NC, index_t K) {
  using T = base_t<S>;
  constexpr bool second = std::is_same<S, Jet2<T>>::value;
  const index_t L = gelu_chunk(space, NC);
  const T* xv = x.v.data();
  T* yv = y.v.data();
  if (K == 0) {
    Traffic("gnh::gelu::forward").add(double(NC), 2 * sizeof(T), 2);
    return gelu_value_plane<E, T>(space, xv, yv, NC);
  }
  Traffic("gnh::gelu::forward::directions").add(double((2 + (second ? 4 : 2) * K) * NC), sizeof(T), 2);
  const T* xd = x.d.data();
  T* yd = y.d.data();
  const T* xdd = second ? x.dd.data() : nullptr;
  T* ydd = second ? y.dd.data() : nullptr;
  Kokkos::parallel_for("gnh::gelu::forward::directions", range(space, (NC + L - 1) / L),
                       cloned(KOKKOS_LAMBDA(const index_t c) {
                         const index_t i0 = c * L, n = NC - i0 < L ? NC - i0 : L;
                         T f1[GeluChunk], f2[GeluChunk];
                         for (index_t j = 0; j < n; ++j) gelu_derivatives<E, 1>(xv[i0 + j], yv[i0 + j], f1[j], f2[j]);
                         for (index_t k = 0; k < K; ++k) {
                           const index_t o = k * NC + i0;
                           if (second) {  // not if constexpr: nvcc's lambdas cannot first-capture in one
                             for (index_t j = 0; j < n; ++j) {
                               const T a = xd[o + j];
                               yd[o + j] = f1[j] * a;
                               ydd[o + j] = f2[j] * a * a + f1[j] * xdd[o + j];
                             }
                           } else {
                             for (index_t j = 0; j < n; ++j) yd[o + j] = f1[j] * xd[o + j];
                           }
                         }
                       }));
}

template <bool E, class S>
void gelu_reverse_kind(const ExecSpace& space, Act2<base_t<S>> dx, Act2<base_t<S>> dy, Act2<base_t<S>> x, index_t NC,
                       index_t K) {
  using T = base_t<S>;
  const index_t L = gelu_chunk(space, NC);
  const T *xv = x.v.data(), *dyv = dy.v.data();
  T* dxv = dx.v.data();
  Traffic(K == 0 ? "gnh::gelu::reverse" : "gnh::gelu::reverse::directions").add(double((3 + 3 * K) * NC), sizeof(T), 2);
  if (K == 0) {
    Kokkos::parallel_for(
        "gnh::gelu::reverse", range(space, NC), KOKKOS_LAMBDA(const index_t i) {
          T f, f1, f2;
          gelu_derivatives<E, 1>(xv[i], f, f1, f2);
          dxv[i] = dyv[i] * f1;
        });
    return;
  }
  const T *xd = x.d.data(), *dyd = dy.d.data();
  T* dxd = dx.d.data();
  // Within a chunk the tangent planes first: they read dy's value plane,
  // which may be dx's.
  Kokkos::parallel_for("gnh::gelu::reverse::directions", range(space, (NC + L - 1) / L),
                       cloned(KOKKOS_LAMBDA(const index_t c) {
                         const index_t i0 = c * L, n = NC - i0 < L ? NC - i0 : L;
                         T f1[GeluChunk], f2[GeluChunk];
                         for (index_t j = 0; j < n; ++j) {
                           T f;
                           gelu_derivatives<E, 1>(xv[i0 + j], f, f1[j], f2[j]);
                         }
                         for (index_t k = 0; k < K; ++k) {
                           const index_t o = k * NC + i0;
                           for (index_t j = 0; j < n; ++j)
                             dxd[o + j] = dyd[o + j] * f1[j] + dyv[i0 + j] * f2[j] * xd[o + j];
                         }
                         for (index_t j = 0; j < n; ++j) dxv[i0 + j] = dyv[i0 + j] * f1[j];
                       }));
}
// y = f(x) with the slope f'(x) beside it (the plain reverse's pair).

// GELU's output column j from its input's planes, for elementwise_cut: y =
// f(x), c = (f'(x), f''(x)).
template <bool E, class T>
struct GeluElement {
  static constexpr int kCoefficients = 2;
  KOKKOS_INLINE_FUNCTION void primal(const T* x, index_t j, T& y, T* c) const {
    gelu_derivatives<E, 1>(x[j], y, c[0], c[1]);
  }
  KOKKOS_INLINE_FUNCTION void tangents(const T* c, const T* xd, const T* xdd, index_t j, T& y1, T& y2) const {
    const T d = xd[j];
    y1 = c[0] * d;
    if (xdd) y2 = c[1] * d * d + c[0] * xdd[j];
    else y2 = c[1] * d * d;  // x'' null: zero
  }
};
}  // namespace detail

// The second-order forward (x with K tangent and second-order planes) with
// an adjoint cut at its output: y and y' as gelu_forward<Jet2<T>> writes
// them; y'' is not written (y needs no second-order planes) but contracted
// as it is formed with the cut's adjoint adj (N, C) into acc (K, N), as the
// model's cut would read it back (model/gpt_impl.hpp, adjoint cuts).
// rounded (not null): y and y' written there as the next layer's rounded
// input instead (elementwise_cut).
template <class T, class D = T>
void gelu_forward_cut(const ExecSpace& space, Act2<T> y, Act2<T> x, Gelu kind, Act2<T> adj, View2<double> acc,
                      D* rounded = nullptr) {
  if (kind == Gelu::erf)
    elementwise_cut(space, "gnh::gelu::forward::cut", y, x, adj, acc, 1, detail::GeluElement<true, T>{}, rounded);
  else elementwise_cut(space, "gnh::gelu::forward::cut", y, x, adj, acc, 1, detail::GeluElement<false, T>{}, rounded);
}

template <class S>
void gelu_forward(const ExecSpace& space, Act2<base_t<S>> y, Act2<base_t<S>> x, Gelu kind) {
  keep_planes<S>(y, x);
  using T = base_t<S>;
  constexpr bool tangents = !std::is_same<S, T>::value;
  const index_t N = x.rows(), C = x.cols(), K = tangents ? x.d.extent(0) : 0;
  require_extent("gnh::gelu::forward", "y rows", y.rows(), N);
  require_extent("gnh::gelu::forward", "y cols", y.cols(), C);
  require_planes<S>("gnh::gelu::forward", "x", x, K);
  require_planes<S>("gnh::gelu::forward", "y", y, K);
  if (kind == Gelu::erf) detail::gelu_forward_kind<true, S>(space, y, x, N * C, K);
  else detail::gelu_forward_kind<false, S>(space, y, x, N * C, K);
}

template <class S>
void gelu_reverse(const ExecSpace& space, Act2<base_t<S>> dx, Act2<base_t<S>> dy, Act2<base_t<S>> x, Gelu kind) {
  keep_planes<S>(dx, dy, x);
  using T = base_t<S>;
  constexpr bool tangents = !std::is_same<S, T>::value;
  const index_t N = x.rows(), C = x.cols(), K = tangents ? x.d.extent(0) : 0;
  require_extent("gnh::gelu::reverse", "dy rows", dy.rows(), N);
  require_extent("gnh::gelu::reverse", "dx rows", dx.rows(), N);
  require_planes<S>("gnh::gelu::reverse", "dy", dy, K);
  require_planes<S>("gnh::gelu::reverse", "dx", dx, K);
  if (kind == Gelu::erf) detail::gelu_reverse_kind<true, S>(space, dx, dy, x, N * C, K);
  else detail::gelu_reverse_kind<false, S>(space, dx, dy, x, N * C, K);
}

// The plain reverse (no directions) recomputes y = gelu(x) just before it
// needs dx = dy f'(x): gelu_forward_slope evaluates GELU once for both, y and
// the slope f'(x) into `slope` (N, C) (which may be dx's plane: the model
// passes the buffer that gelu_reverse_slope then overwrites), and
// gelu_reverse_slope multiplies. gelu_forward then gelu_reverse evaluated it
// twice: on AVX2 at preset small the pair took 0.29 + 0.33 ms a layer.
template <class T>
void gelu_forward_slope(const ExecSpace& space, Span2<T> y, Span2<T> slope, Span2<const T> x, Gelu kind) {
  const index_t N = x.extent(0), C = x.extent(1);
  require_extent("gnh::gelu::forward_slope", "y rows", y.extent(0), N);
  require_extent("gnh::gelu::forward_slope", "y cols", y.extent(1), C);
  require_extent("gnh::gelu::forward_slope", "slope rows", slope.extent(0), N);
  require_extent("gnh::gelu::forward_slope", "slope cols", slope.extent(1), C);
  Traffic("gnh::gelu::forward::slope").add(double(3 * N * C), sizeof(T), 2);
  if (kind == Gelu::erf) detail::gelu_value_slope_kind<true, T>(space, y.data(), slope.data(), x.data(), N * C);
  else detail::gelu_value_slope_kind<false, T>(space, y.data(), slope.data(), x.data(), N * C);
}

// The primal forward of an engine that keeps each layer's GELU for its
// reverse: y = f(x), and the slope f'(x) over the pre-activation x, which
// the reverse then no longer needs (gelu_reverse_slope takes it from there).
template <class T>
void gelu_forward_slope_in_place(const ExecSpace& space, Span2<T> y, Span2<T> x_slope, Gelu kind) {
  const index_t N = x_slope.extent(0), C = x_slope.extent(1);
  require_extent("gnh::gelu::forward_slope_in_place", "y rows", y.extent(0), N);
  require_extent("gnh::gelu::forward_slope_in_place", "y cols", y.extent(1), C);
  Traffic("gnh::gelu::forward::slope").add(double(3 * N * C), sizeof(T), 2);
  // The same loop as gelu_forward_slope's, its slope over its input: each
  // element is read before it is written, and the compiler's alias check
  // for the vector loop passes equal pointers (measured as fast as distinct ones).
  if (kind == Gelu::erf) detail::gelu_value_slope_kind<true, T>(space, y.data(), x_slope.data(), x_slope.data(), N * C);
  else detail::gelu_value_slope_kind<false, T>(space, y.data(), x_slope.data(), x_slope.data(), N * C);
}

// The forward of an engine that keeps its layers' inputs rounded: y = f(x)
// written only as the next product's rounded input (rounded: N x C values in
// the GEMMs' bfloat16 storage, those a product rounding y would read), x
// kept for gelu_reverse_rounded.
template <class T, class D>
void gelu_forward_rounded(const ExecSpace& space, D* rounded, Span2<const T> x, Gelu kind) {
  const index_t N = x.extent(0), C = x.extent(1);
  Traffic("gnh::gelu::forward::slope").add(double(N * C), sizeof(T), 2).add(double(N * C), 2, 2);
  if (kind == Gelu::erf) detail::gelu_value_rounded_kind<true, T, D>(space, rounded, x.data(), N * C);
  else detail::gelu_value_rounded_kind<false, T, D>(space, rounded, x.data(), N * C);
}

// Its reverse: dx = dy f'(x), f' formed from x again, written as the next
// product's rounded adjoint (rounded, as above) and in FP32 only where dx has
// rows (a bias's column sums read it).
template <class T, class D>
void gelu_reverse_rounded(const ExecSpace& space, Span2<T> dx, Span2<const T> dy, Span2<const T> x, Gelu kind,
                          D* rounded) {
  const index_t N = dy.extent(0), C = dy.extent(1);
  const bool fp32 = dx.extent(0) > 0;
  if (fp32) {
    require_extent("gnh::gelu::reverse", "dx rows", dx.extent(0), N);
    require_extent("gnh::gelu::reverse", "dx cols", dx.extent(1), C);
  }
  require_extent("gnh::gelu::reverse", "x rows", x.extent(0), N);
  require_extent("gnh::gelu::reverse", "x cols", x.extent(1), C);
  Traffic("gnh::gelu::reverse::slope").add(double((fp32 ? 3 : 2) * N * C), sizeof(T), 2).add(double(N * C), 2, 2);
  T* const out = fp32 ? dx.data() : nullptr;
  if (kind == Gelu::erf) detail::gelu_reverse_rounded_kind<true, T, D>(space, out, dy.data(), x.data(), rounded, N * C);
  else detail::gelu_reverse_rounded_kind<false, T, D>(space, out, dy.data(), x.data(), rounded, N * C);
}

// dx = dy * slope, elementwise; dx may be slope's plane.
template <class T>
void gelu_reverse_slope(const ExecSpace& space, Span2<T> dx, Span2<const T> dy, Span2<const T> slope) {
  const index_t N = dy.extent(0), C = dy.extent(1);
  require_extent("gnh::gelu::reverse_slope", "dx rows", dx.extent(0), N);
  require_extent("gnh::gelu::reverse_slope", "dx cols", dx.extent(1), C);
  require_extent("gnh::gelu::reverse_slope", "slope rows", slope.extent(0), N);
  T* out = dx.data();
  const T *g = dy.data(), *f1 = slope.data();
  Traffic("gnh::gelu::reverse::slope").add(double(3 * N * C), sizeof(T), 2);
  Kokkos::parallel_for(
      "gnh::gelu::reverse::slope", range(space, N * C), KOKKOS_LAMBDA(const index_t i) { out[i] = g[i] * f1[i]; });
}

// The op contract (kernels/op.hpp): elementwise on (N, C), no parameters; as
// the model uses it, on the MLP's (N, 4C) pre-activation.
template <class T>
struct GeluOp {
  static constexpr const char* name = "gelu";
  index_t N, C;
  Gelu kind;
  GeluOp(index_t N_, index_t C_, Gelu kind_) : N(N_), C(C_), kind(kind_) {}
  static GeluOp at(const OpDims& d, index_t) { return GeluOp(d.B * d.T, 4 * d.C, Gelu::erf); }
  OpSizes sizes() const { return {N, C, C, 0}; }
  std::vector<OpExtent> saved() const { return {}; }
  double flops(OpMode, index_t) const { return 0.0; }
  template <class S>
  void forward(const ExecSpace& space, Act2<T> y, Act2<T> x, Params<T>, const OpSaved<T>&) const {
    gelu_forward<S>(space, y, x, kind);
  }
  template <class S>
  void reverse(const ExecSpace& space, Act2<T> dx, Grads<T>, Act2<T> dy, Act2<T> x, Act2<T>, Params<T>,
               const OpSaved<T>&) const {
    gelu_reverse<S>(space, dx, dy, x, kind);
  }
};

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_GELU_FORWARD(EXT, S) \
  EXT template void gelu_forward<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>, Gelu);
#define GNH_GELU_REVERSE(EXT, S) \
  EXT template void gelu_reverse<S>(const ExecSpace&, Act2<base_t<S>>, Act2<base_t<S>>, Act2<base_t<S>>, Gelu);
#define GNH_GELU(EXT, T) GNH_FORWARD_SCALARS(GNH_GELU_FORWARD, EXT, T) GNH_REVERSE_SCALARS(GNH_GELU_REVERSE, EXT, T)
GNH_GELU(extern, float)
GNH_GELU(extern, double)

}  // namespace gnh::kernels
