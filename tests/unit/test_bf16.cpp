// SPDX-License-Identifier: BSD-3-Clause
// bfloat16 rounding against the IEEE definition, and the bf16-amp mode of each
// kernel against its FP32 mode applied to rounded operands.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "kernel_profile.hpp"
#include "kernels/lm_head_xent.hpp"
#include "support/ops.hpp"
#include "support/reference.hpp"

using namespace gnh;

namespace {
float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
}  // namespace

TEST_CASE("bfloat16 rounding: nearest, ties to even, specials", "[bf16]") {
  // Exactly representable values are unchanged.
  for (float x : {0.0f, 1.0f, -2.5f, 1.0f + 0x1p-7f, 3.0e38f * 0 + 0x1p127f}) REQUIRE(bits(round_bf16(x)) == bits(x));
  // Ties: 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7 (odd).
  REQUIRE(round_bf16(1.0f + 0x1p-8f) == 1.0f);
  // 1 + 3*2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  REQUIRE(round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  // Just above and below a tie.
  REQUIRE(round_bf16(from_bits(0x3F808001u)) == from_bits(0x3F810000u));
  REQUIRE(round_bf16(from_bits(0x3F807FFFu)) == from_bits(0x3F800000u));
  REQUIRE(round_bf16(-from_bits(0x3F808001u)) == -from_bits(0x3F810000u));
  // Subnormals round like any other value; the smallest ties go to even (zero).
  REQUIRE(bits(round_bf16(from_bits(0x00008000u))) == 0x00000000u);
  REQUIRE(bits(round_bf16(from_bits(0x00018000u))) == 0x00020000u);
  REQUIRE(bits(round_bf16(from_bits(0x00010001u))) == 0x00010000u);
  REQUIRE(bits(round_bf16(from_bits(0x007FFFFFu))) == 0x00800000u);  // up into the normals
  // Signed zero, infinities, overflow to infinity.
  REQUIRE(bits(round_bf16(-0.0f)) == 0x80000000u);
  REQUIRE(round_bf16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  REQUIRE(round_bf16(-std::numeric_limits<float>::infinity()) == -std::numeric_limits<float>::infinity());
  REQUIRE(round_bf16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  REQUIRE(bits(round_bf16(from_bits(0x7F7F7FFFu))) == 0x7F7F0000u);  // largest finite bf16 stays
  // NaN stays NaN (quiet), including signalling payloads that would round to Inf.
  REQUIRE(std::isnan(round_bf16(from_bits(0x7F800001u))));
  REQUIRE(std::isnan(round_bf16(from_bits(0xFFC00001u))));
  REQUIRE((bits(round_bf16(from_bits(0x7F800001u))) & 0x00400000u) != 0);
  // Every result has the low 16 bits clear and is the nearest bf16: brute force
  // over a sweep of bit patterns against the definition by neighbours.
  for (std::uint32_t b = 0x00000001u; b < 0x7F000000u; b += 0x00013579u) {
    const float x = from_bits(b), r = round_bf16(x);
    REQUIRE((bits(r) & 0xFFFFu) == 0);
    const float lo = from_bits(b & 0xFFFF0000u), hi = from_bits((b & 0xFFFF0000u) + 0x10000u);
    const double dlo = double(x) - double(lo), dhi = double(hi) - double(x);
    if (dlo < dhi) REQUIRE(r == lo);
    else if (dhi < dlo) REQUIRE(r == hi);
    else REQUIRE((bits(r) & 0x10000u) == 0);  // tie: even
  }
}

TEST_CASE("bfloat16 storage: the upper half of the rounded float", "[bf16]") {
  // What cuBLAS reads on tensor cores (kernels/blas.hpp): bf16_bits(x) is
  // round_bf16(x) without its 16 zero bits, so both paths multiply the same values.
  REQUIRE(bf16_bits(1.0f) == 0x3F80u);
  REQUIRE(bf16_bits(-2.5f) == 0xC020u);
  REQUIRE(bf16_bits(1.0f + 3 * 0x1p-8f) == 0x3F82u);  // a tie, to even
  REQUIRE(bf16_bits(from_bits(0x3F808001u)) == 0x3F81u);
  REQUIRE(bf16_bits(std::numeric_limits<float>::max()) == 0x7F80u);   // overflow: +Inf
  REQUIRE((bf16_bits(from_bits(0x7F800001u)) & 0x7FC0u) == 0x7FC0u);  // NaN stays a quiet NaN
  for (std::uint32_t b = 0x00000001u; b < 0xFF000000u; b += 0x000F1357u)
    REQUIRE(std::uint32_t(bf16_bits(from_bits(b))) << 16 == bits(round_bf16(from_bits(b))));
}

namespace {
template <class V>
void round_in_place(const V& v) {
  for (std::size_t i = 0; i < v.size(); ++i) v.data()[i] = round_bf16(v.data()[i]);
}
// n values of ref::random_vec(n, seed) as floats.
View1<float> random_view(const char* name, index_t n, std::uint64_t seed) {
  View1<float> v{std::string(name), std::size_t(n)};
  const auto r = ref::random_vec(std::size_t(n), seed);
  for (index_t i = 0; i < n; ++i) v(i) = float(r[std::size_t(i)]);
  return v;
}
// N rows of cols from base: a value plane, K tangent planes, K second-order planes.
Act2<float> jet_planes(float* base, index_t N, index_t K, index_t cols) {
  Act2<float> a;
  a.v = Span2<float>(base, N, cols);
  a.d = Span3<float>(base + N * cols, K, N, cols);
  a.dd = Span3<float>(base + (1 + K) * N * cols, K, N, cols);
  return a;
}
kernels::GemmPolicy<float> bf16_policy(index_t scratch) {
  kernels::GemmPolicy<float> p;
  p.bf16 = true;
  p.chunk_elements = scratch;  // one chunk: the same GEMM call as the FP32 path
  p.scratch_a = View1<float>("a", scratch);
  p.scratch_b = View1<float>("b", scratch);
  return p;
}
}  // namespace

TEST_CASE("linear and lm head in bf16-amp equal FP32 on rounded operands", "[bf16]") {
  const index_t N = 13, in = 11, out = 7, V = 17;
  const auto pol = bf16_policy(1 << 16);
  for (const char* mode : {"primal", "tangent", "second"}) {
    CAPTURE(mode);
    test::Buf<float> x(N, in), y(N, out), yr(N, out);
    test::Flat<float> p(out * in + out);
    const auto xv = ref::random_vec(N * in, 1), xd = ref::random_vec(N * in, 2),
               pv = ref::random_vec(out * in + out, 3);
    const auto pd = ref::random_vec(out * in + out, 4);
    for (index_t i = 0; i < N * in; ++i) {
      x.v(i) = float(xv[i]);
      x.d(i) = float(xd[i]);
      x.dd(i) = float(xd[i] * 0.5);
    }
    for (index_t i = 0; i < out * in + out; ++i) {
      p.v(i) = float(pv[i]);
      p.d(i) = float(pd[i]);
    }
    auto run = [&](const test::Buf<float>& yy, const test::Buf<float>& xx, const test::Flat<float>& pp,
                   const kernels::GemmPolicy<float>& pl) {
      const std::string m = mode;
      if (m == "primal")
        kernels::linear_forward<float>(ExecSpace(), yy.act<float>(), xx.act<float>(), pp.params<float>(), 0, out * in,
                                       pl);
      else if (m == "tangent")
        kernels::linear_forward<Dual<float>>(ExecSpace(), yy.act<Dual<float>>(), xx.act<Dual<float>>(),
                                             pp.params<Dual<float>>(), 0, out * in, pl);
      else
        kernels::linear_forward<Jet2<float>>(ExecSpace(), yy.act<Jet2<float>>(), xx.act<Jet2<float>>(),
                                             pp.params<Jet2<float>>(), 0, out * in, pl);
    };
    run(y, x, p, pol);
    // FP32 on rounded operands: the bias is not a multiply operand and stays.
    test::Buf<float> xr(N, in);
    test::Flat<float> prr(out * in + out);
    for (index_t i = 0; i < N * in; ++i) {
      xr.v(i) = round_bf16(x.v(i));
      xr.d(i) = round_bf16(x.d(i));
      xr.dd(i) = round_bf16(x.dd(i));
    }
    for (index_t i = 0; i < out * in + out; ++i) {
      prr.v(i) = i < out * in ? round_bf16(p.v(i)) : p.v(i);
      prr.d(i) = i < out * in ? round_bf16(p.d(i)) : p.d(i);
    }
    run(yr, xr, prr, kernels::GemmPolicy<float>());
    for (index_t i = 0; i < N * out; ++i) {
      REQUIRE(y.v(i) == yr.v(i));
      if (std::string(mode) != "primal") REQUIRE(y.d(i) == yr.d(i));
      if (std::string(mode) == "second") REQUIRE(y.dd(i) == yr.dd(i));
    }
    // And it differs from plain FP32 (the rounding is real).
    test::Buf<float> yf(N, out);
    run(yf, x, p, kernels::GemmPolicy<float>());
    double diff = 0;
    for (index_t i = 0; i < N * out; ++i) diff = std::max(diff, double(std::abs(yf.v(i) - y.v(i))));
    REQUIRE(diff > 1e-4);
  }
  // The fused head: loss rows equal FP32 on rounded h and W.
  test::OpAdapter<kernels::LmHeadXentOp<float>> op(N, in, V, N);
  test::Buf<float> h(N, in), loss(N, 1), loss_r(N, 1);
  test::Flat<float> w(V * in);
  const auto hv = ref::random_vec(N * in, 5), wv = ref::random_vec(V * in, 6);
  for (index_t i = 0; i < N * in; ++i) h.v(i) = float(hv[i]);
  for (index_t i = 0; i < V * in; ++i) w.v(i) = float(wv[i]);
  View1<double> l1("l1", N), l2("l2", N);
  kernels::lm_head_xent_forward<float>(ExecSpace(), Act1<double>{l1, {}, {}}, op.saved[0].act1<float>(), h.act<float>(),
                                       w.params<float>(), 0, V, op.kernel.targets, op.saved[1].act<float>(),
                                       op.kernel.stats, op.saved[2].act<float>(), pol);
  round_in_place(h.v);
  round_in_place(w.v);
  kernels::lm_head_xent_forward<float>(ExecSpace(), Act1<double>{l2, {}, {}}, op.saved[0].act1<float>(), h.act<float>(),
                                       w.params<float>(), 0, V, op.kernel.targets, op.saved[1].act<float>(),
                                       op.kernel.stats, op.saved[2].act<float>());
  for (index_t n = 0; n < N; ++n) REQUIRE(l1(n) == l2(n));
}

namespace pairs_test {  // named: nvcc wants extended lambdas in functions with external linkage
// The second-order head forward (K directions) under bf16-amp, the
// direction blocks as the layer rounds them or in pair blocks with the
// weights (GemmPolicy::head_pairs): the losses' planes and lse's, all
// values.
std::vector<double> head_second_order(index_t N, index_t C, index_t V, index_t K, index_t rows, index_t vchunk,
                                      bool pairs) {
  using T = float;
  std::mt19937 g(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  View1<T> hv("hv", N * C), hd("hd", K * N * C), hdd("hdd", K * N * C), pv("pv", V * C), pd("pd", K * V * C);
  for (View1<T> x : {hv, hd, hdd, pv, pd})
    for (std::size_t i = 0; i < x.extent(0); ++i) x(i) = u(g);
  Act2<T> h;
  h.v = Span2<T>(hv.data(), N, C);
  h.d = Span3<T>(hd.data(), K, N, C);
  h.dd = Span3<T>(hdd.data(), K, N, C);
  const Params<T> p{Span1<const T>(pv.data(), V * C), Span2<const T>(pd.data(), K, V * C)};
  View1<double> lv("lv", N), ld("ld", K * N), ldd("ldd", K * N);
  View1<T> ev("ev", N), ed("ed", K * N), edd("edd", K * N);
  const Act1<double> loss{lv, Span2<double>(ld.data(), K, N), Span2<double>(ldd.data(), K, N)};
  const Act1<T> lse{ev, Span2<T>(ed.data(), K, N), Span2<T>(edd.data(), K, N)};
  View1<T> zv("zv", rows * vchunk), zd("zd", K * rows * vchunk), zdd("zdd", rows * vchunk), mv("mv", rows * C),
      md("md", K * rows * C);
  Act2<T> z, m;
  z.v = Span2<T>(zv.data(), rows, vchunk);
  z.d = Span3<T>(zd.data(), K, rows, vchunk);
  z.dd = Span3<T>(zdd.data(), 1, rows, vchunk);
  m.v = Span2<T>(mv.data(), rows, C);
  m.d = Span3<T>(md.data(), K, rows, C);
  View2<T> stats("stats", N, 2);
  View1<std::int32_t> targets("targets", N);
  for (index_t n = 0; n < N; ++n) targets(n) = n % 5 == 4 ? -1 : std::int32_t((7 * n + 2) % V);
  kernels::GemmPolicy<T> pol;
  pol.bf16 = true;
  pol.chunk_elements = 1 << 12;
  pol.scratch_a = View1<T>("a", 1 << 16);
  pol.scratch_b = View1<T>("b", 1 << 16);
  View1<kernels::Bf16Storage<T>> blocks("pairs", ((K + 1) / 2) * V * 3 * C);
  if (pairs) {
    kernels::detail::head_pair_blocks<T>(ExecSpace(), pv.data(), pd.data(), K, V, C, V * C, blocks.data());
    pol.head_pairs = blocks.data();
    pol.head_vocab = V;
  }
  kernels::lm_head_xent_forward<Jet2<T>>(ExecSpace(), loss, lse, h, p, 0, V, Span1<const std::int32_t>(targets), z,
                                         stats, m, pol);
  ExecSpace().fence();
  std::vector<double> out;
  for (View1<double> x : {lv, ld, ldd})
    for (std::size_t i = 0; i < x.extent(0); ++i) out.push_back(x(i));
  for (View1<T> x : {ev, ed, edd})
    for (std::size_t i = 0; i < x.extent(0); ++i) out.push_back(double(x(i)));
  return out;
}
}  // namespace pairs_test

TEST_CASE("bf16-amp LM head: a direction's tangent logits in one product from the pair blocks", "[bf16]") {
  // z'_k = h'_k W^T + h V_k^T as [h | h'_k] [V_k | W]^T (k even) or
  // [h'_k | h] [W | V_k]^T (k odd) over an inner dimension of 2C, from pair
  // blocks [V_2j | W | V_2j+1] rounded once: the same bfloat16 products as
  // the two GEMMs, summed in another order. K = 3 (a pair without its odd
  // direction), tiles of 3 of 7 rows, the whole vocabulary or chunks of 5.
  // With the pairs the row kernel also writes the exponentials rounded for
  // the moments' products (HeadChunkRow::q_out) where apart they are
  // written in FP32 and rounded by the product: the same bfloat16 values.
  // A logit is a sum of 2C products of bfloat16 values in FP32: the two
  // orders differ by a few C eps |terms|; a loss or lse plane adds a sum
  // over V such values and their squares, so they agree within
  // 8 (2C + V) eps (|x| + 1). A direction paired with the wrong block, a
  // swapped half or a wrong stride is O(1) off.
  const index_t N = 7, C = 6, V = 11, K = 3;
  for (const index_t vchunk : {V, index_t(5)}) {
    CAPTURE(vchunk);
    const auto apart = pairs_test::head_second_order(N, C, V, K, 3, vchunk, false);
    const auto paired = pairs_test::head_second_order(N, C, V, K, 3, vchunk, true);
    REQUIRE(apart.size() == paired.size());
    const double tol = 8.0 * double(2 * C + V) * std::numeric_limits<float>::epsilon();
    for (std::size_t i = 0; i < apart.size(); ++i) {
      INFO("value " << i << ": apart " << apart[i] << ", paired " << paired[i]);
      REQUIRE(std::isfinite(paired[i]));
      REQUIRE(std::fabs(apart[i] - paired[i]) <= tol * (std::fabs(apart[i]) + 1.0));
    }
  }
}

TEST_CASE("bf16-amp batches: each operand rounded once per group, the bits of one product at a time", "[bf16]") {
  // gemm_batched rounds each operand once per chunk of rows for a group of
  // products (a shared one once, strided ones side by side in scratch)
  // instead of once per product. Every combination the model uses, and the
  // rest: op(A) = A with op(B) = B or B^T, and op(A) = A^T (the weight
  // tangents' dy'_k^T x and dy^T x'_k), each with A and B shared (stride 0) or
  // strided. The scratch here forces chunks of 3 rows and groups of 2, 2 and
  // 1 wherever an operand is strided; every product must equal the
  // per-product bf16 gemm with the same chunks bit for bit (op(A) = A^T
  // accumulates over the chunks, so the chunks must be the same), and the
  // gaps between the products stay as they were. (The bits are the host
  // emulation's promise; on CUDA cuBLAS may choose other kernels for a batch
  // than for one product, and the GPU check validates at tolerance.)
  const index_t R = 13, k = 11, n = 7, count = 5;
  const index_t gap = 4, sa = R * k + 3, sb = k * n + 3;  // strides with gaps
  std::vector<float> A(count * sa), B(count * std::max(sb, R * n + 3));
  const auto ra = ref::random_vec(A.size(), 11), rb = ref::random_vec(B.size(), 12);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = float(ra[i]);
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = float(rb[i]);
  struct Case {
    const char *ta, *tb;
  };
  for (const Case c : {Case{"N", "N"}, Case{"N", "T"}, Case{"T", "N"}})
    for (const bool a_strided : {false, true})
      for (const bool b_strided : {false, true}) {
        CAPTURE(c.ta, c.tb, a_strided, b_strided);
        const bool at = c.ta[0] == 'T', bt = c.tb[0] == 'T';
        // op(A) = A: A (R, k), B (k, n) or (n, k), C (R, n). op(A) = A^T: A
        // (R, k), B (R, n), C (k, n), the contraction over R rows.
        const index_t brows = at ? R : bt ? n : k, bcols = at ? n : bt ? k : n;
        const index_t m = at ? k : R, bstride = b_strided ? brows * bcols + 3 : 0;
        const index_t astride = a_strided ? sa : 0, sc = m * n + gap;
        const Span2<const float> As(A.data(), R, k), Bs(B.data(), brows, bcols);
        std::vector<float> C(count * sc);
        const auto rc = ref::random_vec(C.size(), 13);
        for (std::size_t i = 0; i < C.size(); ++i) C[i] = float(rc[i]);
        // Chunks of 3 rows (chunk_elements over the wider of A's and B's
        // rows); scratch for two products' chunks (and two whole B for op(A) = A).
        kernels::GemmPolicy<float> pol = bf16_policy(3 * std::max(k, bcols));
        pol.scratch_a = View1<float>("a", 2 * 3 * k);
        pol.scratch_b = View1<float>("b", at ? 2 * 3 * bcols : 2 * brows * bcols + 3);
        const auto groups = kernels::detail::bf16_groups<float>(pol, at, As, astride, Bs, bstride, count, false);
        REQUIRE(groups.chunk == 3);
        REQUIRE(groups.group == (a_strided || b_strided ? 2 : count));
        kernels::GemmPolicy<float> one = bf16_policy(3 * std::max(k, bcols));
        one.scratch_a = View1<float>("a", 1 << 12);
        one.scratch_b = View1<float>("b", 1 << 12);
        std::vector<float> got = C, want = C;
        kernels::gemm_batched<float>(ExecSpace(), pol, c.ta, c.tb, 1.5f, As, astride, Bs, bstride, 0.5f,
                                     Span2<float>(got.data(), m, n), sc, count);
        for (index_t i = 0; i < count; ++i)
          kernels::gemm<float>(ExecSpace(), one, c.ta, c.tb, 1.5f, Span2<const float>(A.data() + i * astride, R, k),
                               Span2<const float>(B.data() + i * bstride, brows, bcols), 0.5f,
                               Span2<float>(want.data() + i * sc, m, n));
        Kokkos::fence();
        REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        for (index_t i = 0; i < count; ++i)
          for (index_t g = m * n; g < sc; ++g) REQUIRE(got[i * sc + g] == C[i * sc + g]);
        // B rounded ahead (GemmPolicy::ahead, a block of B's layout holding
        // its rounded values) gives the same bits and is where B is read:
        // with zeros there, the products are beta C exactly.
        kernels::GemmPolicy<float> ahead = pol;
        // The blocks of B_i (size brows bcols, bstride apart) side by side.
        const index_t blocks = b_strided ? count : 1, size = brows * bcols;
        std::vector<float> rounded(blocks * size), zeros(blocks * size, 0.0f);
        for (index_t j = 0; j < blocks; ++j)
          for (index_t o = 0; o < size; ++o) rounded[j * size + o] = round_bf16(B[j * bstride + o]);
        ahead.ahead[1] = {B.data(), size, blocks, bstride, rounded.data()};
        std::vector<float> via = C;
        kernels::gemm_batched<float>(ExecSpace(), ahead, c.ta, c.tb, 1.5f, As, astride, Bs, bstride, 0.5f,
                                     Span2<float>(via.data(), m, n), sc, count);
        ahead.ahead[1].dst = zeros.data();
        std::vector<float> zero = C;
        kernels::gemm_batched<float>(ExecSpace(), ahead, c.ta, c.tb, 1.5f, As, astride, Bs, bstride, 0.5f,
                                     Span2<float>(zero.data(), m, n), sc, count);
        Kokkos::fence();
        REQUIRE(std::memcmp(via.data(), got.data(), got.size() * sizeof(float)) == 0);
        for (index_t i = 0; i < count; ++i)
          for (index_t e = 0; e < m * n; ++e) REQUIRE(zero[i * sc + e] == 0.5f * C[i * sc + e]);
        // A block that does not hold every B_i (one block fewer) is not used
        // (its zeros would show).
        if (b_strided) {
          ahead.ahead[1].count = count - 1;
          std::vector<float> partial = C;
          kernels::gemm_batched<float>(ExecSpace(), ahead, c.ta, c.tb, 1.5f, As, astride, Bs, bstride, 0.5f,
                                       Span2<float>(partial.data(), m, n), sc, count);
          Kokkos::fence();
          REQUIRE(std::memcmp(partial.data(), got.data(), got.size() * sizeof(float)) == 0);
        }
        // One product (gemm) reads B there too.
        std::vector<float> single(want.begin(), want.begin() + m * n), one_ahead(C.begin(), C.begin() + m * n);
        kernels::GemmPolicy<float> one_pol = one;
        one_pol.ahead[0] = {B.data(), size, 1, 0, rounded.data()};
        kernels::gemm<float>(ExecSpace(), one_pol, c.ta, c.tb, 1.5f, As, Bs, 0.5f,
                             Span2<float>(one_ahead.data(), m, n));
        Kokkos::fence();
        REQUIRE(std::memcmp(one_ahead.data(), single.data(), single.size() * sizeof(float)) == 0);
        // The rounding is real: plain FP32 products differ.
        std::vector<float> fp = C;
        kernels::gemm_batched<float>(ExecSpace(), kernels::GemmPolicy<float>(), c.ta, c.tb, 1.5f, As, astride, Bs,
                                     bstride, 0.5f, Span2<float>(fp.data(), m, n), sc, count);
        Kokkos::fence();
        REQUIRE(std::memcmp(got.data(), fp.data(), got.size() * sizeof(float)) != 0);
      }
}

TEST_CASE("bf16-amp: a linear layer's input rounded once for all its products, the same bits", "[bf16]") {
  // With directions and room (GemmPolicy::layer_input), linear_forward
  // rounds x, and with second order x', once: x W^T and x V_k^T read the one
  // copy of x, x' W^T and 2 x' V_k^T the one of x' (its K planes one block,
  // read at a stride by the batch), in one product each where B is shared or
  // rounded ahead. The same bfloat16 values, so the bits of each product
  // rounding its own operands in chunks of 4 rows; and fewer bytes copied.
  const index_t N = 9, in = 6, out = 5, K = 3, P = out * in + out + 7;
  const View1<float> xs = random_view("x", (1 + 2 * K) * N * in, 31), pv = random_view("p", P, 32),
                     pd = random_view("pd", K * P, 33);
  auto planes = [&](float* base, index_t cols) { return jet_planes(base, N, K, cols); };
  const Params<float> p{Span1<const float>(pv.data(), P), Span2<const float>(pd.data(), K, P)};
  kernels::GemmPolicy<float> own = bf16_policy(1 << 12);
  own.chunk_elements = 4 * in;
  kernels::GemmPolicy<float> room = own;
  room.layer_input = View1<float>("room", (1 + K) * N * in);
  for (const bool second : {false, true})
    for (const bool x_second : {true, false}) {
      if (!second && !x_second) continue;
      CAPTURE(second, x_second);
      double bytes[2] = {0, 0};
      std::vector<float> y[2];
      for (int r = 0; r < 2; ++r) {
        View1<float> ys("y", (1 + 2 * K) * N * out);
        const auto run = perf::record_run([&] {
          if (second)
            kernels::linear_forward<Jet2<float>>(ExecSpace(), planes(ys.data(), out), planes(xs.data(), in), p, 0,
                                                 out * in, r ? room : own, x_second);
          else
            kernels::linear_forward<Dual<float>>(ExecSpace(), planes(ys.data(), out), planes(xs.data(), in), p, 0,
                                                 out * in, r ? room : own);
        });
        bytes[r] = run.work.labels.at("gnh::gemm::round_bf16").total_bytes();
        y[r].assign(ys.data(), ys.data() + ys.extent(0));
      }
      REQUIRE(std::memcmp(y[0].data(), y[1].data(), y[0].size() * sizeof(float)) == 0);
      // x (and x') copied once instead of by each of their two products.
      CAPTURE(bytes[0], bytes[1]);
      REQUIRE(bytes[1] < bytes[0]);
      if (!second || x_second) continue;
      // With a cut, x and x' rounded by the kernel that produced them into
      // the room (rounded_input_room; here the values written as such a
      // kernel writes them): the products read them there, round no x, and
      // y keeps its bits.
      const auto r = kernels::detail::rounded_input_room(room, planes(xs.data(), in), K);
      REQUIRE(r.dst != nullptr);
      for (index_t i = 0; i < (1 + K) * N * in; ++i) r.dst[i] = round_bf16(xs(i));
      View1<float> ys("y", (1 + 2 * K) * N * out);
      const auto run = perf::record_run([&] {
        kernels::linear_forward<Jet2<float>>(ExecSpace(), planes(ys.data(), out), planes(xs.data(), in), p, 0, out * in,
                                             r.pol, false);
      });
      // (The weights and directions are still rounded by their products.)
      REQUIRE(run.work.labels.at("gnh::gemm::round_bf16").total_bytes() < bytes[1]);
      REQUIRE(std::memcmp(y[0].data(), ys.data(), y[0].size() * sizeof(float)) == 0);
      // Without room for 1 + K planes, none.
      REQUIRE(kernels::detail::rounded_input_room(own, planes(xs.data(), in), K).dst == nullptr);
    }
  // Too little room is a logic error naming the layer's input, not a quiet overrun.
  kernels::GemmPolicy<float> small = room;
  small.layer_input = View1<float>("small", N * in);
  View1<float> ys("y", (1 + 2 * K) * N * out);
  REQUIRE_THROWS_WITH(kernels::linear_forward<Jet2<float>>(ExecSpace(), planes(ys.data(), out), planes(xs.data(), in),
                                                           p, 0, out * in, small),
                      Catch::Contains("rounded input"));
}

TEST_CASE("bf16-amp: a linear layer's second order with a cut as pair products from pair blocks", "[bf16]") {
  // With a cut at its input (x'' = 0) and x, x' in the room's pair blocks
  // (RoomLayout: [x'_2j+1 | x | x'_2j]) and W, V_k in pair blocks
  // [V_2j | W | V_2j+1] (head_pair_blocks), y'_k is one product over both,
  // [x | x'_k] [V_k | W]^T or [x'_k | x] [W | V_k]^T, y = x W^T and
  // y''_k = 2 x'_k V_k^T from the blocks: the same bfloat16 products as the
  // room's standard layout (rounded_input_room without pairs), summed in
  // another order. An entry is an FP32 sum of at most 2 in products: each
  // order is within 2 in eps of the sum of their magnitudes |t|, so the two
  // agree within 4 in eps |t| + the bias's rounding (eps |y|). K = 3: the
  // last pair has no odd direction. A direction paired with the wrong block,
  // a swapped half or a wrong stride is off by O(|t|).
  const index_t N = 9, in = 6, out = 5, K = 3, P = out * in + out + 7, pairs = (K + 1) / 2;
  const View1<float> xs = random_view("x", (1 + 2 * K) * N * in, 41), pv = random_view("p", P, 42),
                     pd = random_view("pd", K * P, 43);
  auto planes = [&](float* base, index_t cols) { return jet_planes(base, N, K, cols); };
  const Params<float> p{Span1<const float>(pv.data(), P), Span2<const float>(pd.data(), K, P)};
  const Act2<float> x = planes(xs.data(), in);
  // The standard layout: x, then each x'_k, as a norm with a cut writes them.
  kernels::GemmPolicy<float> standard = bf16_policy(1 << 12);
  standard.layer_input = View1<float>("room", (1 + K) * N * in);
  const auto rs = kernels::detail::rounded_input_room(standard, x, K);
  REQUIRE(rs.dst != nullptr);
  REQUIRE(rs.pol.input_pairs == nullptr);
  for (index_t i = 0; i < (1 + K) * N * in; ++i) rs.dst[i] = kernels::bf16_stored(xs(i));
  View1<float> y0("y0", (1 + 2 * K) * N * out), y1("y1", (1 + 2 * K) * N * out);
  const auto run0 = perf::record_run([&] {
    kernels::linear_forward<Jet2<float>>(ExecSpace(), planes(y0.data(), out), x, p, 0, out * in, rs.pol, false);
  });
  // The pair blocks: the standard layout's room holds too few values.
  REQUIRE(kernels::detail::rounded_input_room(standard, x, K, true).dst == nullptr);
  kernels::GemmPolicy<float> paired = standard;
  paired.layer_input = View1<float>("pairs", 3 * pairs * N * in);
  const auto rp = kernels::detail::rounded_input_room(paired, x, K, true);
  REQUIRE(rp.dst != nullptr);
  REQUIRE(rp.pol.input_pairs == rp.dst);
  REQUIRE(rp.layout.pairs == pairs);
  for (index_t n = 0; n < N; ++n)
    for (index_t c = 0; c < in; ++c) {
      for (index_t j = 0; j < rp.layout.copies(); ++j)
        rp.dst[rp.layout.value(n, c, j)] = kernels::bf16_stored(x.v(n, c));
      for (index_t k = 0; k < K; ++k) rp.dst[rp.layout.direction(k, n, c)] = kernels::bf16_stored(x.d(k, n, c));
    }
  View1<kernels::Bf16Storage<float>> wp("weight_pairs", 3 * pairs * out * in);
  kernels::detail::head_pair_blocks<float>(ExecSpace(), pv.data(), pd.data(), K, out, in, P, wp.data());
  kernels::GemmPolicy<float> pol = rp.pol;
  // Without the weight's pair blocks, a logic error rather than a read of x
  // where it does not lie.
  REQUIRE_THROWS_WITH(
      kernels::linear_forward<Jet2<float>>(ExecSpace(), planes(y1.data(), out), x, p, 0, out * in, pol, false),
      Catch::Contains("pair blocks"));
  pol.weight_pairs = wp.data();
  const auto run1 = perf::record_run([&] {
    kernels::linear_forward<Jet2<float>>(ExecSpace(), planes(y1.data(), out), x, p, 0, out * in, pol, false);
  });
  // The bound's |t|, per plane (0: y, 1: y'_k, 2: y''_k), row and column.
  auto r = [](float v) { return double(round_bf16(v)); };
  const double eps = std::numeric_limits<float>::epsilon();
  const Act2<float> a0 = planes(y0.data(), out), a1 = planes(y1.data(), out);
  for (index_t kind = 0; kind < 3; ++kind)
    for (index_t k = 0; k < (kind == 0 ? 1 : K); ++k)
      for (index_t n = 0; n < N; ++n)
        for (index_t o = 0; o < out; ++o) {
          double t = 0;
          for (index_t i = 0; i < in; ++i) {
            const double W = r(pv(o * in + i)), V = r(pd(k * P + o * in + i));
            if (kind == 0) t += std::abs(r(x.v(n, i)) * W);
            if (kind == 1) t += std::abs(r(x.d(k, n, i)) * W) + std::abs(r(x.v(n, i)) * V);
            if (kind == 2) t += 2 * std::abs(r(x.d(k, n, i)) * V);
          }
          const float u = kind == 0 ? a0.v(n, o) : kind == 1 ? a0.d(k, n, o) : a0.dd(k, n, o);
          const float w = kind == 0 ? a1.v(n, o) : kind == 1 ? a1.d(k, n, o) : a1.dd(k, n, o);
          CAPTURE(kind, k, n, o, u, w, t);
          REQUIRE(std::isfinite(w));
          REQUIRE(std::abs(double(u) - double(w)) <= 4 * in * eps * t + eps * std::abs(double(u)));
        }
  // Nothing rounded by the products, and each y'_k written once: fewer bytes
  // of results than x'_k W^T written and x V_k^T reading and writing y'_k.
  REQUIRE(run1.work.labels.count("gnh::gemm::round_bf16") == 0);
  auto gemm_bytes = [](const perf::RecordedRun& rr) {
    double b = 0;
    for (const char* l : {"gnh::gemm", "gnh::gemm_batch"})
      if (rr.work.labels.count(l)) b += rr.work.labels.at(l).total_bytes();
    return b;
  };
  CAPTURE(gemm_bytes(run0), gemm_bytes(run1));
  REQUIRE(gemm_bytes(run1) < gemm_bytes(run0));
}

TEST_CASE("bf16-amp: a linear layer's adjoint and input rounded once in its reverse, the same bits", "[bf16]") {
  // With room (GemmPolicy::layer_input of N (out + in)), linear_reverse
  // rounds dy and x once: dx = dy W, dW += dy^T x (a summed gradient, one
  // per sequence of 3 rows, or none), and with directions dy V_k and
  // dy^T x'_k read the copies. The same bfloat16 values in the products'
  // own chunks of 4 rows (dW accumulates over them), so every output has the
  // bits of each product rounding its own operands; and fewer bytes copied.
  // Without g, x is not rounded (no product reads it). Too little room:
  // each product rounds its own, as without room.
  const index_t N = 9, in = 6, out = 5, K = 2, P = out * in + out + 7, R = 3;
  const View1<float> xs = random_view("x", (1 + K) * N * in, 41), dys = random_view("dy", (1 + K) * N * out, 42),
                     pv = random_view("p", P, 43), pd = random_view("pd", K * P, 44);
  auto planes = [&](float* base, index_t cols) {
    Act2<float> a;
    a.v = Span2<float>(base, N, cols);
    a.d = Span3<float>(base + N * cols, K, N, cols);
    return a;
  };
  const Params<float> p{Span1<const float>(pv.data(), P), Span2<const float>(pd.data(), K, P)};
  kernels::GemmPolicy<float> own = bf16_policy(1 << 12);
  own.chunk_elements = 4 * in;
  own.single_chunk_elements = 4 * in;
  kernels::GemmPolicy<float> room = own, small = own;
  room.layer_input = View1<float>("room", N * (in + out));
  small.layer_input = View1<float>("small", N * (in + out) - 1);
  enum class G { summed, per_sequence, none };
  for (const bool tangents : {false, true})
    for (const G gm : {G::summed, G::per_sequence, G::none}) {
      if (tangents && gm != G::summed) continue;  // directions take a summed gradient
      CAPTURE(tangents, int(gm));
      double bytes[3] = {0, 0, 0};
      std::vector<float> out_[3];
      for (int r = 0; r < 3; ++r) {
        const index_t sequences = gm == G::per_sequence ? N / R : 1;
        View1<float> dxs("dx", (1 + K) * N * in), gv("g", sequences * P), gd("gd", K * P);
        Grads<float> g{Span1<float>(gv.data(), gm == G::none ? 0 : sequences * P), {}};
        if (gm == G::per_sequence) g.seq_rows = R, g.seq_stride = P;
        if (tangents) g.d = Span2<float>(gd.data(), K, P);
        const kernels::GemmPolicy<float>& pol = r == 0 ? own : r == 1 ? room : small;
        const auto run = perf::record_run([&] {
          if (tangents)
            kernels::linear_reverse<Dual<float>>(ExecSpace(), planes(dxs.data(), in), g, planes(dys.data(), out),
                                                 planes(xs.data(), in), p, 0, out * in, pol);
          else
            kernels::linear_reverse<float>(ExecSpace(), planes(dxs.data(), in), g, planes(dys.data(), out),
                                           planes(xs.data(), in), p, 0, out * in, pol);
        });
        bytes[r] = run.work.labels.at("gnh::gemm::round_bf16").total_bytes();
        out_[r].assign(dxs.data(), dxs.data() + dxs.extent(0));
        out_[r].insert(out_[r].end(), gv.data(), gv.data() + gv.extent(0));
        out_[r].insert(out_[r].end(), gd.data(), gd.data() + gd.extent(0));
      }
      REQUIRE(std::memcmp(out_[0].data(), out_[1].data(), out_[0].size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(out_[0].data(), out_[2].data(), out_[0].size() * sizeof(float)) == 0);
      CAPTURE(bytes[0], bytes[1], bytes[2]);
      // dy once instead of by dx's and dW's products (and x once, not again
      // by a direction's product); no room: as without.
      if (gm == G::none && !tangents) REQUIRE(bytes[1] == bytes[0]);  // dy read by dx's product alone
      else REQUIRE(bytes[1] < bytes[0]);
      REQUIRE(bytes[2] == bytes[0]);
    }
}

TEST_CASE("bf16-amp library calls: one per chunk, counted as the entry point's launches", "[bf16]") {
  // Under bf16-amp a GEMM entry point is a library call per chunk of rows
  // (gemm) or per chunk of a group (gemm_batched); the launch profile counts
  // those calls, not one per entry point. A product alone
  // (single_chunk_elements) takes larger chunks with the same bits: op(A) = A
  // cuts C's rows, and each row depends on its row of A alone.
  const index_t R = 100, k = 8, n = 6, count = 3;
  std::vector<float> A(count * R * k), B(k * n);
  const auto ra = ref::random_vec(A.size(), 21), rb = ref::random_vec(B.size(), 22);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = float(ra[i]);
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = float(rb[i]);
  const Span2<const float> As(A.data(), R, k), Bs(B.data(), k, n);
  auto launches = [](const perf::RecordedRun& run, const std::string& label) {
    long l = -1;
    for (const auto& t : run.labels) {
      REQUIRE(t.label != kernels::detail::kLibraryCall);  // counted in its entry point, not a label
      if (t.label == label) l = t.device_launches;
    }
    return l;
  };
  // Chunks of 160 elements over the wider of A's 8 and B's 6 columns: 20
  // rows, 5 chunks of the 100 rows; alone, 800 elements: one call.
  kernels::GemmPolicy<float> pol = bf16_policy(1 << 12);
  pol.chunk_elements = 160;
  for (const index_t single : {index_t(0), index_t(800)}) {
    CAPTURE(single);
    pol.single_chunk_elements = single;
    std::vector<float> C(R * n, 0.0f);
    const auto run = perf::record_run(
        [&] { kernels::gemm<float>(ExecSpace(), pol, "N", "N", 1.0f, As, Bs, 0.0f, Span2<float>(C.data(), R, n)); });
    REQUIRE(launches(run, "gnh::gemm") == (single ? 1 : 5));
    // A rounded per chunk, B once.
    REQUIRE(launches(run, "gnh::gemm::round_bf16") == (single ? 2 : 6));
    kernels::GemmPolicy<float> whole = bf16_policy(1 << 12);
    std::vector<float> W(R * n, 0.0f);
    kernels::gemm<float>(ExecSpace(), whole, "N", "N", 1.0f, As, Bs, 0.0f, Span2<float>(W.data(), R, n));
    Kokkos::fence();
    REQUIRE(std::memcmp(C.data(), W.data(), C.size() * sizeof(float)) == 0);
  }
  // A batch of 3 strided A over a shared B: the scratch holds two products'
  // chunks, so groups of 2 and 1, each 5 chunks: 10 calls. A batch is not a
  // product alone: single_chunk_elements does not apply.
  pol.scratch_a = View1<float>("a", 2 * 20 * k);
  std::vector<float> C(count * R * n, 0.0f);
  const auto run = perf::record_run([&] {
    kernels::gemm_batched<float>(ExecSpace(), pol, "N", "N", 1.0f, As, R * k, Bs, 0, 0.0f, Span2<float>(C.data(), R, n),
                                 R * n, count);
  });
  REQUIRE(launches(run, "gnh::gemm_batch") == 10);
}

TEST_CASE("attention in bf16-amp rounds q, k, v and p, keeping scores and softmax in FP32", "[bf16]") {
  // In both shapes of the portable kernels: the host rows, and the GPU's
  // flash-style tiles (Tc = 19 crosses their teams of 8 rows and tiles of 16
  // keys), whose bf16 forward walks the keys' tiles three times.
  for (const kernels::RowShape shape : {kernels::RowShape::host, kernels::RowShape::teams}) {
    CAPTURE(int(shape));
    const index_t B = 2, Tc = 19, H = 3, hs = 4, C = H * hs, N = B * Tc;
    test::OpAdapter<kernels::AttentionOp<float>> op(B, Tc, int(H), hs);
    test::Buf<float> x(N, 3 * C), y(N, C);
    const auto q = ref::random_vec(N * 3 * C, 8, 1.3);
    for (index_t i = 0; i < N * 3 * C; ++i) x.v(i) = float(q[i]);
    kernels::attention_forward<float>(ExecSpace(), y.act<float>(), op.saved[0].act1<float>(), x.act<float>(), B, Tc,
                                      int(H),
                                      /*bf16=*/true, shape);
    // Reference in double on the rounded operands, with p rounded after normalisation.
    auto r = [&](index_t n, index_t c) { return double(round_bf16(x.v(n * 3 * C + c))); };
    double worst = 0;
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t t = 0; t < Tc; ++t) {
          std::vector<double> s(t + 1);
          double m = -INFINITY, z = 0;
          for (index_t u = 0; u <= t; ++u) {
            double d = 0;
            for (index_t k = 0; k < hs; ++k) d += r(b * Tc + t, h * hs + k) * r(b * Tc + u, C + h * hs + k);
            s[u] = d / std::sqrt(double(hs));
            m = std::max(m, s[u]);
          }
          for (double e : s) z += std::exp(e - m);
          for (index_t k = 0; k < hs; ++k) {
            double acc = 0;
            for (index_t u = 0; u <= t; ++u)
              acc += double(round_bf16(float(std::exp(s[u] - m) / z))) * r(b * Tc + u, 2 * C + h * hs + k);
            worst = std::max(worst, std::abs(acc - double(y.v((b * Tc + t) * C + h * hs + k))));
          }
        }
    // FP32 arithmetic on the same operands: a few float eps, except where p sits
    // on a bfloat16 rounding boundary (one bf16 ulp of p, 2^-8, times |v| <= 5).
    INFO("largest deviation " << worst);
    REQUIRE(worst <= 0.02);
    double mean_dev = 0;
    test::Buf<float> y32(N, C);
    kernels::attention_forward<float>(ExecSpace(), y32.act<float>(), op.saved[0].act1<float>(), x.act<float>(), B, Tc,
                                      int(H), false, shape);
    for (index_t i = 0; i < N * C; ++i) mean_dev += std::abs(double(y32.v(i)) - double(y.v(i)));
    REQUIRE(mean_dev / double(N * C) > 1e-4);  // the bf16 mode is not the FP32 mode
  }
}
