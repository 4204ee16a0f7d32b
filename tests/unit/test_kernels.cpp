// SPDX-License-Identifier: BSD-3-Clause
// Every forward kernel against the plain double host reference, at awkward
// sizes, with outputs pre-filled with NaN.
//
// Tolerances: the reference is evaluated on the same (rounded) inputs in
// double, so the difference is the kernel's own rounding. A length-K dot
// product in precision eps errs by at most K*eps*sum|a_i b_i| (Higham, Thm 3.1
// to first order); elementwise maths (exp, erf, tanh, sqrt) adds a few eps per
// op. Each check below states K and the magnitude it multiplies.
#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/colsum.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rotary.hpp"
#include "kernels/swiglu.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"
#include "kernels/narrow.hpp"
#include "kernels/ops.hpp"
#include "kernels/residual.hpp"
#include "support/ops.hpp"
#include "support/reference.hpp"

using namespace gnh;
using gnh::test::Buf;
using gnh::test::Flat;

namespace {
template <class T>
constexpr double eps() {
  return std::numeric_limits<T>::epsilon();
}

// Rounds reference inputs to T and stores them (what the kernel receives).
template <class T, class V>
std::vector<double> load(const V& dst, const std::vector<double>& src) {
  std::vector<double> r(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    dst.data()[i] = static_cast<T>(src[i]);
    r[i] = static_cast<double>(dst.data()[i]);
  }
  return r;
}
template <class V>
void fill_nan(const V& v) {
  for (std::size_t i = 0; i < v.size(); ++i) v.data()[i] = std::numeric_limits<typename V::value_type>::quiet_NaN();
}
template <class V>
std::vector<double> host(const V& v) {
  return std::vector<double>(v.data(), v.data() + v.size());
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i] << ", tol " << tol[i]);
    REQUIRE(std::isfinite(got[i]));
    REQUIRE(std::abs(got[i] - want[i]) <= tol[i]);
  }
}
}  // namespace

TEMPLATE_TEST_CASE("linear forward matches the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto [N, in, out, bias] = GENERATE(table<index_t, index_t, index_t, bool>(
      {{1, 1, 1, true}, {7, 5, 3, false}, {13, 11, 17, true}, {0, 3, 2, true}, {64, 37, 29, true}}));
  CAPTURE(N, in, out, bias);
  test::OpAdapter<kernels::LinearOp<T>> op(N, in, out, bias);
  Buf<T> x(N, in), y(N, out);
  Flat<T> p(op.P);
  const auto xr = load<T>(x.v, ref::random_vec(N * in, 1));
  const auto pr = load<T>(p.v, ref::random_vec(op.P, 2));
  fill_nan(y.v);
  op.fwd_primal(y, x, p);
  const std::vector<double> w(pr.begin(), pr.begin() + out * in), b(pr.begin() + out * in, pr.end());
  const auto want = ref::linear(xr, w, bias ? &b : nullptr, N, in, out);
  std::vector<double> tol(want.size());
  for (index_t n = 0; n < N; ++n)
    for (index_t o = 0; o < out; ++o) {
      double mag = bias ? std::abs(b[o]) : 0.0;  // sum |x_i w_i| + |b|
      for (index_t i = 0; i < in; ++i) mag += std::abs(xr[n * in + i] * w[o * in + i]);
      tol[n * out + o] = double(in + 2) * eps<T>() * mag;
    }
  check_close(host(y.v), want, tol);
}

TEMPLATE_TEST_CASE("layernorm forward matches the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto [N, C, bias] = GENERATE(
      table<index_t, index_t, bool>({{1, 1, true}, {1, 2, false}, {7, 5, true}, {13, 12, false}, {3, 320, true}}));
  CAPTURE(N, C, bias);
  test::OpAdapter<kernels::LayerNormOp<T>> op(N, C, bias);
  Buf<T> x(N, C), y(N, C);
  Flat<T> p(op.P);
  const auto xr = load<T>(x.v, ref::random_vec(N * C, 4, 2.0, 0.5));
  auto praw = ref::random_vec(C, 5, 0.3, 1.0);
  if (bias) {
    const auto braw = ref::random_vec(C, 6);
    praw.insert(praw.end(), braw.begin(), braw.end());
  }
  const auto pr = load<T>(p.v, praw);
  fill_nan(y.v);
  fill_nan(op.saved[0].v);
  fill_nan(op.saved[1].v);
  op.fwd_primal(y, x, p);
  const std::vector<double> w(pr.begin(), pr.begin() + C), b(pr.begin() + C, pr.end());
  const auto want = ref::layernorm(xr, w, bias ? &b : nullptr, N, C, 1e-5);
  // Mean and variance are length-C sums; the normalised value inherits
  // ~(C+8) eps relative error of |x - mu| rstd |w|, plus |b| rounding.
  std::vector<double> tol(want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    tol[i] = double(C + 8) * eps<T>() * (std::abs(want[i]) + (bias ? std::abs(b[i % C]) : 0.0) + 1.0);
  check_close(host(y.v), want, tol);
  for (double r : host(op.saved[1].v)) REQUIRE(std::isfinite(r));
  for (double m : host(op.saved[0].v)) REQUIRE(std::isfinite(m));
}

TEMPLATE_TEST_CASE("rmsnorm forward matches a plain float64 forward", "[kernels]", float, double) {
  using T = TestType;
  const auto [N, C, bias] = GENERATE(
      table<index_t, index_t, bool>({{1, 1, false}, {1, 2, true}, {7, 5, false}, {13, 12, true}, {3, 320, false}}));
  CAPTURE(N, C, bias);
  test::OpAdapter<kernels::RmsNormOp<T>> op(N, C, bias);
  Buf<T> x(N, C), y(N, C);
  Flat<T> p(op.P);
  const auto xr = load<T>(x.v, ref::random_vec(N * C, 7, 2.0, 0.5));
  auto praw = ref::random_vec(C, 8, 0.3, 1.0);
  if (bias) {
    const auto braw = ref::random_vec(C, 9);
    praw.insert(praw.end(), braw.begin(), braw.end());
  }
  const auto pr = load<T>(p.v, praw);
  fill_nan(y.v);
  fill_nan(op.saved[0].v);
  op.fwd_primal(y, x, p);
  // y = x / sqrt(mean(x^2) + 1e-6) w + b, written here in double.
  std::vector<double> want(std::size_t(N * C));
  for (index_t n = 0; n < N; ++n) {
    double s = 0;
    for (index_t c = 0; c < C; ++c) s += xr[std::size_t(n * C + c)] * xr[std::size_t(n * C + c)];
    const double r = 1.0 / std::sqrt(s / double(C) + 1e-6);
    for (index_t c = 0; c < C; ++c)
      want[std::size_t(n * C + c)] =
          xr[std::size_t(n * C + c)] * r * pr[std::size_t(c)] + (bias ? pr[std::size_t(C + c)] : 0.0);
  }
  // The mean square is a length-C sum of positive terms (C eps relative),
  // halved by the square root; the product with x and w adds a few eps.
  std::vector<double> tol(want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    tol[i] = double(C + 8) * eps<T>() *
             (std::abs(want[i]) + (bias ? std::abs(pr[std::size_t(C) + i % std::size_t(C)]) : 0.0) + 1.0);
  check_close(host(y.v), want, tol);
  for (double r : host(op.saved[0].v)) REQUIRE(std::isfinite(r));
}

TEMPLATE_TEST_CASE("rotary forward matches a plain float64 rotate-half", "[kernels]", float, double) {
  using T = TestType;
  // Rows of blocks of Tc positions, H heads of D dims, the first r rotated.
  const auto [Tc, H, D, r] = GENERATE(table<index_t, index_t, index_t, index_t>(
      {{1, 1, 2, 2}, {7, 2, 8, 8}, {5, 3, 8, 2}, {4, 2, 6, 0}, {64, 5, 64, 64}}));
  CAPTURE(Tc, H, D, r);
  const index_t N = 2 * Tc, W = H * D;
  const double base = 10000.0;
  test::OpAdapter<kernels::RotaryOp<T>> op(N, Tc, H, D, r, base);
  Buf<T> x(N, W), y(N, W);
  Flat<T> p(1);
  const auto xr = load<T>(x.v, ref::random_vec(N * W, 10, 1.0));
  fill_nan(y.v);
  op.fwd_primal(y, x, p);
  // inv_j = base^(-2j/r); [c, c] and [s, s] over the r dims; rotate_half.
  std::vector<double> want(xr);
  for (index_t n = 0; n < N; ++n)
    for (index_t h = 0; h < H; ++h)
      for (index_t j = 0; j < r / 2; ++j) {
        const double a = double(n % Tc) * std::pow(base, -2.0 * double(j) / double(r));
        const std::size_t i1 = std::size_t(n * W + h * D + j), i2 = i1 + std::size_t(r / 2);
        want[i1] = xr[i1] * std::cos(a) - xr[i2] * std::sin(a);
        want[i2] = xr[i2] * std::cos(a) + xr[i1] * std::sin(a);
      }
  // The angle t inv_j (t < 64) is formed in T: relative eps from the
  // exponential and the product, so an absolute error of about 4 t eps in a,
  // hence in cos and sin; times |x| <= 1, plus the rotation's own rounding.
  std::vector<double> tol(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) tol[i] = (8.0 * double(Tc) + 8.0) * eps<T>();
  check_close(host(y.v), want, tol);
}

TEMPLATE_TEST_CASE("swiglu forward matches a plain float64 silu(a) b", "[kernels]", float, double) {
  using T = TestType;
  const auto [N, F] = GENERATE(table<index_t, index_t>({{1, 1}, {7, 13}, {3, 64}}));
  CAPTURE(N, F);
  test::OpAdapter<kernels::SwigluOp<T>> op(N, F);
  Buf<T> x(N, 2 * F), y(N, F);
  Flat<T> p(1);
  const auto xr = load<T>(x.v, ref::random_vec(N * 2 * F, 11, 4.0));
  fill_nan(y.v);
  op.fwd_primal(y, x, p);
  std::vector<double> want(std::size_t(N * F)), tol(want.size());
  for (index_t n = 0; n < N; ++n)
    for (index_t f = 0; f < F; ++f) {
      const double a = xr[std::size_t(n * 2 * F + f)], b = xr[std::size_t(n * 2 * F + F + f)];
      const std::size_t i = std::size_t(n * F + f);
      want[i] = a / (1.0 + std::exp(-a)) * b;
      // exp, the division and two products: a few eps relative, and
      // silu(a) b itself as the scale (|a|, |b| <= 4).
      tol[i] = 8.0 * eps<T>() * (std::abs(want[i]) + 1.0);
    }
  check_close(host(y.v), want, tol);
}

TEMPLATE_TEST_CASE("gelu forward matches the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto kind = GENERATE(Gelu::erf, Gelu::tanh);
  const auto [N, C] = GENERATE(table<index_t, index_t>({{1, 1}, {7, 13}, {0, 4}}));
  test::OpAdapter<kernels::GeluOp<T>> op(N, C, kind);
  Buf<T> x(N, C), y(N, C);
  const auto xr = load<T>(x.v, ref::random_vec(N * C, 7, 3.0));
  fill_nan(y.v);
  op.fwd_primal(y, x, Flat<T>());
  std::vector<double> want(xr.size()), tol(xr.size());
  for (std::size_t i = 0; i < xr.size(); ++i) {
    want[i] = ref::gelu(xr[i], kind);
    tol[i] = 8 * eps<T>() * (std::abs(xr[i]) + 1.0);  // a handful of ops on |x|-sized values
  }
  check_close(host(y.v), want, tol);
}

TEMPLATE_TEST_CASE("gelu's fused pair of the plain reverse equals forward then reverse", "[kernels]", float, double) {
  // gelu_forward_slope + gelu_reverse_slope (the gradient's reverse) against
  // gelu_forward + gelu_reverse, with dx on the slope's own plane as the
  // model runs it. y is the same expression: the same bits. The slope
  // f' = Phi + x phi is the same arithmetic, but the compiler may contract
  // it into FMAs differently in the two loops (2 ulp seen): a few eps of
  // |dy| (|Phi| + |x phi|) <= |dy| (1 + |x|).
  using T = TestType;
  const auto kind = GENERATE(Gelu::erf, Gelu::tanh);
  const index_t N = 9, C = 61;
  Buf<T> x(N, C), dy(N, C), y1(N, C), dx1(N, C), y2(N, C), dx2(N, C);
  const auto xr = load<T>(x.v, ref::random_vec(N * C, 17, 4.0));
  const auto dyr = load<T>(dy.v, ref::random_vec(N * C, 18));
  const ExecSpace space;
  kernels::gelu_forward<T>(space, y1.template act<T>(), x.template act<T>(), kind);
  kernels::gelu_reverse<T>(space, dx1.template act<T>(), dy.template act<T>(), x.template act<T>(), kind);
  const Span2<T> xs(x.v.data(), N, C), ys(y2.v.data(), N, C), dxs(dx2.v.data(), N, C), dys(dy.v.data(), N, C);
  fill_nan(y2.v);
  fill_nan(dx2.v);
  kernels::gelu_forward_slope<T>(space, ys, dxs, xs, kind);
  kernels::gelu_reverse_slope<T>(space, dxs, dys, dxs);
  const auto a = host(y1.v), b = host(y2.v);
  for (index_t i = 0; i < N * C; ++i) REQUIRE(a[i] == b[i]);
  std::vector<double> tol(N * C);
  for (index_t i = 0; i < N * C; ++i) tol[i] = 4 * eps<T>() * std::abs(dyr[i]) * (1.0 + std::abs(xr[i]));
  check_close(host(dx2.v), host(dx1.v), tol);
}

TEMPLATE_TEST_CASE("embedding and residual forward match the reference", "[kernels]", float, double) {
  using T = TestType;
  const index_t B = 2, Tc = 5, C = 3, V = 11;
  test::OpAdapter<kernels::EmbeddingOp<T>> op(B, Tc, V, C);
  Buf<T> y(B * Tc, C);
  Flat<T> p(op.P);
  const auto pr = load<T>(p.v, ref::random_vec(op.P, 8));
  fill_nan(y.v);
  op.fwd_primal(y, Buf<T>(B * Tc, 1), p);
  std::vector<double> want(B * Tc * C), tol(B * Tc * C);
  for (index_t n = 0; n < B * Tc; ++n)
    for (index_t c = 0; c < C; ++c) {
      const double a = pr[op.kernel.tokens.data()[n] * C + c], q = pr[V * C + (n % Tc) * C + c];
      want[n * C + c] = a + q;
      tol[n * C + c] = eps<T>() * (std::abs(a) + std::abs(q));  // one rounded addition
    }
  check_close(host(y.v), want, tol);

  Buf<T> a(13, 3), b(13, 3), s(13, 3);
  const auto ar = load<T>(a.v, ref::random_vec(39, 10)), br = load<T>(b.v, ref::random_vec(39, 11));
  fill_nan(s.v);
  kernels::residual_forward<T>(ExecSpace(), s.template act<T>(), a.template act<T>(), b.template act<T>());
  want.assign(39, 0.0);
  tol.assign(39, 0.0);
  for (std::size_t i = 0; i < 39; ++i) {
    want[i] = ar[i] + br[i];
    tol[i] = eps<T>() * (std::abs(ar[i]) + std::abs(br[i]));
  }
  check_close(host(s.v), want, tol);
}

TEMPLATE_TEST_CASE("attention forward matches the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto [B, Tc, H, hs] = GENERATE(table<index_t, index_t, index_t, index_t>(
      {{1, 1, 1, 1}, {2, 5, 3, 4}, {1, 13, 3, 2}, {2, 7, 1, 5}, {1, 31, 5, 8}}));
  CAPTURE(B, Tc, H, hs);
  const index_t C = H * hs, N = B * Tc;
  test::OpAdapter<kernels::AttentionOp<T>> op(B, Tc, int(H), hs);
  Buf<T> x(N, 3 * C), y(N, C);
  const auto qkv = load<T>(x.v, ref::random_vec(N * 3 * C, 12, 1.5));
  fill_nan(y.v);
  fill_nan(op.saved[0].v);
  op.fwd_primal(y, x, Flat<T>());
  const auto want = ref::attention(qkv, B, Tc, C, H);
  // Scores are length-hs dot products, the softmax a length-T sum of exps and
  // the output a length-T convex combination of v: (hs + T + 8) eps times the
  // largest |q||k|-scaled score and the largest |v|.
  double vmax = 0, smax = 0;
  for (index_t n = 0; n < N; ++n)
    for (index_t c = 0; c < C; ++c) {
      vmax = std::max(vmax, std::abs(qkv[n * 3 * C + 2 * C + c]));
      smax = std::max(smax, std::abs(qkv[n * 3 * C + c]) * std::abs(qkv[n * 3 * C + C + c]));
    }
  std::vector<double> tol(want.size(), double(hs + Tc + 8) * eps<T>() * vmax * (1.0 + hs * smax));
  check_close(host(y.v), want, tol);
  for (double l : host(op.saved[0].v)) REQUIRE(std::isfinite(l));
}

TEMPLATE_TEST_CASE("fused lm head and cross-entropy match the reference", "[kernels]", float, double) {
  using T = TestType;
  // Tiles of (chunk rows, vchunk vocabulary entries; 0: all), in one piece,
  // by rows, by vocabulary (the online log-sum-exp) and by both.
  const auto [N, C, V, chunk, vchunk] =
      GENERATE(table<index_t, index_t, index_t, index_t, index_t>({{1, 1, 2, 1, 0},
                                                                   {7, 5, 11, 3, 0},
                                                                   {13, 12, 37, 13, 0},
                                                                   {10, 4, 5, 4, 0},
                                                                   {7, 5, 11, 7, 4},
                                                                   {13, 12, 37, 5, 10},
                                                                   {6, 3, 9, 6, 1}}));
  CAPTURE(N, C, V, chunk, vchunk);
  test::OpAdapter<kernels::LmHeadXentOp<T>> op(N, C, V, chunk, vchunk);
  Buf<T> h(N, C), loss(N, 1);
  Flat<T> p(op.P);
  const auto hr = load<T>(h.v, ref::random_vec(N * C, 13));
  const auto w = load<T>(p.v, ref::random_vec(V * C, 14));
  fill_nan(loss.v);
  fill_nan(op.saved[1].v);
  op.fwd_primal(loss, h, p);
  std::vector<std::int32_t> targets(op.kernel.targets.data(), op.kernel.targets.data() + N);
  const auto want = ref::xent_rows(hr, w, targets, N, C, V);
  // Logits are length-C dot products; the log-sum-exp adds a length-V sum.
  std::vector<double> tol(N);
  for (index_t n = 0; n < N; ++n) {
    double mag = 0;
    for (index_t v = 0; v < V; ++v)
      for (index_t c = 0; c < C; ++c) mag = std::max(mag, std::abs(hr[n * C + c] * w[v * C + c]) * C);
    tol[n] = double(C + V + 8) * eps<T>() * (mag + 1.0);
  }
  check_close(host(loss.v), want, tol);
}

namespace head_test {
using T = float;
constexpr index_t N = 10, C = 6, V = 13, R = 5;
// One run of the gradient's head (dh, g, loss, lse, and the logits tile z).
struct Out {
  View1<double> loss;
  View1<T> lse, dh, g, z;
  View2<T> stats;
};
struct Case {
  index_t rows;
  bool keep, per_sequence;
};
Act2<T> act(const View1<T>& v, index_t rows, index_t cols) {
  Act2<T> a;
  a.v = Span2<T>(v.data(), rows, cols);
  return a;
}
// The forward and the reverse apart, and lm_head_xent_gradient, under one
// policy: the two runs, each row's loss, lse, dh and the gradient compared
// by memcmp, the gradient nonzero in every sequence.
std::pair<Out, Out> apart_and_together(const Case& c, kernels::RowShape shape, const kernels::GemmPolicy<T>& pol,
                                       std::uint64_t seed) {
  kernels::LmHeadXentOp<T> op(N, C, V, c.rows, V, shape);
  Buf<T> h(N, C);
  Flat<T> w(V * C);
  load<T>(h.v, ref::random_vec(N * C, seed));
  load<T>(w.v, ref::random_vec(V * C, seed + 1));
  kernels::GemmPolicy<T> p = pol;
  View1<T> rounded_w("w bf16", V * C);
  if (p.bf16) {  // the owner's weights rounded ahead (GemmPolicy::ahead)
    for (index_t i = 0; i < V * C; ++i) rounded_w(i) = round_bf16(w.v(i));
    p.ahead[0] = {w.v.data(), V * C, 1, 0, rounded_w.data()};
  }
  const index_t G = c.per_sequence ? N / R : 1;
  auto make = [&] {
    return Out{View1<double>("loss", N), View1<T>("lse", N),        View1<T>("dh", N * C),
               View1<T>("g", G * V * C), View1<T>("z", c.rows * V), View2<T>("stats", N, 2)};
  };
  auto grads = [&](const Out& o) {
    Grads<T> g{Span1<T>(o.g.data(), o.g.extent(0)), {}};
    if (c.per_sequence) g.seq_rows = R, g.seq_stride = V * C;
    return g;
  };
  auto lse1 = [](const View1<T>& v) { return Act1<T>{Span1<T>(v.data(), v.extent(0)), {}, {}}; };
  const Span1<const std::int32_t> targets(op.targets.data(), N);
  Out apart = make(), together = make();
  kernels::lm_head_xent_forward<T>(ExecSpace(), Act1<double>{apart.loss, {}, {}}, lse1(apart.lse), h.act<T>(),
                                   w.params<T>(), 0, V, targets, act(apart.z, c.rows, V), apart.stats, Act2<T>(), p,
                                   shape, c.keep);
  kernels::lm_head_xent_reverse<T>(ExecSpace(), act(apart.dh, N, C), grads(apart), lse1(apart.lse), h.act<T>(),
                                   w.params<T>(), 0, V, targets, act(apart.z, c.rows, V), p, true,
                                   c.keep ? Span2<const T>(apart.stats) : Span2<const T>(), shape);
  kernels::lm_head_xent_gradient<T>(ExecSpace(), Act1<double>{together.loss, {}, {}}, lse1(together.lse),
                                    act(together.dh, N, C), grads(together), h.act<T>(), w.params<T>(), 0, V, targets,
                                    act(together.z, c.rows, V), together.stats, p, shape, c.keep);
  for (index_t n = 0; n < N; ++n) {
    REQUIRE(std::isfinite(together.loss(n)));
    REQUIRE(together.loss(n) == apart.loss(n));
    REQUIRE(std::memcmp(&together.lse(n), &apart.lse(n), sizeof(T)) == 0);
  }
  REQUIRE(std::memcmp(together.dh.data(), apart.dh.data(), sizeof(T) * together.dh.extent(0)) == 0);
  REQUIRE(std::memcmp(together.g.data(), apart.g.data(), sizeof(T) * together.g.extent(0)) == 0);
  // Every sequence's gradient reached.
  for (index_t s = 0; s < G; ++s) {
    double part = 0;
    for (index_t i = 0; i < V * C; ++i) part += std::fabs(double(together.g(s * V * C + i)));
    REQUIRE(part > 0);
  }
  return {apart, together};
}
}  // namespace head_test

TEST_CASE("lm head: the gradient's head, forward and reverse tile by tile, is the two apart bit for bit", "[kernels]") {
  // lm_head_xent_gradient forms each tile's logits once where the forward
  // and the reverse apart form them twice: the same kernels on the same
  // logits, so every loss, lse, dh and gradient entry must be the same float
  // (memcmp). Tiles of whole vocabulary rows: several (3 rows of 10, and a
  // tail of 1), and one tile of the batch with the exponentials kept; a
  // summed gradient, and one per sequence of 5 rows (tiles of 3 straddling
  // the sequences); each row shape.
  using namespace head_test;
  for (const Case c : {Case{3, false, false}, Case{3, false, true}, Case{10, true, false}, Case{10, true, true}})
    for (const kernels::RowShape shape : {kernels::RowShape::host, kernels::RowShape::teams, kernels::RowShape::wide}) {
      CAPTURE(c.rows, c.keep, c.per_sequence, int(shape));
      apart_and_together(c, shape, kernels::GemmPolicy<T>(), 21);
    }
  // A tile that splits the vocabulary is refused in one line.
  kernels::LmHeadXentOp<T> op(N, C, V, 3, V);
  Buf<T> h(N, C);
  Flat<T> w(V * C);
  View1<double> loss("loss", N);
  View1<T> lse("lse", N), dh("dh", N * C), g("g", V * C), z("z", 3 * 4);
  View2<T> stats("stats", N, 2);
  REQUIRE_THROWS_WITH(kernels::lm_head_xent_gradient<T>(
                          ExecSpace(), Act1<double>{loss, {}, {}}, Act1<T>{lse, {}, {}}, act(dh, N, C), Grads<T>{g, {}},
                          h.act<T>(), w.params<T>(), 0, V, Span1<const std::int32_t>(op.targets.data(), N),
                          act(z, 3, 4), stats, kernels::GemmPolicy<T>(), kernels::RowShape::host, false),
                      Catch::Contains("holds no whole vocabulary row"));
}

TEST_CASE(
    "lm head: the gradient's head under bf16-amp rounds h and dz once, with the bits of the products that round their "
    "own",
    "[kernels][bf16]") {
  // With the head's weights rounded ahead by their owner, the gradient's head
  // rounds each tile of h once (for the logits and dW) and writes dz rounded
  // as the softmax forms it, a chunk of rows at a time; the forward and the
  // reverse apart (lm_head_xent_reverse) write dz in FP32 and each product
  // rounds its own operands. The same bfloat16 values in the same chunks of
  // rows: every loss, lse, dh and summed gradient entry the same float
  // (memcmp), over several tiles with several chunks each (a single product
  // of 2 V elements a chunk: tiles of 3 rows in chunks of 2 and 1), with the
  // exponentials kept, and per sequence where a tile is one chunk (each
  // sequence's piece one product either way). The logits tile is left holding
  // the logits, not dz: the rounded path ran.
  using namespace head_test;
  struct Rounded {
    Case c;
    index_t single;
  };
  for (const Rounded r : {Rounded{{3, false, false}, 2 * V}, Rounded{{3, false, true}, 1 << 12},
                          Rounded{{10, true, false}, 2 * V}, Rounded{{10, true, true}, 1 << 12}})
    for (const kernels::RowShape shape : {kernels::RowShape::host, kernels::RowShape::wide}) {
      CAPTURE(r.c.rows, r.single, r.c.keep, r.c.per_sequence, int(shape));
      kernels::GemmPolicy<T> pol;
      pol.bf16 = true;
      pol.chunk_elements = 1 << 12;
      pol.single_chunk_elements = r.single;
      pol.scratch_a = View1<T>("a", 1 << 12);
      pol.scratch_b = View1<T>("b", 1 << 12);
      const auto [apart, together] = apart_and_together(r.c, shape, pol, 31);
      // The last tile's logits (or exponentials) stay; apart, dz overwrote them.
      REQUIRE(std::memcmp(together.z.data(), apart.z.data(), sizeof(T) * together.z.extent(0)) != 0);
    }
}

namespace narrow_test {  // named: nvcc wants extended lambdas in functions with external linkage
// Rows of FP32 values narrowed in place to bfloat16 by teams of as many
// threads as the backend gives one (OpenMP in CI: 2), the new value of each
// entry from its own old value and another buffer's; the result against the
// same values computed from a copy.
std::vector<std::uint16_t> narrowed(gnh::index_t rows, gnh::index_t Tc, gnh::index_t w, int team_size,
                                    std::vector<float>& want) {
  View1<float> x("x", std::size_t(rows * Tc)), y("y", std::size_t(rows * Tc));
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (std::size_t i = 0; i < x.extent(0); ++i) x(i) = u(g), y(i) = u(g);
  want.assign(std::size_t(rows * w), 0.0f);
  for (gnh::index_t r = 0; r < rows; ++r)
    for (gnh::index_t s = 0; s < w; ++s)
      want[std::size_t(r * w + s)] = round_bf16(3.0f * x(r * Tc + s) - y(r * Tc + s));
  using Team = Kokkos::TeamPolicy<ExecSpace, Kokkos::IndexType<gnh::index_t>>;
  Kokkos::parallel_for(
      "narrow_test", Team(ExecSpace(), rows, team_size), KOKKOS_LAMBDA(const Team::member_type& team) {
        float* row = x.data() + team.league_rank() * Tc;
        const float* other = y.data() + team.league_rank() * Tc;
        kernels::narrow_in_place(team, w, row, [&](gnh::index_t s) { return 3.0f * row[s] - other[s]; });
      });
  ExecSpace().fence();
  std::vector<std::uint16_t> got(std::size_t(rows * w));
  for (gnh::index_t r = 0; r < rows; ++r)
    std::memcpy(got.data() + r * w, x.data() + r * Tc, sizeof(std::uint16_t) * std::size_t(w));
  return got;
}
}  // namespace narrow_test

TEST_CASE("bfloat16 narrowed in place over FP32 rows by a team", "[kernels][bf16]") {
  // The batched attention's probabilities are written over their own scores
  // (kernels/narrow.hpp): entry s's 16 bits land on the bytes of entry s/2,
  // which the team must have read first: a round written before its reads
  // finished, or a write past entry s/2, changes a value. Rows of 1, 7 and
  // 4097 entries (a partial round); teams of one thread and of the most the
  // backend allows up to 4.
  const int most = std::min<int>(4, ExecSpace().concurrency());
  for (const int team : {1, most})
    for (const gnh::index_t w : {gnh::index_t(1), gnh::index_t(7), gnh::index_t(4097)}) {
      CAPTURE(team, w);
      std::vector<float> want;
      const gnh::index_t rows = 48, Tc = 4100;
      const auto got = narrow_test::narrowed(rows, Tc, w, team, want);
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("entry " << i);
        REQUIRE(bf16_value(got[i]) == want[i]);
      }
    }
}

namespace cut_test {
// A cut's accumulator, each entry starting at its index (the kernels add).
View2<double> start(gnh::index_t K, gnh::index_t N) {
  View2<double> acc("acc", K, N);
  for (gnh::index_t k = 0; k < K; ++k)
    for (gnh::index_t n = 0; n < N; ++n) acc(k, n) = double(k * N + n);
  return acc;
}
// acc(k, n) against its start plus sum_c adj(n, c) ydd(k, n, c) in double:
// C float products added in float, within (C + 2) eps of the sum of their
// magnitudes.
void check(const View2<double>& acc, const View1<float>& adj, const View1<float>& ydd, gnh::index_t K, gnh::index_t N,
           gnh::index_t C) {
  for (gnh::index_t k = 0; k < K; ++k)
    for (gnh::index_t n = 0; n < N; ++n) {
      double want = 0, mag = 0;
      for (gnh::index_t c = 0; c < C; ++c) {
        const double t = double(adj(n * C + c)) * double(ydd((k * N + n) * C + c));
        want += t;
        mag += std::fabs(t);
      }
      CAPTURE(k, n);
      REQUIRE(std::fabs(acc(k, n) - double(k * N + n) - want) <=
              double(C + 2) * std::numeric_limits<float>::epsilon() * (mag + 1e-30));
    }
}
// An input x (C columns) with K tangent and second-order planes and an
// adjoint, random in (-amp, amp); a reference output (Cy columns) with every
// plane, and a cut output without second-order planes.
struct Planes {
  gnh::index_t K, N, C, Cy;
  View1<float> xv, xd, xdd, av, rv, rd, rdd, cv, cd;
  Act2<float> x, ref, cut, adj;
  Planes(gnh::index_t K_, gnh::index_t N_, gnh::index_t C_, std::mt19937& g, float amp, gnh::index_t Cy_ = 0)
      : K(K_),
        N(N_),
        C(C_),
        Cy(Cy_ > 0 ? Cy_ : C_),
        xv("xv", N * C),
        xd("xd", K * N * C),
        xdd("xdd", K * N * C),
        av("av", N * Cy),
        rv("rv", N * Cy),
        rd("rd", K * N * Cy),
        rdd("rdd", K * N * Cy),
        cv("cv", N * Cy),
        cd("cd", K * N * Cy) {
    std::uniform_real_distribution<float> u(-amp, amp);
    for (View1<float> v : {xv, xd, xdd, av})
      for (std::size_t i = 0; i < v.extent(0); ++i) v(i) = u(g);
    x.v = Span2<float>(xv.data(), N, C);
    x.d = Span3<float>(xd.data(), K, N, C);
    x.dd = Span3<float>(xdd.data(), K, N, C);
    ref.v = Span2<float>(rv.data(), N, Cy);
    ref.d = Span3<float>(rd.data(), K, N, Cy);
    ref.dd = Span3<float>(rdd.data(), K, N, Cy);
    cut.v = Span2<float>(cv.data(), N, Cy);
    cut.d = Span3<float>(cd.data(), K, N, Cy);
    adj.v = Span2<float>(av.data(), N, Cy);
  }
  // y and y' of the two outputs the same values: the same expressions in
  // two kernels, so the same bits but where a compiler fuses a multiply-add
  // in one and not the other (an ulp or two).
  void same_values() const {
    const auto close = [](const View1<float>& a, const View1<float>& b) {
      for (std::size_t i = 0; i < a.extent(0); ++i) {
        INFO("value " << i << ": " << a(i) << " against " << b(i));
        REQUIRE(std::fabs(a(i) - b(i)) <= 4 * std::numeric_limits<float>::epsilon() * (std::fabs(b(i)) + 1));
      }
    };
    close(cv, rv);
    close(cd, rd);
  }
  // y and y' of the two outputs bit for bit: the model's tangents take the
  // same arithmetic with and without cuts (its G.v bit for bit), so the
  // cut's kernel forms them as the op's forward does, compiled for the same
  // x86-64 level (kernels/cloned.hpp).
  void same_bits() const {
    REQUIRE(std::memcmp(cv.data(), rv.data(), sizeof(float) * cv.extent(0)) == 0);
    REQUIRE(std::memcmp(cd.data(), rd.data(), sizeof(float) * cd.extent(0)) == 0);
  }
  // Written as the next product's rounded input (out: y's plane, then the
  // K planes of y'): the bfloat16 rounding of the y and y' written without
  // out, bit for bit, and the same contraction.
  void same_rounded(const View1<float>& out, const View2<double>& acc, const View2<double>& acc_out) const {
    for (gnh::index_t i = 0; i < N * Cy; ++i) REQUIRE(bits_of(out(i)) == bits_of(round_bf16(cv(i))));
    for (gnh::index_t i = 0; i < K * N * Cy; ++i) REQUIRE(bits_of(out(N * Cy + i)) == bits_of(round_bf16(cd(i))));
    REQUIRE(std::memcmp(acc.data(), acc_out.data(), sizeof(double) * acc.size()) == 0);
  }
  static std::uint32_t bits_of(float x) {
    std::uint32_t b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
  }
};
}  // namespace cut_test

TEST_CASE("GELU and SwiGLU with an adjoint cut: y and y' of the second-order forward, y'' contracted and not stored",
          "[kernels]") {
  // gelu_forward_cut against gelu_forward<Jet2>: the same y and y' (the
  // same expressions, bit for bit), y (the output) without second-order
  // planes, and acc(k, n) += sum_c adj(n, c) y''(k, n, c) for the stored
  // y''. The sum is C float products added in float: within (C + 2) eps of
  // the sum of their magnitudes. A wrong row, direction or column of adj
  // or x'' is O(1) off.
  // Two sizes: a row within one chunk of columns and a group of directions
  // of the host's kernel (kernels/cut.hpp, ElementwiseCutHostRow), and rows
  // of 600 columns (three chunks, the last partial) in 18 directions (two
  // groups, the last partial).
  using T = float;
  for (const auto& [N, C, K, F] : {std::array<gnh::index_t, 4>{9, 37, 3, 19}, {3, 600, 18, 300}}) {
    for (const Gelu kind : {Gelu::erf, Gelu::tanh}) {
      CAPTURE(N, C, K, int(kind));
      std::mt19937 g(23);
      const cut_test::Planes t(K, N, C, g, 2.0f);
      View2<double> acc = cut_test::start(K, N);
      kernels::gelu_forward<Jet2<T>>(ExecSpace(), t.ref, t.x, kind);
      kernels::gelu_forward_cut<T>(ExecSpace(), t.cut, t.x, kind, t.adj, acc);
      View1<T> out("out", (1 + K) * N * C);
      View2<double> acc_out = cut_test::start(K, N);
      kernels::gelu_forward_cut<T>(ExecSpace(), t.cut, t.x, kind, t.adj, acc_out, out.data());
      ExecSpace().fence();
      t.same_bits();
      cut_test::check(acc, t.av, t.rdd, K, N, C);
      t.same_rounded(out, acc, acc_out);
    }
    // SwiGLU's gate (x = [a | b], 2F columns) likewise.
    CAPTURE(N, K, F);
    std::mt19937 g(31);
    const cut_test::Planes t(K, N, 2 * F, g, 2.0f, F);
    View2<double> acc = cut_test::start(K, N);
    kernels::swiglu_forward<Jet2<T>>(ExecSpace(), t.ref, t.x);
    kernels::swiglu_forward_cut<T>(ExecSpace(), t.cut, t.x, t.adj, acc);
    View1<T> out("out", (1 + K) * N * F);
    View2<double> acc_out = cut_test::start(K, N);
    kernels::swiglu_forward_cut<T>(ExecSpace(), t.cut, t.x, t.adj, acc_out, out.data());
    ExecSpace().fence();
    t.same_bits();
    cut_test::check(acc, t.av, t.rdd, K, N, F);
    t.same_rounded(out, acc, acc_out);
  }
  // The cut's adjoint must match x's rows and columns.
  Act2<T> y, x, adj;
  View1<T> v1("v1", 4 * 5), v2("v2", 4 * 5), v3("v3", 2 * 4 * 5), v4("v4", 2 * 4 * 5), v5("v5", 3 * 5);
  x.v = Span2<T>(v1.data(), 4, 5);
  x.d = Span3<T>(v3.data(), 2, 4, 5);
  x.dd = Span3<T>(v4.data(), 2, 4, 5);
  y.v = Span2<T>(v2.data(), 4, 5);
  y.d = Span3<T>(v3.data(), 2, 4, 5);
  adj.v = Span2<T>(v5.data(), 3, 5);
  REQUIRE_THROWS_WITH(kernels::gelu_forward_cut<T>(ExecSpace(), y, x, Gelu::tanh, adj, View2<double>("a", 2, 4)),
                      Catch::Contains("adjoint rows"));
}

TEST_CASE("LayerNorm and RMSNorm with an adjoint cut: y'' contracted as formed, not stored", "[kernels]") {
  // layernorm_forward_cut and rmsnorm_forward_cut against the second-order
  // forward: the row statistics bit for bit and y, y' to an ulp or two
  // (the same row kernels), y without second-order planes, and acc(k, n) += sum_c adj(n,
  // c) y''(k, n, c) for the stored y'': C float products added in float,
  // within (C + 2) eps of the sum of their magnitudes. A wrong row,
  // direction or column of the adjoint is O(1) off.
  using T = float;
  const gnh::index_t N = 7, C = 29, K = 3;
  for (const bool centred : {true, false}) {
    CAPTURE(centred);
    std::mt19937 g(29);
    const cut_test::Planes t(K, N, C, g, 1.5f);
    std::uniform_real_distribution<T> u(-1.5f, 1.5f);
    View1<T> pv("pv", 2 * C), pd("pd", K * 2 * C);
    for (View1<T> v : {pv, pd})
      for (std::size_t i = 0; i < v.extent(0); ++i) v(i) = u(g);
    View1<T> ms_r("ms_r", 2 * (1 + 2 * K) * N), ms_c("ms_c", 2 * (1 + 2 * K) * N);
    auto stats = [&](const View1<T>& b, int which) {  // mean (0) or rstd (1) with their planes
      Act1<T> a;
      T* base = b.data() + which * (1 + 2 * K) * N;
      a.v = Span1<T>(base, N);
      a.d = Span2<T>(base + N, K, N);
      a.dd = Span2<T>(base + (1 + K) * N, K, N);
      return a;
    };
    const Params<T> p{Span1<const T>(pv.data(), 2 * C), Span2<const T>(pd.data(), K, 2 * C)};
    View2<double> acc = cut_test::start(K, N), acc_out = cut_test::start(K, N);
    View1<T> out("out", (1 + K) * N * C), ms_o("ms_o", 2 * (1 + 2 * K) * N);
    if (centred) {
      kernels::layernorm_forward<Jet2<T>>(ExecSpace(), t.ref, stats(ms_r, 0), stats(ms_r, 1), t.x, p, 0, C, 1e-5);
      kernels::layernorm_forward_cut<T>(ExecSpace(), t.cut, stats(ms_c, 0), stats(ms_c, 1), t.x, p, 0, C, 1e-5, t.adj,
                                        acc);
      kernels::layernorm_forward_cut<T>(ExecSpace(), t.cut, stats(ms_o, 0), stats(ms_o, 1), t.x, p, 0, C, 1e-5, t.adj,
                                        acc_out, out.data());
    } else {
      kernels::rmsnorm_forward<Jet2<T>>(ExecSpace(), t.ref, stats(ms_r, 1), t.x, p, 0, -1, 1e-6);
      kernels::rmsnorm_forward_cut<T>(ExecSpace(), t.cut, stats(ms_c, 1), t.x, p, 0, -1, 1e-6, t.adj, acc);
      kernels::rmsnorm_forward_cut<T>(ExecSpace(), t.cut, stats(ms_o, 1), t.x, p, 0, -1, 1e-6, t.adj, acc_out,
                                      out.data());
    }
    ExecSpace().fence();
    t.same_values();
    REQUIRE(std::memcmp(ms_c.data(), ms_r.data(), sizeof(T) * ms_c.extent(0)) == 0);
    REQUIRE(std::memcmp(ms_o.data(), ms_r.data(), sizeof(T) * ms_o.extent(0)) == 0);
    cut_test::check(acc, t.av, t.rdd, K, N, C);
    t.same_rounded(out, acc, acc_out);
  }
}

// ---------------------------------------------------------------------------
// Column sums (kernels/colsum.hpp): the host shape and the GPU-shaped teams,
// both run here on the host backend.

namespace colsum_test {  // named: nvcc wants extended lambdas in functions with external linkage
// Terms a = X(k, n, c), b = Y(k, n, c) (sums only: no product whose
// contraction into an FMA could differ between the kernel and the replay).
struct ColumnData {
  gnh::index_t K = 3, N = 1000, C = 77;  // 77 columns: partial blocks of 16 and of 32
  View1<float> X{"X", std::size_t(3 * 1000 * 77)}, Y{"Y", std::size_t(3 * 1000 * 77)};
  ColumnData() {
    std::mt19937 g(41);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::size_t i = 0; i < X.size(); ++i) X(i) = u(g), Y(i) = u(g);
  }
  float a(gnh::index_t k, gnh::index_t n, gnh::index_t c) const { return X((k * N + n) * C + c); }
  float b(gnh::index_t k, gnh::index_t n, gnh::index_t c) const { return Y((k * N + n) * C + c); }
};

std::pair<View1<float>, View1<float>> run_column_sums(const ColumnData& d, kernels::ColumnShape shape,
                                                      gnh::index_t row_blocks = 0) {
  const gnh::index_t N = d.N, C = d.C;
  View1<float> A("A", std::size_t(d.K * C)), B("B", std::size_t(d.K * C));
  Kokkos::deep_copy(A, std::nanf(""));
  Kokkos::deep_copy(B, std::nanf(""));
  const View1<float> X = d.X, Y = d.Y;
  kernels::column_sums<float>(
      ExecSpace(), "test::column_sums", d.K, N, C,
      KOKKOS_LAMBDA(gnh::index_t k, gnh::index_t n, gnh::index_t c, float& a, float& b) {
        const gnh::index_t i = (k * N + n) * C + c;
        a += X(i);
        b += Y(i);
      },
      KOKKOS_LAMBDA(gnh::index_t k, gnh::index_t c, const float& a, const float& b) {
        A(k * C + c) = a;
        B(k * C + c) = b;
      },
      shape, row_blocks);
  Kokkos::fence();
  return {A, B};
}
}  // namespace colsum_test
using colsum_test::ColumnData;
using colsum_test::run_column_sums;

namespace {
struct NoTeamWork {
  KOKKOS_INLINE_FUNCTION void operator()(const gnh::TeamRange::member_type&) const {}
};
}  // namespace

TEST_CASE("the GPU-shaped teams run their threads side by side on a host backend that has them", "[kernels][rows]") {
  // Row, column-sum and attention teams take team_policy's threads on a host
  // backend: one on Serial; on OpenMP with two or more threads at least two,
  // so that the teams' barriers and per-thread scratch run concurrently in
  // the tests there (cmake/check-openmp.sh runs them on 2 threads).
  const int threads = kernels::detail::team_policy<gnh::TeamRange>(gnh::ExecSpace(), 1, NoTeamWork{},
                                                                   kernels::kTeamRows, kernels::kRowLanes)
                          .team_size();
  const int have = int(gnh::ExecSpace().concurrency());
  REQUIRE(threads >= 1);
  REQUIRE(threads <= kernels::kTeamRows);
  REQUIRE(threads >= std::min(2, have));
}

TEST_CASE("column sums: both shapes keep their fixed order and match the double sums", "[kernels][colsum]") {
  const ColumnData d;
  // 9 teams of columns: the teams shape adds row blocks (3 of 334 rows) to fill a GPU.
  const gnh::index_t nb = kernels::column_row_blocks(d.K, d.N, d.C);
  REQUIRE(nb == 3);
  const auto host = run_column_sums(d, kernels::ColumnShape::host);
  const auto teams = run_column_sums(d, kernels::ColumnShape::teams);
  const auto one_block = run_column_sums(d, kernels::ColumnShape::teams, 1);
  const double u = std::ldexp(1.0, -24);
  // The teams' order, replayed in float: in each row block, R strided
  // partials added in order of r; then the blocks in order.
  auto teams_order = [&](gnh::index_t k, gnh::index_t c, gnh::index_t blocks, float& ta, float& tb) {
    const gnh::index_t rows = kernels::column_block_rows(d.N, blocks);
    for (gnh::index_t rb = 0; rb < blocks; ++rb) {
      const gnh::index_t n0 = rb * rows, n1 = std::min(d.N, n0 + rows);
      float ba = 0, bb = 0;
      for (int r = 0; r < kernels::kTeamPartials; ++r) {
        float pa = 0, pb = 0;
        for (gnh::index_t n = n0 + r; n < n1; n += kernels::kTeamPartials) pa += d.a(k, n, c), pb += d.b(k, n, c);
        ba = r == 0 ? pa : ba + pa;
        bb = r == 0 ? pb : bb + pb;
      }
      ta = rb == 0 ? ba : ta + ba;
      tb = rb == 0 ? bb : tb + bb;
    }
  };
  for (gnh::index_t k = 0; k < d.K; ++k)
    for (gnh::index_t c = 0; c < d.C; ++c) {
      // Rows in order (host).
      float ha = 0, hb = 0;
      for (gnh::index_t n = 0; n < d.N; ++n) ha += d.a(k, n, c), hb += d.b(k, n, c);
      float ta = 0, tb = 0, oa = 0, ob = 0;
      teams_order(k, c, nb, ta, tb);
      teams_order(k, c, 1, oa, ob);
      const gnh::index_t i = k * d.C + c;
      INFO("plane " << k << " column " << c);
      REQUIRE(host.first(i) == ha);
      REQUIRE(host.second(i) == hb);
      REQUIRE(teams.first(i) == ta);
      REQUIRE(teams.second(i) == tb);
      REQUIRE(one_block.first(i) == oa);
      REQUIRE(one_block.second(i) == ob);
      // And each within the recursive-summation bound N u sum|x| (Higham
      // Thm 4.3, first order) of the exact sum.
      double ea = 0, eb = 0, sa = 0, sb = 0;
      for (gnh::index_t n = 0; n < d.N; ++n) {
        ea += double(d.a(k, n, c)), sa += std::fabs(double(d.a(k, n, c)));
        eb += double(d.b(k, n, c)), sb += std::fabs(double(d.b(k, n, c)));
      }
      for (const auto* out : {&host, &teams, &one_block}) {
        REQUIRE(std::fabs(double(out->first(i)) - ea) <= double(d.N) * u * sa);
        REQUIRE(std::fabs(double(out->second(i)) - eb) <= double(d.N) * u * sb);
      }
    }
}

TEST_CASE("linear and LayerNorm reverse: GPU-shaped column sums give the host shape's gradients", "[kernels][colsum]") {
  // In double and in Dual<double> (the tangent of the reverse): the two
  // shapes add the same terms in other orders, so they agree to N eps
  // sum|term| per entry; a wrong row, column or plane would be O(1) off.
  using D = Dual<double>;
  const gnh::index_t N = 300, C = 45, K = 2, P = 2 * C;
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto filled = [&](const char* name, std::size_t n) {
    View1<double> v(std::string(name), n);
    for (std::size_t i = 0; i < n; ++i) v(i) = u(gen);
    return v;
  };
  const View1<double> x = filled("x", (1 + K) * N * C), dy = filled("dy", (1 + K) * N * C), th = filled("th", P),
                      dth = filled("dth", K * P);
  for (gnh::index_t c = 0; c < C; ++c) th(c) += 1.5;  // LayerNorm scales away from 0
  auto act = [&](const View1<double>& v) {
    Act2<double> a;
    a.v = Span2<double>(v.data(), N, C);
    a.d = Span3<double>(v.data() + N * C, K, N, C);
    return a;
  };
  Params<double> p;
  p.v = Span1<const double>(th.data(), P);
  p.d = Span2<const double>(dth.data(), K, P);
  View1<double> y("y", (1 + K) * N * C), stats("stats", 2 * (1 + K) * N);
  Act1<double> mean, rstd;
  mean.v = Span1<double>(stats.data(), N);
  mean.d = Span2<double>(stats.data() + N, K, N);
  rstd.v = Span1<double>(stats.data() + (1 + K) * N, N);
  rstd.d = Span2<double>(stats.data() + (2 + K) * N, K, N);
  const ExecSpace space;
  kernels::layernorm_forward<D>(space, act(y), mean, rstd, act(x), p, 0, C, 1e-5);
  std::vector<std::vector<double>> grads;
  for (const auto shape : {kernels::ColumnShape::host, kernels::ColumnShape::teams}) {
    View1<double> dx("dx", (1 + K) * N * C), gv("gv", (1 + K) * P), lin("lin", (1 + K) * C);
    Grads<double> g;
    g.v = Span1<double>(gv.data(), P);
    g.d = Span2<double>(gv.data() + P, K, P);
    kernels::layernorm_reverse<D>(space, act(dx), g, act(dy), act(x), mean, rstd, p, 0, C, shape);
    kernels::layernorm_reverse<double>(space, act(dx), g, act(dy), act(x), mean, rstd, p, 0, C, shape);
    // The linear bias gradient of each plane of dy: all planes in one launch
    // (as linear_reverse does), the bits of one launch per plane.
    kernels::detail::add_colsum<double>(space, lin.data(), dy.data(), N, C, 1 + K, C, shape);
    View1<double> lin1("lin1", (1 + K) * C);
    for (gnh::index_t k = 0; k <= K; ++k)
      kernels::detail::add_colsum<double>(space, lin1.data() + k * C, dy.data() + k * N * C, N, C, 1, 0, shape);
    Kokkos::fence();
    REQUIRE(std::memcmp(lin.data(), lin1.data(), sizeof(double) * lin.size()) == 0);
    std::vector<double> all(gv.data(), gv.data() + gv.size());
    all.insert(all.end(), lin.data(), lin.data() + lin.size());
    grads.push_back(all);
  }
  // Terms are products of O(1) values and (x - mu) r = O(1): sum|term| <= ~4 N.
  const double tol = double(N) * std::numeric_limits<double>::epsilon() * 4.0 * double(N);
  REQUIRE(grads[0].size() == grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    INFO("entry " << i);
    REQUIRE(std::isfinite(grads[0][i]));
    REQUIRE(std::fabs(grads[0][i] - grads[1][i]) <= tol);
  }
  // The shapes did differ in order somewhere (else this test proves nothing).
  REQUIRE(grads[0] != grads[1]);
}

// The embedding's reverse as a serial loop over the rows: g (value and
// tangent planes) plus each row of dx at its token's and its position's rows.
template <class G, class X>
void serial_embedding_reverse(const View2<std::int32_t>& tokens, const X& dx, const G& g, index_t V, index_t C,
                              std::vector<float>& want_v, std::vector<float>& want_d) {
  const index_t Tc = tokens.extent(1), N = tokens.extent(0) * Tc, P = index_t(g.v.extent(0));
  want_v.assign(g.v.data(), g.v.data() + P);
  want_d.assign(g.d.data(), g.d.data() + P);
  for (index_t n = 0; n < N; ++n)
    for (index_t c = 0; c < C; ++c) {
      const index_t iw = index_t(tokens.data()[n]) * C + c, ip = V * C + (n % Tc) * C + c;
      want_v[iw] += dx.v(n * C + c);
      want_v[ip] += dx.v(n * C + c);
      want_d[iw] += dx.d(n * C + c);
      want_d[ip] += dx.d(n * C + c);
    }
}

// The two-stage embedding scatter (rows grouped by token, one team per token
// and per position) adds every row in increasing row order: the bits of a
// serial loop over the rows, for the value and the tangent planes. Tokens
// repeat out of order (some ids never appear, one appears in most rows).
TEST_CASE("embedding reverse: the grouped scatter gives the bits of a serial loop over the rows",
          "[kernels][embedding]") {
  const index_t B = 3, Tc = 7, C = 19, V = 13, N = B * Tc, P = (V + Tc) * C;
  View2<std::int32_t> tokens("tokens", B, Tc);
  for (index_t n = 0; n < N; ++n) tokens.data()[n] = std::int32_t(n % 3 == 0 ? 5 : (n * 7 + 3) % V);
  Buf<float> dx(N, C);
  Flat<float> g(P);
  load<float>(dx.v, ref::random_vec(N * C, 21));
  load<float>(dx.d, ref::random_vec(N * C, 22));
  load<float>(g.v, ref::random_vec(P, 23));
  load<float>(g.d, ref::random_vec(P, 24));
  std::vector<float> want_v, want_d;
  serial_embedding_reverse(tokens, dx, g, V, C, want_v, want_d);
  kernels::embedding_reverse<Dual<float>>(ExecSpace(), g.grads<Dual<float>>(), dx.act<Dual<float>>(), tokens, 0, V * C);
  Kokkos::fence();
  REQUIRE(std::memcmp(want_v.data(), g.v.data(), sizeof(float) * P) == 0);
  REQUIRE(std::memcmp(want_d.data(), g.d.data(), sizeof(float) * P) == 0);

  tokens.data()[4] = -2;
  REQUIRE_THROWS_WITH(
      kernels::embedding_reverse<float>(ExecSpace(), g.grads<float>(), dx.act<float>(), tokens, 0, V * C),
      Catch::Contains("negative token id at row 4"));
}

// The same scatter with the rows grouped on the device (TokenWork: counts per
// block of 512 rows, scans, ranks): the bits of the serial loop, over three
// blocks of rows with tokens that repeat within and across blocks, and
// again (the work reused, nothing left over from the first batch).
TEST_CASE("embedding reverse: the device grouping gives the bits of a serial loop over the rows",
          "[kernels][embedding]") {
  const index_t B = 5, Tc = 260, C = 7, V = 97, N = B * Tc, P = (V + Tc) * C;
  REQUIRE(kernels::detail::TokenWork::blocks(N) == 3);
  View2<std::int32_t> tokens("tokens", B, Tc);
  const kernels::detail::TokenWork work(N, V);
  for (int round = 0; round < 2; ++round) {
    std::mt19937 gen(31 + round);
    for (index_t n = 0; n < N; ++n)
      tokens.data()[n] = std::int32_t(n % 5 == 0 ? 3 : std::uniform_int_distribution<int>(0, int(V) - 9)(gen));
    Buf<float> dx(N, C);
    Flat<float> g(P);
    load<float>(dx.v, ref::random_vec(N * C, 41 + round));
    load<float>(dx.d, ref::random_vec(N * C, 42 + round));
    load<float>(g.v, ref::random_vec(P, 43));
    load<float>(g.d, ref::random_vec(P, 44));
    std::vector<float> want_v, want_d;
    serial_embedding_reverse(tokens, dx, g, V, C, want_v, want_d);
    kernels::embedding_reverse<Dual<float>>(ExecSpace(), g.grads<Dual<float>>(), dx.act<Dual<float>>(), tokens, 0,
                                            V * C, &work);
    Kokkos::fence();
    INFO("round " << round);
    REQUIRE(std::memcmp(want_v.data(), g.v.data(), sizeof(float) * P) == 0);
    REQUIRE(std::memcmp(want_d.data(), g.d.data(), sizeof(float) * P) == 0);
  }
}

namespace rows_test {  // named: nvcc wants extended lambdas in functions with external linkage
// LayerNorm in one row shape, float, K directions: every output of the five
// modes (forward, tangent, second order; reverse and its tangent: dx and the
// parameter gradients), concatenated.
std::vector<float> layernorm_all_modes(kernels::RowShape rows, gnh::index_t N, gnh::index_t C, gnh::index_t K) {
  using T = float;
  const gnh::index_t P = 2 * C;
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto filled = [&](const char* name, gnh::index_t n) {
    View1<T> v(std::string(name), n);
    for (gnh::index_t i = 0; i < n; ++i) v(i) = u(gen);
    return v;
  };
  const View1<T> x = filled("x", (1 + 2 * K) * N * C), dy = filled("dy", (1 + K) * N * C), th = filled("th", P),
                 dth = filled("dth", K * P);
  for (gnh::index_t c = 0; c < C; ++c) th(c) += 1.5f;
  auto act = [&](const View1<T>& v, bool second) {
    Act2<T> a;
    a.v = Span2<T>(v.data(), N, C);
    a.d = Span3<T>(v.data() + N * C, K, N, C);
    if (second) a.dd = Span3<T>(v.data() + (1 + K) * N * C, K, N, C);
    return a;
  };
  auto stats = [&](const View1<T>& v, gnh::index_t at, bool second) {
    Act1<T> a;
    a.v = Span1<T>(v.data() + at * N, N);
    a.d = Span2<T>(v.data() + (at + 1) * N, K, N);
    if (second) a.dd = Span2<T>(v.data() + (at + 1 + K) * N, K, N);
    return a;
  };
  Params<T> p;
  p.v = Span1<const T>(th.data(), P);
  p.d = Span2<const T>(dth.data(), K, P);
  const ExecSpace space;
  std::vector<float> out;
  // The first `planes` planes of an activation (n = N C) or of both statistics
  // (n = N): what the mode writes.
  auto keep = [&](const View1<T>& v, gnh::index_t planes, gnh::index_t n) {
    Kokkos::fence();
    const gnh::index_t half = v.extent(0) == std::size_t(2 * (1 + 2 * K) * N) ? (1 + 2 * K) * N : 0;
    for (const gnh::index_t at : half ? std::vector<gnh::index_t>{0, half} : std::vector<gnh::index_t>{0})
      out.insert(out.end(), v.data() + at, v.data() + at + planes * n);
  };
  const gnh::index_t S = 1 + 2 * K;  // planes of a Jet2 activation or statistic
  View1<T> y("y", S * N * C), ms("ms", 2 * S * N), dx("dx", (1 + K) * N * C);
  // Outputs start as NaN before each call: one left unwritten shows.
  auto unset = [&] {
    for (const View1<T>* v : {&y, &ms, &dx}) Kokkos::deep_copy(*v, std::numeric_limits<T>::quiet_NaN());
  };
  unset();
  kernels::layernorm_forward<T>(space, act(y, false), stats(ms, 0, false), stats(ms, S, false), act(x, false), p, 0, C,
                                1e-5, rows);
  keep(y, 1, N * C), keep(ms, 1, N);
  unset();
  kernels::layernorm_forward<Dual<T>>(space, act(y, false), stats(ms, 0, false), stats(ms, S, false), act(x, false), p,
                                      0, C, 1e-5, rows);
  keep(y, 1 + K, N * C), keep(ms, 1 + K, N);
  unset();
  kernels::layernorm_forward<Jet2<T>>(space, act(y, true), stats(ms, 0, true), stats(ms, S, true), act(x, true), p, 0,
                                      C, 1e-5, rows);
  keep(y, S, N * C), keep(ms, S, N);
  // The reverses at the Dual forward's statistics.
  unset();
  kernels::layernorm_forward<Dual<T>>(space, act(y, false), stats(ms, 0, false), stats(ms, S, false), act(x, false), p,
                                      0, C, 1e-5, rows);
  View1<T> gv("gv", (1 + K) * P);  // accumulated into: starts at zero
  Grads<T> g;
  g.v = Span1<T>(gv.data(), P);
  g.d = Span2<T>(gv.data() + P, K, P);
  kernels::layernorm_reverse<T>(space, act(dx, false), g, act(dy, false), act(x, false), stats(ms, 0, false),
                                stats(ms, S, false), p, 0, C, kernels::default_column_shape(), rows);
  keep(dx, 1, N * C), keep(gv, 1, P);
  Kokkos::deep_copy(dx, std::numeric_limits<T>::quiet_NaN());
  kernels::layernorm_reverse<Dual<T>>(space, act(dx, false), g, act(dy, false), act(x, false), stats(ms, 0, false),
                                      stats(ms, S, false), p, 0, C, kernels::default_column_shape(), rows);
  keep(dx, 1 + K, N * C), keep(gv, 1 + K, P);
  return out;
}
}  // namespace rows_test

TEST_CASE("LayerNorm: the GPU-shaped row kernels agree with the host shape in every mode", "[kernels][rows]") {
  // The teams shape adds a row's terms in lane_sum's order (16 strided
  // partials, then the partials in order), but the compiler fuses
  // multiply-adds differently in the host's vectorised lane loop and the
  // teams' strided one, so the shapes agree to rounding, not bit for bit
  // (measured: 0.23 (C+8) eps at C = 37). Each output is within the forward
  // test's (C+8) eps (|y| + 1) of the exact value, the derivative planes
  // within a few times that (their chain rule multiplies a handful of such
  // values): 4 (C+8) eps (|y| + 1) between the shapes. A wrong row, lane or
  // plane is O(1) off. C = 5 (fewer columns than lanes), 37 (two rounds of
  // lanes and a tail), 320. And the teams shape repeats its bits.
  for (const gnh::index_t C : {5, 37, 320}) {
    CAPTURE(C);
    const auto host = rows_test::layernorm_all_modes(kernels::RowShape::host, 19, C, 3);
    const auto teams = rows_test::layernorm_all_modes(kernels::RowShape::teams, 19, C, 3);
    const auto again = rows_test::layernorm_all_modes(kernels::RowShape::teams, 19, C, 3);
    REQUIRE(host.size() == teams.size());
    const double tol = 4.0 * double(C + 8) * std::numeric_limits<float>::epsilon();
    for (std::size_t i = 0; i < host.size(); ++i) {
      INFO("output " << i << ": host " << host[i] << ", teams " << teams[i]);
      REQUIRE(std::isfinite(host[i]));  // every output written (they start as NaN)
      REQUIRE(std::isfinite(teams[i]));
      REQUIRE(std::fabs(double(host[i]) - double(teams[i])) <= tol * (std::fabs(double(host[i])) + 1.0));
      REQUIRE(std::memcmp(&teams[i], &again[i], sizeof(float)) == 0);
    }
  }
}

namespace rows_test {
// Owned planes of a (rows, cols) buffer with K directions: v, then K tangent
// planes, then K second-order planes.
template <class T>
struct Planes {
  View1<T> all;
  gnh::index_t r = 0, c = 0, K = 0;
  Planes(gnh::index_t r_, gnh::index_t c_, gnh::index_t K_)
      : all("planes", (1 + 2 * K_) * r_ * c_), r(r_), c(c_), K(K_) {}
  template <class S>
  Act2<T> act() const {
    Act2<T> a;
    a.v = Span2<T>(all.data(), r, c);
    if (!std::is_same<S, T>::value) a.d = Span3<T>(all.data() + r * c, K, r, c);
    if (std::is_same<S, Jet2<T>>::value) a.dd = Span3<T>(all.data() + (1 + K) * r * c, K, r, c);
    return a;
  }
};

// Every output of an op O<T>'s five modes with K directions (forward,
// tangent, second order: y; reverse and its tangent: dx and the gradient),
// concatenated; outputs start as NaN before each call.
template <template <class> class O, class T>
std::vector<T> op_all_modes(O<T>& op, gnh::index_t K) {
  const kernels::OpSizes sz = op.sizes();
  const gnh::index_t N = sz.rows, P = sz.params;
  std::mt19937 gen(17);
  std::uniform_real_distribution<T> u(-1, 1);
  Planes<T> x(N, sz.in, K), y(N, sz.out, K), dy(N, sz.out, K), dx(N, sz.in, K);
  for (const Planes<T>* b : {&x, &dy})
    for (std::size_t i = 0; i < b->all.extent(0); ++i) b->all(i) = u(gen);
  View1<T> th("th", (1 + K) * P), gv("gv", (1 + K) * P);
  for (std::size_t i = 0; i < th.extent(0); ++i) th(i) = u(gen);
  std::vector<Planes<T>> saved;
  for (const kernels::OpExtent& e : op.saved()) saved.emplace_back(e.rows, e.cols, K);
  auto saved_planes = [&](auto s) {
    using S = decltype(s);
    kernels::OpSaved<T> r;
    for (const Planes<T>& b : saved) r.buf[r.count++] = b.template act<S>();
    return r;
  };
  auto params = [&](bool tangents) {
    Params<T> p{Span1<const T>(th.data(), P), {}};
    if (tangents) p.d = Span2<const T>(th.data() + P, K, P);
    return p;
  };
  auto grads = [&](bool tangents) {
    Grads<T> g{Span1<T>(gv.data(), P), {}};
    if (tangents) g.d = Span2<T>(gv.data() + P, K, P);
    return g;
  };
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> out;
  auto keep = [&](const View1<T>& v, gnh::index_t n) {
    Kokkos::fence();
    out.insert(out.end(), v.data(), v.data() + n);
  };
  const ExecSpace space;
  auto forward = [&](auto s) {
    using S = decltype(s);
    Kokkos::deep_copy(y.all, nan);
    op.template forward<S>(space, y.template act<S>(), x.template act<S>(), params(!std::is_same<S, T>::value),
                           saved_planes(s));
  };
  const gnh::index_t ny = N * sz.out, nx = N * sz.in;
  forward(T());
  keep(y.all, ny);
  forward(Dual<T>());
  keep(y.all, (1 + K) * ny);
  forward(Jet2<T>());
  keep(y.all, (1 + 2 * K) * ny);
  auto reverse = [&](auto s, gnh::index_t planes) {
    using S = decltype(s);
    const bool tangents = !std::is_same<S, T>::value;
    forward(s);
    Kokkos::deep_copy(dx.all, nan);
    Kokkos::deep_copy(gv, T(0));  // accumulated into
    op.template reverse<S>(space, dx.template act<S>(), grads(tangents), dy.template act<S>(), x.template act<S>(),
                           y.template act<S>(), params(tangents), saved_planes(s));
    keep(dx.all, planes * nx);
    keep(gv, planes * P);
  };
  reverse(T(), 1);
  reverse(Dual<T>(), 1 + K);
  return out;
}
}  // namespace rows_test

namespace contract_test {
// The planes of S among a buffer's 1 + 2K (value, K tangent, K second-order),
// and among the parameters' 1 + K.
template <class S>
gnh::index_t planes_kept(gnh::index_t K) {
  return has_tangents_v<S> ? (keeps_second_v<S> ? 1 + 2 * K : 1 + K) : 1;
}

// The op's forward<S>, then (for T and Dual<T>) its reverse<S>, run twice on
// the same inputs: once given the planes of S only, once given every plane,
// with the planes beyond S's NaN in the inputs (a read of one poisons the
// outputs) and a marker in the outputs (a write to one overwrites it). The
// outputs of S's planes must agree bit for bit and every marker survive.
template <class S, class Op>
void mode_from_scalar(Op& op, gnh::index_t K) {
  using T = base_t<S>;
  const kernels::OpSizes sz = op.sizes();
  const gnh::index_t N = sz.rows, P = sz.params, keep = planes_kept<S>(K), pkeep = has_tangents_v<S> ? 1 + K : 1;
  const T nan = std::numeric_limits<T>::quiet_NaN(), mark = T(7.25);
  const ExecSpace space;
  auto run = [&](bool all) {
    std::mt19937 gen(29);
    std::uniform_real_distribution<T> u(-1, 1);
    using rows_test::Planes;
    Planes<T> x(N, sz.in, K), y(N, sz.out, K), dy(N, sz.out, K), dx(N, sz.in, K);
    std::vector<Planes<T>> saved;
    for (const kernels::OpExtent& e : op.saved()) saved.emplace_back(e.rows, e.cols, K);
    View1<T> th("th", (1 + K) * P), gv("gv", (1 + K) * P);
    // Inputs random in S's planes, NaN beyond; outputs NaN in S's planes (so
    // every one must be written), the marker beyond.
    auto fill = [&](const View1<T>& b, gnh::index_t plane, gnh::index_t kept, bool input) {
      for (std::size_t i = 0; i < b.extent(0); ++i) {
        const bool mine = gnh::index_t(i) < kept * plane;
        const T r = u(gen);
        b(i) = input ? (mine || !all ? r : nan) : (mine || !all ? nan : mark);
      }
    };
    fill(x.all, N * sz.in, keep, true);
    fill(dy.all, N * sz.out, keep, true);
    fill(th, P, pkeep, true);
    fill(y.all, N * sz.out, keep, false);
    fill(dx.all, N * sz.in, keep, false);
    for (Planes<T>& b : saved) fill(b.all, b.r * b.c, keep, false);
    Kokkos::deep_copy(gv, T(0));
    if (all)
      for (gnh::index_t i = pkeep * P; i < (1 + K) * P; ++i) gv(i) = mark;
    auto planes = [&](const Planes<T>& b) { return all ? b.template act<Jet2<T>>() : b.template act<S>(); };
    kernels::OpSaved<T> sv;
    for (const Planes<T>& b : saved) sv.buf[sv.count++] = planes(b);
    Params<T> p{Span1<const T>(th.data(), P), {}};
    Grads<T> g{Span1<T>(gv.data(), P), {}};
    if (all || has_tangents_v<S>) {
      p.d = Span2<const T>(th.data() + P, K, P);
      g.d = Span2<T>(gv.data() + P, K, P);
    }
    op.template forward<S>(space, planes(y), planes(x), p, sv);
    if constexpr (!keeps_second_v<S>)
      op.template reverse<S>(space, planes(dx), g, planes(dy), planes(x), planes(y), p, sv);
    Kokkos::fence();
    // S's planes of every output, then whether every marker survived.
    std::vector<T> out;
    bool marks = true;
    auto keep_planes = [&](const View1<T>& b, gnh::index_t plane, gnh::index_t kept) {
      out.insert(out.end(), b.data(), b.data() + kept * plane);
      for (std::size_t i = std::size_t(kept * plane); all && i < b.extent(0); ++i) marks = marks && b(i) == mark;
    };
    keep_planes(y.all, N * sz.out, keep);
    for (const Planes<T>& b : saved) keep_planes(b.all, b.r * b.c, keep);
    if constexpr (!keeps_second_v<S>) {
      keep_planes(dx.all, N * sz.in, keep);
      keep_planes(gv, P, pkeep);
    }
    return std::make_pair(out, marks);
  };
  const auto [mine, unused] = run(false);
  const auto [given_all, marks_kept] = run(true);
  (void)unused;
  INFO(Op::name << ", " << (keeps_second_v<S> ? "Jet2" : has_tangents_v<S> ? "Dual" : "primal"));
  REQUIRE(marks_kept);
  REQUIRE(mine.size() == given_all.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) differ += std::memcmp(&mine[i], &given_all[i], sizeof(T)) != 0 ? 1 : 0;
  REQUIRE(differ == 0);
}

// The residual kernels (free functions, not ops) the same way: y = a + b and
// y += a on S's planes, given every plane.
template <class S>
void residual_from_scalar(gnh::index_t K) {
  using T = base_t<S>;
  const gnh::index_t N = 4, C = 5, plane = N * C, kept = planes_kept<S>(K) * plane;
  const T nan = std::numeric_limits<T>::quiet_NaN(), mark = T(7.25);
  rows_test::Planes<T> a(N, C, K), b(N, C, K), y(N, C, K);
  std::mt19937 gen(31);
  std::uniform_real_distribution<T> u(-1, 1);
  const gnh::index_t total = gnh::index_t(y.all.extent(0));
  for (gnh::index_t i = 0; i < total; ++i) {
    a.all(i) = i < kept ? u(gen) : nan;
    b.all(i) = i < kept ? u(gen) : nan;
    y.all(i) = i < kept ? nan : mark;
  }
  const ExecSpace space;
  const auto all = [](const rows_test::Planes<T>& p) { return p.template act<Jet2<T>>(); };
  kernels::residual_forward<S>(space, all(y), all(a), all(b));
  Kokkos::fence();
  INFO((keeps_second_v<S> ? "Jet2" : has_tangents_v<S> ? "Dual" : "primal"));
  for (gnh::index_t i = 0; i < total; ++i) {
    const T want = i < kept ? T(a.all(i) + b.all(i)) : mark;
    REQUIRE(std::memcmp(&y.all(i), &want, sizeof(T)) == 0);
  }
  if constexpr (!keeps_second_v<S>) {
    kernels::accumulate<S>(space, all(y), all(a));
    Kokkos::fence();
    for (gnh::index_t i = 0; i < total; ++i) {
      const T want = i < kept ? T(T(a.all(i) + b.all(i)) + a.all(i)) : mark;
      REQUIRE(std::memcmp(&y.all(i), &want, sizeof(T)) == 0);
    }
  }
}

struct EveryOp {
  gnh::index_t K;
  template <class Op>
  void operator()() const {
    const kernels::OpDims dims{2, 5, 2, 8, 11};
    Op op = Op::at(dims, K);
    mode_from_scalar<float>(op, K);
    mode_from_scalar<Dual<float>>(op, K);
    mode_from_scalar<Jet2<float>>(op, K);
  }
};
}  // namespace contract_test

TEST_CASE("every op takes its derivative mode from the scalar type, whatever planes it is given",
          "[kernels][contract]") {
  // The model passes its activations with every plane they have (the planes
  // of the highest mode it runs); each kernel keeps the planes of S
  // (planes_of) and must neither read nor write the others.
  kernels::Ops::for_each<float>(contract_test::EveryOp{3});
  contract_test::residual_from_scalar<float>(3);
  contract_test::residual_from_scalar<Dual<float>>(3);
  contract_test::residual_from_scalar<Jet2<float>>(3);
}

TEST_CASE("a kernel called in a mode on buffers without that mode's planes fails, naming itself and the buffer",
          "[kernels][contract]") {
  // Linear and GELU used to compute a lower mode quietly (no second order
  // when y had no second-order planes, K taken from one buffer alone).
  const gnh::index_t N = 4, in = 3, out = 2;
  test::Buf<float> x(N, in), y(N, out), h(N, in);
  test::Flat<float> p(out * in + out);
  // Jet2 on an output with tangent planes only.
  REQUIRE_THROWS_WITH(kernels::linear_forward<Jet2<float>>(ExecSpace(), y.act<Dual<float>>(), x.act<Jet2<float>>(),
                                                           p.params<Jet2<float>>(), 0, out * in),
                      Catch::Contains("gnh::linear::forward: y has 0 second-order planes, expected 1"));
  // Dual with a parameter block of no directions.
  REQUIRE_THROWS_WITH(kernels::linear_forward<Dual<float>>(ExecSpace(), y.act<Dual<float>>(), x.act<Dual<float>>(),
                                                           p.params<float>(), 0, out * in),
                      Catch::Contains("gnh::linear::forward: theta has 0 directions, expected 1"));
  REQUIRE_THROWS_WITH(
      kernels::gelu_forward<Jet2<float>>(ExecSpace(), h.act<Jet2<float>>(), x.act<Dual<float>>(), Gelu::erf),
      Catch::Contains("gnh::gelu::forward: x has 0 second-order planes, expected 1"));
  // And the planes of the mode suffice, higher ones being ignored.
  REQUIRE_NOTHROW(kernels::linear_forward<Dual<float>>(ExecSpace(), y.act<Jet2<float>>(), x.act<Jet2<float>>(),
                                                       p.params<Dual<float>>(), 0, out * in));
}

TEST_CASE("LM head and cross-entropy: the GPU-shaped row kernels agree with the host shape in every mode",
          "[kernels][rows]") {
  // Tiles of rows and vocabulary chunks (the online log-sum-exp's running
  // sums carried from chunk to chunk), K = 3 directions: a chunk narrower
  // than the lanes (vc 4, C 5); chunks of 17 and C = 37 (two rounds of lanes
  // and a tail); one tile of the whole batch (V = 50), also at K = 17 (the
  // wide rows' directions a group of 16 and a group of 1). Both shapes take each
  // sum in lane_sum's order, and maxima are exact, so they differ only where
  // the compiler fuses multiply-adds differently (as for LayerNorm). A loss or
  // lse is a sum over up to max(V, C) terms: within (n + 8) eps (|y| + 1) of
  // exact, the derivative planes a few times that: 4 (n + 8) eps (|y| + 1)
  // between the shapes (measured: 0, 0 and 0.002 of it). A wrong row, lane,
  // chunk or plane is O(1) off; a 0.1% error in a running sum fails it. And
  // the teams shape repeats its bits.
  struct Tiling {
    gnh::index_t N, C, V, rows, vchunk, K;
  };
  for (const Tiling t : {Tiling{7, 5, 11, 3, 4, 3}, Tiling{9, 37, 40, 4, 17, 3}, Tiling{6, 20, 50, 6, 0, 3},
                         Tiling{6, 20, 50, 6, 0, 17}, Tiling{5, 9, 300, 2, 0, 3}}) {
    CAPTURE(t.N, t.C, t.V, t.rows, t.vchunk, t.K);
    auto run = [&](kernels::RowShape shape) {
      kernels::LmHeadXentOp<float> op(t.N, t.C, t.V, t.rows, t.vchunk, shape);
      return rows_test::op_all_modes(op, t.K);
    };
    const auto host = run(kernels::RowShape::host);
    // The wide shape (a team a row, 128 lanes) sums other partials in
    // another order; its 128 partials hold at most min(n, 128) nonzero terms
    // (the rest add exact zeros), so the same bound holds. Its primal forward
    // takes each chunk's maximum and sum in one read (a running maximum per
    // lane, its sum rescaled by one exponential where the maximum rises):
    // a rounding or two more per term, inside the same bound.
    for (const kernels::RowShape shape : {kernels::RowShape::teams, kernels::RowShape::wide}) {
      CAPTURE(int(shape));
      const auto teams = run(shape);
      const auto again = run(shape);
      REQUIRE(host.size() == teams.size());
      const double tol = 4.0 * double(std::max(t.V, t.C) + 8) * std::numeric_limits<float>::epsilon();
      for (std::size_t i = 0; i < host.size(); ++i) {
        INFO("output " << i << ": host " << host[i] << ", shape " << teams[i]);
        REQUIRE(std::isfinite(host[i]));  // every output written (they start as NaN)
        REQUIRE(std::isfinite(teams[i]));
        const double err = std::fabs(double(host[i]) - double(teams[i])) / (std::fabs(double(host[i])) + 1.0);
        REQUIRE(err <= tol);
        REQUIRE(std::memcmp(&teams[i], &again[i], sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("attention: the GPU-shaped row kernels agree with the host's kernels in every mode", "[kernels][rows]") {
  // A query or key per row, its head channels on the lanes, K = 3
  // directions: fewer channels than lanes (hs 3), a round of lanes and a
  // tail (hs 20). The teams shape runs as flash-style tiles (teams of
  // kTeamRows = 8 rows, kAttentionTile = 16 keys or queries a tile): T = 5
  // is a part of one team and one tile, T = 37 is four teams and a tail of 5
  // rows, two tiles and a tail of 5, with causal tiles skipped. In double both shapes run the portable kernels (the
  // same sums in lane_sum's order); in float the host shape is the tiled host kernels (attention_host.hpp), another
  // order of the same sums. An output is a softmax-weighted mean over up to T keys of values, each score a sum of hs
  // products: within (T + hs + 8) eps (|y| + 1) of exact, the derivative planes a few times that, so 4 (T + hs + 8) eps
  // (|y| + 1) between the shapes. A wrong query, key, head, lane or plane is O(1) off. And the teams shape repeats its
  // bits.
  // Grouped-query (G < H key/value heads, rows [q | k | v]) and GPT-NeoX's
  // per-head [q | k | v] rows (G = 0 below) likewise.
  struct Shape {
    gnh::index_t B, T, H, hs, G;
  };
  for (const Shape a : {Shape{2, 5, 2, 3, 2}, Shape{1, 7, 2, 20, 2}, Shape{2, 37, 2, 5, 2}, Shape{2, 37, 4, 5, 1},
                        Shape{1, 21, 6, 4, 2}, Shape{2, 19, 3, 4, 0}}) {
    CAPTURE(a.B, a.T, a.H, a.hs, a.G);
    using kernels::QkvLayout;
    const QkvLayout L = a.G > 0 ? QkvLayout::fused(a.H, a.G, a.hs) : QkvLayout::interleaved(a.H, a.hs);
    const gnh::index_t width = a.G > 0 ? (a.H + 2 * a.G) * a.hs : 3 * a.H * a.hs;
    auto compare = [&](auto zero) {
      using T = decltype(zero);
      auto run = [&](kernels::RowShape shape) {
        kernels::AttentionOp<T> op(a.B, a.T, L, width, shape);
        return rows_test::op_all_modes(op, 3);
      };
      const auto host = run(kernels::RowShape::host);
      const auto teams = run(kernels::RowShape::teams);
      const auto again = run(kernels::RowShape::teams);
      REQUIRE(host.size() == teams.size());
      const double tol = 4.0 * double(a.T + a.hs + 8) * std::numeric_limits<T>::epsilon();
      for (std::size_t i = 0; i < host.size(); ++i) {
        INFO("output " << i << ": host " << host[i] << ", teams " << teams[i]);
        REQUIRE(std::isfinite(host[i]));  // every output written (they start as NaN)
        REQUIRE(std::isfinite(teams[i]));
        REQUIRE(std::fabs(double(host[i]) - double(teams[i])) / (std::fabs(double(host[i])) + 1.0) <= tol);
        REQUIRE(std::memcmp(&teams[i], &again[i], sizeof(T)) == 0);
      }
    };
    compare(double(0));
    compare(float(0));
  }
}
