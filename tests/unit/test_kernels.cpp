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
#include <cmath>

#include "kernels/attention.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"
#include "kernels/residual.hpp"
#include "support/reference.hpp"
#include "support/views.hpp"

using namespace gnh;
using gnh::test::nan_view1;
using gnh::test::nan_view2;
using gnh::test::rounded;
using gnh::test::to_host;
using gnh::test::to_view1;
using gnh::test::to_view2;

namespace {
template <class T>
constexpr double eps() { return std::numeric_limits<T>::epsilon(); }

void check_close(const std::vector<double>& got, const std::vector<double>& want,
                 const std::vector<double>& tol) {
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
  const auto x = rounded<T>(ref::random_vec(N * in, 1)), w = rounded<T>(ref::random_vec(out * in, 2));
  const auto b = rounded<T>(ref::random_vec(out, 3));
  auto y = nan_view2<T>(N, out);
  View1<T> bv = bias ? to_view1<T>(b) : View1<T>();
  kernels::linear_forward<T>(ExecSpace(), y, to_view2<T>(x, N, in), to_view2<T>(w, out, in), bv);
  const auto want = ref::linear(x, w, bias ? &b : nullptr, N, in, out);
  std::vector<double> tol(want.size());
  for (index_t n = 0; n < N; ++n)
    for (index_t o = 0; o < out; ++o) {
      double mag = bias ? std::abs(b[o]) : 0.0;  // sum |x_i w_i| + |b|
      for (index_t i = 0; i < in; ++i) mag += std::abs(x[n * in + i] * w[o * in + i]);
      tol[n * out + o] = double(in + 2) * eps<T>() * mag;
    }
  check_close(to_host(y), want, tol);
}

TEMPLATE_TEST_CASE("layernorm forward matches the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto [N, C, bias] = GENERATE(table<index_t, index_t, bool>(
      {{1, 1, true}, {1, 2, false}, {7, 5, true}, {13, 12, false}, {3, 320, true}}));
  CAPTURE(N, C, bias);
  const auto x = rounded<T>(ref::random_vec(N * C, 4, 2.0, 0.5));
  const auto w = rounded<T>(ref::random_vec(C, 5, 0.3, 1.0)), b = rounded<T>(ref::random_vec(C, 6));
  auto y = nan_view2<T>(N, C);
  auto mean = nan_view1<T>(N), rstd = nan_view1<T>(N);
  kernels::layernorm_forward<T>(ExecSpace(), y, mean, rstd, to_view2<T>(x, N, C), to_view1<T>(w),
                                bias ? to_view1<T>(b) : View1<T>(), 1e-5);
  const auto want = ref::layernorm(x, w, bias ? &b : nullptr, N, C, 1e-5);
  // Mean and variance are length-C sums; the normalised value inherits
  // ~(C+8) eps relative error of |x - mu| rstd |w|, plus |b| rounding.
  std::vector<double> tol(want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    tol[i] = double(C + 8) * eps<T>() * (std::abs(want[i]) + (bias ? std::abs(b[i % C]) : 0.0) + 1.0);
  check_close(to_host(y), want, tol);
  for (double r : to_host(rstd)) REQUIRE(std::isfinite(r));
  for (double m : to_host(mean)) REQUIRE(std::isfinite(m));
}

TEMPLATE_TEST_CASE("gelu forward matches the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto kind = GENERATE(Gelu::erf, Gelu::tanh);
  const auto [N, C] = GENERATE(table<index_t, index_t>({{1, 1}, {7, 13}, {0, 4}}));
  const auto x = rounded<T>(ref::random_vec(N * C, 7, 3.0));
  auto y = nan_view2<T>(N, C);
  kernels::gelu_forward<T>(ExecSpace(), y, to_view2<T>(x, N, C), kind);
  std::vector<double> want(x.size()), tol(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    want[i] = ref::gelu(x[i], kind);
    tol[i] = 8 * eps<T>() * (std::abs(x[i]) + 1.0);  // a handful of ops on |x|-sized values
  }
  check_close(to_host(y), want, tol);
}

TEMPLATE_TEST_CASE("residual and embedding forward match the reference", "[kernels]", float, double) {
  using T = TestType;
  const index_t B = 2, Tc = 5, C = 3, V = 11, block = 7;
  const auto wte = rounded<T>(ref::random_vec(V * C, 8)), wpe = rounded<T>(ref::random_vec(block * C, 9));
  std::vector<double> tok_d(B * Tc);
  for (index_t i = 0; i < B * Tc; ++i) tok_d[i] = double((i * 7 + 3) % V);
  View2<std::int32_t> tokens("tokens", B, Tc);
  auto ht = Kokkos::create_mirror_view(tokens);
  for (index_t i = 0; i < B * Tc; ++i) ht.data()[i] = static_cast<std::int32_t>(tok_d[i]);
  Kokkos::deep_copy(tokens, ht);
  auto x = nan_view2<T>(B * Tc, C);
  kernels::embedding_forward<T>(ExecSpace(), x, tokens, to_view2<T>(wte, V, C), to_view2<T>(wpe, block, C));
  std::vector<double> want(B * Tc * C), tol(B * Tc * C);
  for (index_t n = 0; n < B * Tc; ++n)
    for (index_t c = 0; c < C; ++c) {
      const double a = wte[ht.data()[n] * C + c], p = wpe[(n % Tc) * C + c];
      want[n * C + c] = a + p;
      tol[n * C + c] = eps<T>() * (std::abs(a) + std::abs(p));  // one rounded addition
    }
  check_close(to_host(x), want, tol);

  const auto a = rounded<T>(ref::random_vec(13 * 3, 10)), b = rounded<T>(ref::random_vec(13 * 3, 11));
  auto y = nan_view2<T>(13, 3);
  kernels::residual_forward<T>(ExecSpace(), y, to_view2<T>(a, 13, 3), to_view2<T>(b, 13, 3));
  for (std::size_t i = 0; i < a.size(); ++i) {
    want.resize(a.size());
    tol.resize(a.size());
    want[i] = a[i] + b[i];
    tol[i] = eps<T>() * (std::abs(a[i]) + std::abs(b[i]));
  }
  check_close(to_host(y), want, tol);
}

TEMPLATE_TEST_CASE("attention forward matches the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto [B, Tc, H, hs] = GENERATE(table<index_t, index_t, index_t, index_t>(
      {{1, 1, 1, 1}, {2, 5, 3, 4}, {1, 13, 3, 2}, {2, 7, 1, 5}, {1, 31, 5, 8}}));
  CAPTURE(B, Tc, H, hs);
  const index_t C = H * hs, N = B * Tc;
  const auto qkv = rounded<T>(ref::random_vec(N * 3 * C, 12, 1.5));
  auto y = nan_view2<T>(N, C);
  auto lse = nan_view1<T>(B * H * Tc);
  kernels::attention_forward<T>(ExecSpace(), y, lse, to_view2<T>(qkv, N, 3 * C), B, Tc, int(H));
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
  check_close(to_host(y), want, tol);
  for (double l : to_host(lse)) REQUIRE(std::isfinite(l));
}

TEMPLATE_TEST_CASE("fused lm head and cross-entropy match the reference", "[kernels]", float, double) {
  using T = TestType;
  const auto [N, C, V, chunk] = GENERATE(table<index_t, index_t, index_t, index_t>(
      {{1, 1, 2, 1}, {7, 5, 11, 3}, {13, 12, 37, 13}, {10, 4, 5, 4}}));
  CAPTURE(N, C, V, chunk);
  const auto h = rounded<T>(ref::random_vec(N * C, 13)), w = rounded<T>(ref::random_vec(V * C, 14));
  std::vector<std::int32_t> targets(N);
  for (index_t n = 0; n < N; ++n) targets[n] = n % 4 == 3 ? -1 : std::int32_t((n * 5 + 1) % V);
  View1<std::int32_t> tv("targets", N);
  auto ht = Kokkos::create_mirror_view(tv);
  for (index_t n = 0; n < N; ++n) ht(n) = targets[n];
  Kokkos::deep_copy(tv, ht);
  View1<double> loss("loss", N);
  Kokkos::deep_copy(loss, std::numeric_limits<double>::quiet_NaN());
  auto lse = nan_view1<T>(N);
  auto ws = nan_view2<T>(chunk, V);
  kernels::lm_head_xent_forward<T>(ExecSpace(), loss, lse, to_view2<T>(h, N, C), to_view2<T>(w, V, C), tv, ws);
  const auto want = ref::xent_rows(h, w, targets, N, C, V);
  // Logits are length-C dot products; the log-sum-exp adds a length-V sum.
  std::vector<double> tol(N);
  for (index_t n = 0; n < N; ++n) {
    double mag = 0;
    for (index_t v = 0; v < V; ++v)
      for (index_t c = 0; c < C; ++c) mag = std::max(mag, std::abs(h[n * C + c] * w[v * C + c]) * C);
    tol[n] = double(C + V + 8) * eps<T>() * (mag + 1.0);
  }
  check_close(to_host(loss), want, tol);
}
