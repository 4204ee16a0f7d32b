// SPDX-License-Identifier: BSD-3-Clause
// Every op's reverse, tangent, tangent-of-reverse and second-order kernels,
// in double, against central finite differences and the adjoint identity.
//
// Tolerances. Central differences with step h err by h^2 |F'''|/6 (truncation)
// plus eps |F|/h (rounding); with inputs O(1) and h = 1e-5 both are ~1e-10
// relative, so a bar of 1e-7 relative leaves a thousandfold margin while
// still catching any wrong term (a missing term is an O(1) relative error).
// The adjoint identity <J t, w> = <t, J^T w> holds to rounding: both sides are
// sums of products each formed by O(100)-long accumulations, so we allow
// 1e3 eps times the sum of absolute terms.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>

#include "support/ops.hpp"

using namespace gnh;
using test::Buf;
using test::Flat;
using test::Op;

namespace {

constexpr double kStep = 1e-5;
constexpr double kFdRel = 1e-7;
constexpr double kEps = std::numeric_limits<double>::epsilon();

template <class V>
void randomize(const V& v, std::uint64_t seed, double scale, double shift = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (std::size_t i = 0; i < v.size(); ++i) v.data()[i] = shift + scale * nd(rng);
}

template <class V>
std::vector<double> copy_of(const V& v) {
  return std::vector<double>(v.data(), v.data() + v.size());
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double absdot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(a[i] * b[i]);
  return s;
}

// floor: the scale below which a quantity counts as zero (a linear op's second
// derivative is exactly 0 in theory and ~eps in practice).
void require_close_vectors(const std::vector<double>& got, const std::vector<double>& fd, const char* what,
                           double floor = 0.0) {
  REQUIRE(got.size() == fd.size());
  double scale = floor;
  for (double g : got) scale = std::max(scale, std::abs(g));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << " element " << i << ": analytic " << got[i] << " finite difference " << fd[i]);
    REQUIRE(std::isfinite(got[i]));
    REQUIRE(std::abs(got[i] - fd[i]) <= kFdRel * std::max(scale, 1e-300));
  }
}

// Runs all derivative checks on one op instance.
void check_op(Op<double>& op, std::uint64_t seed, double x_scale, double x_shift = 0.0) {
  const index_t N = op.N, Cin = op.Cin, Cout = op.Cout, P = op.P;
  CAPTURE(op.name(), N, Cin, Cout, P);
  Buf<double> x(N, Cin), dy(N, Cout);
  Flat<double> p(P);
  randomize(x.v, seed, x_scale, x_shift);
  randomize(x.d, seed + 1, 1.0);  // u_x
  randomize(p.v, seed + 2, 0.5, 0.0);
  randomize(p.d, seed + 3, 1.0);  // u_theta
  if (op.unit_seed) {
    for (index_t i = 0; i < N * Cout; ++i) {
      dy.v(i) = 1.0;
      dy.d(i) = 0.0;
    }
  } else {
    randomize(dy.v, seed + 4, 1.0);
    randomize(dy.d, seed + 5, 1.0);  // w: tangent of the seed
  }
  const auto ux = copy_of(x.d), up = copy_of(p.d);

  // F at theta + h u (primal), its tangent (Dual) and the reverse there.
  auto shifted = [&](double h, Buf<double>& xs, Flat<double>& ps, Buf<double>& dys) {
    for (index_t i = 0; i < N * Cin; ++i) {
      xs.v(i) = x.v(i) + h * x.d(i);
      xs.d(i) = x.d(i);
      xs.dd(i) = 0;
    }
    for (index_t i = 0; i < P; ++i) {
      ps.v(i) = p.v(i) + h * p.d(i);
      ps.d(i) = p.d(i);
    }
    for (index_t i = 0; i < N * Cout; ++i) {
      dys.v(i) = dy.v(i) + h * dy.d(i);
      dys.d(i) = dy.d(i);
    }
  };
  auto primal_at = [&](double h) {
    Buf<double> xs(N, Cin), ys(N, Cout), dys(N, Cout);
    Flat<double> ps(P);
    shifted(h, xs, ps, dys);
    op.fwd_primal(ys, xs, ps);
    return copy_of(ys.v);
  };
  auto tangent_at = [&](double h) {
    Buf<double> xs(N, Cin), ys(N, Cout), dys(N, Cout);
    Flat<double> ps(P);
    shifted(h, xs, ps, dys);
    op.fwd_dual(ys, xs, ps);
    return copy_of(ys.d);
  };
  auto reverse_at = [&](double h) {
    Buf<double> xs(N, Cin), dys(N, Cout), dx(N, Cin);
    Flat<double> ps(P), g(P);
    shifted(h, xs, ps, dys);
    op.rev_primal(dx, g, dys, xs, ps);
    auto out = copy_of(dx.v);
    const auto gv = copy_of(g.v);
    out.insert(out.end(), gv.begin(), gv.end());
    return out;
  };
  auto central = [&](const std::function<std::vector<double>(double)>& f) {
    const auto a = f(kStep), b = f(-kStep);
    std::vector<double> d(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) d[i] = (a[i] - b[i]) / (2 * kStep);
    return d;
  };

  // Primal reverse: <dy, dF> along u against finite differences.
  Buf<double> dx(N, Cin);
  Flat<double> g(P);
  op.rev_primal(dx, g, dy, x, p);
  const auto dxv = copy_of(dx.v), gv = copy_of(g.v), dyv = copy_of(dy.v);
  const double vjp = dot(dxv, ux) + dot(gv, up);
  const double fd = dot(dyv, central(primal_at));
  const double vjp_scale = absdot(dxv, ux) + absdot(gv, up);
  INFO("reverse: <dx,u> = " << vjp << ", finite difference " << fd);
  REQUIRE(std::abs(vjp - fd) <= kFdRel * vjp_scale);

  // Tangent against finite differences, element by element.
  const auto ydot = tangent_at(0.0);
  require_close_vectors(ydot, central(primal_at), "tangent");

  // Adjoint identity <J u, dy> = <u, J^T dy>, to rounding.
  const double lhs = dot(ydot, dyv);
  INFO("adjoint: <Ju, w> = " << lhs << ", <u, J^T w> = " << vjp);
  REQUIRE(std::abs(lhs - vjp) <= 1e3 * kEps * (absdot(ydot, dyv) + vjp_scale));

  // Tangent of the reverse against finite differences of the reverse.
  Buf<double> dx2(N, Cin);
  Flat<double> g2(P);
  op.rev_dual(dx2, g2, dy, x, p);
  auto rdot = copy_of(dx2.d);
  const auto gd = copy_of(g2.d);
  rdot.insert(rdot.end(), gd.begin(), gd.end());
  require_close_vectors(rdot, central(reverse_at), "tangent of reverse");
  // ... and its value part is the primal reverse.
  const auto g2v = copy_of(g2.v);
  for (std::size_t i = 0; i < gv.size(); ++i) REQUIRE(std::abs(g2v[i] - gv[i]) <= 1e3 * kEps * (std::abs(gv[i]) + 1));

  // Second order: y'' along u against finite differences of the tangent.
  Buf<double> y2(N, Cout);
  for (index_t i = 0; i < N * Cin; ++i) x.dd(i) = 0;
  op.fwd_jet(y2, x, p);
  double tangent_scale = 0;
  for (double t : ydot) tangent_scale = std::max(tangent_scale, std::abs(t));
  require_close_vectors(copy_of(y2.dd), central(tangent_at), "second order", tangent_scale);
  // Its first-order part is the tangent.
  const auto y2d = copy_of(y2.d);
  for (std::size_t i = 0; i < ydot.size(); ++i)
    REQUIRE(std::abs(y2d[i] - ydot[i]) <= 1e3 * kEps * (std::abs(ydot[i]) + 1));
}

}  // namespace

TEST_CASE("linear: every derivative mode", "[derivatives]") {
  for (bool bias : {true, false}) {
    test::OpAdapter<kernels::LinearOp<double>> op(7, 5, 3, bias);
    check_op(op, 10, 1.0);
  }
  test::OpAdapter<kernels::LinearOp<double>> one(1, 1, 1, true);
  check_op(one, 11, 1.0);
}

TEST_CASE("layernorm: every derivative mode", "[derivatives]") {
  for (bool bias : {true, false}) {
    test::OpAdapter<kernels::LayerNormOp<double>> op(5, 7, bias);
    check_op(op, 20, 1.5, 0.3);
  }
  test::OpAdapter<kernels::LayerNormOp<double>> two(3, 2, true);
  check_op(two, 21, 1.0);
  // The GPU-shaped row kernels (rows.hpp) and column sums (colsum.hpp) on
  // this host backend: fewer columns than lanes, and two rounds of lanes with
  // a tail (two column blocks at C = 37).
  for (const index_t C : {7, 37}) {
    test::OpAdapter<kernels::LayerNormOp<double>> teams(5, C, true, kernels::RowShape::teams);
    check_op(teams, 22, 1.5, 0.3);
  }
}

TEST_CASE("rmsnorm: every derivative mode", "[derivatives]") {
  for (bool bias : {true, false}) {
    test::OpAdapter<kernels::RmsNormOp<double>> op(5, 7, bias);
    check_op(op, 23, 1.5, 0.3);
  }
  // One channel (r = 1/|x| up to eps: the statistic is the row itself), and
  // the GPU-shaped row kernels and column sums on this host backend.
  test::OpAdapter<kernels::RmsNormOp<double>> one(3, 1, false);
  check_op(one, 24, 1.0, 0.5);
  for (const index_t C : {7, 37}) {
    test::OpAdapter<kernels::RmsNormOp<double>> teams(5, C, false, kernels::RowShape::teams);
    check_op(teams, 25, 1.5, 0.3);
  }
}

TEST_CASE("rotary: every derivative mode", "[derivatives]") {
  // Blocks of 5 positions, 2 blocks; heads of 6 dims rotated whole, in part
  // (r = 2, as rotary_pct 0.25 of 8 rounds) and not at all; a small base so
  // that the angles reach several radians within the block.
  const auto [D, r] = GENERATE(table<index_t, index_t>({{6, 6}, {8, 2}, {6, 0}, {2, 2}}));
  CAPTURE(D, r);
  test::OpAdapter<kernels::RotaryOp<double>> op(10, 5, 3, D, r, 7.0);
  check_op(op, 26, 1.0);
  // GPT-NeoX's query_key_value rows: 2 heads of [q | k | v], q and k rotated, v passing.
  test::OpAdapter<kernels::RotaryOp<double>> neox(10, 5, 6, D, r, 7.0, kernels::RotarySegments{3, 2});
  check_op(neox, 28, 1.0);
}

TEST_CASE("swiglu: every derivative mode", "[derivatives]") {
  // Gates over both signs and a few units (silu's curvature lives there).
  for (const index_t F : {1, 7}) {
    test::OpAdapter<kernels::SwigluOp<double>> op(5, F);
    check_op(op, 27, 2.0, 0.1);
  }
}

TEST_CASE("gelu: every derivative mode", "[derivatives]") {
  for (Gelu kind : {Gelu::erf, Gelu::tanh}) {
    test::OpAdapter<kernels::GeluOp<double>> op(6, 7, kind);
    check_op(op, 30, 2.0);
    // 4 x (GeluChunk + 37) elements: on a host space whole chunks of the
    // derivative loops (8192 elements on one thread, 4096 on 2: gelu_chunk)
    // and a tail.
    constexpr index_t L = kernels::detail::GeluChunk;
    test::OpAdapter<kernels::GeluOp<double>> chunks(4, L + 37, kind);
    check_op(chunks, 31, 2.0);
  }
}

TEST_CASE("attention: every derivative mode", "[derivatives]") {
  // (B, T, heads, head size): T = 1, a prime T, three heads.
  test::OpAdapter<kernels::AttentionOp<double>> a(1, 1, 1, 2), b(2, 5, 3, 2), c(1, 7, 2, 3);
  check_op(a, 40, 1.0);
  check_op(b, 41, 1.0);
  check_op(c, 42, 1.0);
  // The GPU-shaped kernels (flash-style tiles of 8 rows and 16 keys or
  // queries in team scratch) on this host backend: fewer head channels than
  // lanes, a round of lanes with a tail, and T = 19: three teams of rows, two
  // tiles, causal tiles skipped.
  test::OpAdapter<kernels::AttentionOp<double>> d(2, 5, 3, 2, kernels::RowShape::teams),
      e(1, 4, 2, 18, kernels::RowShape::teams), f(1, 19, 2, 3, kernels::RowShape::teams);
  check_op(d, 43, 1.0);
  check_op(e, 44, 1.0);
  check_op(f, 45, 1.0);
  // Grouped-query attention, rows [q (H hs) | k (G hs) | v (G hs)]: one
  // key/value head for 4 query heads, 2 for 4, and GPT-NeoX's per-head
  // [q | k | v] rows; both shapes (the key rows of the reverse visit each
  // query head of their group).
  using kernels::QkvLayout;
  for (const kernels::RowShape shape : {kernels::RowShape::host, kernels::RowShape::teams}) {
    test::OpAdapter<kernels::AttentionOp<double>> g1(2, 5, QkvLayout::fused(4, 1, 2), 6 * 2, shape),
        g2(1, 19, QkvLayout::fused(4, 2, 3), 8 * 3, shape), nx(2, 5, QkvLayout::interleaved(3, 2), 9 * 2, shape);
    check_op(g1, 46, 1.0);
    check_op(g2, 47, 1.0);
    check_op(nx, 48, 1.0);
  }
}

TEST_CASE("fused lm head and cross-entropy: every derivative mode", "[derivatives]") {
  // Tiles by rows, by vocabulary chunks (online log-sum-exp, with the target
  // in the first, a middle and the last chunk) and by both.
  test::OpAdapter<kernels::LmHeadXentOp<double>> a(7, 5, 11, 3), b(4, 3, 2, 4), c(7, 5, 11, 7, 4), d(5, 4, 13, 2, 3);
  check_op(a, 50, 1.0);
  check_op(b, 51, 1.0);
  check_op(c, 52, 1.0);
  check_op(d, 53, 1.0);
  // The GPU-shaped row kernels (rows.hpp) on this host backend: chunks
  // narrower than the lanes, and C and chunks past two rounds of lanes.
  test::OpAdapter<kernels::LmHeadXentOp<double>> e(7, 5, 11, 3, 4, kernels::RowShape::teams),
      f(5, 37, 40, 2, 17, kernels::RowShape::teams);
  check_op(e, 54, 1.0);
  check_op(f, 55, 1.0);
  // The wide shape (a team a vocabulary row, as GPU-shaped engines run the
  // head): a chunk narrower than its 128 lanes, and a vocabulary past them.
  test::OpAdapter<kernels::LmHeadXentOp<double>> g(7, 5, 11, 3, 4, kernels::RowShape::wide),
      h(3, 6, 300, 2, 0, kernels::RowShape::wide);
  check_op(g, 56, 1.0);
  check_op(h, 57, 1.0);
}

TEST_CASE("embedding: every derivative mode", "[derivatives]") {
  test::OpAdapter<kernels::EmbeddingOp<double>> op(2, 5, 4, 3);
  check_op(op, 60, 1.0);
}

namespace {
// check_op on O as the model uses it, at a small model's sizes (kernels::Ops).
struct CheckAtModelSizes {
  std::uint64_t seed = 70;
  template <class O>
  void operator()() {
    // B = 2 sequences of T = 5, 2 heads of 2 channels, a vocabulary of 7.
    const kernels::OpDims dims{2, 5, 2, 4, 7};
    test::OpAdapter<O> op(O::at(dims, 1));
    check_op(op, seed++, 1.0);
  }
};
}  // namespace

TEST_CASE("every registered op, at a small model's sizes: every derivative mode", "[derivatives]") {
  // A new op in kernels/ops.hpp is checked here with nothing else written.
  STATIC_REQUIRE(kernels::Ops::size >= 6);
  kernels::Ops::for_each<double>(CheckAtModelSizes{});
}
