// SPDX-License-Identifier: BSD-3-Clause
// Attention as batched GEMMs and row kernels (attention_batched.hpp), the GPU's
// path run on the host, against the portable row kernels in double on the
// same inputs: every mode (forward, tangent, second order with and without
// x'', reverse, tangent of the reverse), every layout (nanoGPT's fused q|k|v,
// grouped-query, GPT-NeoX's interleaved heads, three buffers), in float and
// double, with the sequences in chunks that do not divide the batch. Its bits
// do not depend on the chunk size or on a second run.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/attention_batched.hpp"
#include "kernels/attention_fused.hpp"
#include "kernels/gemm_ledger.hpp"

using namespace gnh;
using namespace gnh::kernels;

namespace {

constexpr index_t B = 3, Tc = 13, K = 3;

// One activation with every plane (value, K tangents, K second order) in one
// flat buffer, in double and float with the same values.
struct Buf {
  index_t N = 0, C = 0;
  View1<double> d;
  View1<float> f;
  Buf() = default;
  Buf(index_t N_, index_t C_, std::mt19937& g, double amp)
      : N(N_), C(C_), d("d", (1 + 2 * K) * N_ * C_), f("f", d.extent(0)) {
    std::uniform_real_distribution<double> u(-amp, amp);
    for (std::size_t i = 0; i < d.extent(0); ++i) {
      f(i) = float(u(g));
      d(i) = f(i);
    }
  }
  template <class T>
  const View1<T>& view() const {
    if constexpr (std::is_same_v<T, double>) return d;
    else return f;
  }
  template <class T>
  Act2<T> act() const {
    const View1<T>& b = view<T>();
    Act2<T> a;
    a.v = Span2<T>(b.data(), N, C);
    a.d = Span3<T>(b.data() + N * C, K, N, C);
    a.dd = Span3<T>(b.data() + (1 + K) * N * C, K, N, C);
    return a;
  }
  template <class T>
  Act1<T> act1() const {
    const View1<T>& b = view<T>();
    Act1<T> a;
    a.v = Span1<T>(b.data(), N);
    a.d = Span2<T>(b.data() + N, K, N);
    a.dd = Span2<T>(b.data() + (1 + K) * N, K, N);
    return a;
  }
  void zero_second() {
    for (index_t i = (1 + K) * N * C; i < index_t(d.extent(0)); ++i) d(i) = f(i) = 0;
  }
  void from(const Buf& o) {  // the double values of o, in both
    for (std::size_t i = 0; i < d.extent(0); ++i) {
      d(i) = o.d(i);
      f(i) = float(o.d(i));
    }
  }
};

struct Layout {
  const char* name;
  QkvLayout L;
  bool separate;
  index_t width;  // columns of the one buffer, or of q (separate)
};

std::vector<Layout> layouts() {
  return {{"fused", QkvLayout::fused(4, 4, 5), false, 12 * 5},
          {"grouped", QkvLayout::fused(4, 2, 5), false, 8 * 5},
          {"interleaved", QkvLayout::interleaved(3, 6), false, 9 * 6},
          {"separate, one key/value head", QkvLayout::separate(4, 1, 5), true, 4 * 5}};
}

struct Inputs {
  Buf q, k, v;  // q holds every part unless separate
  bool separate;
  template <class T>
  QkvActs<T> acts() const {
    if (!separate) return {q.act<T>(), q.act<T>(), q.act<T>()};
    return {q.act<T>(), k.act<T>(), v.act<T>()};
  }
  void zero_second() {
    q.zero_second();
    if (separate) k.zero_second(), v.zero_second();
  }
};

Inputs inputs(const Layout& l, std::mt19937& g, double amp) {
  Inputs in;
  in.separate = l.separate;
  in.q = Buf(B * Tc, l.width, g, amp);
  if (l.separate) {
    in.k = Buf(B * Tc, l.L.G * l.L.hs, g, amp);
    in.v = Buf(B * Tc, l.L.G * l.L.hs, g, amp);
  }
  return in;
}

template <class T>
AttentionScratch<T> scratch(index_t planes, index_t H, index_t seqs, index_t blocks = 1) {
  AttentionScratch<T> s;
  s.query_blocks = blocks;
  s.scores = View1<T>("scores", planes * H * Tc * Tc * seqs);
  s.pointers.pointers = View1<std::uintptr_t>("pointers", 3 * K * B * H);
  return s;
}

// Got (T) against the double reference, plane by plane of `len` values: in
// double within 8 (hs + Tc) 2^-53 of the plane's largest magnitude (the two
// paths add the same terms in different orders: a dot of hs terms, a sum of
// Tc, and the softmax's recurrences, each a few roundings); in float the same
// with 2^-24 (the float path rounds every one of those values).
// Under bf16-amp (bf16 true) both paths round the same operands, but where
// their FP32 sums differ in the last bit an operand may round the other way,
// a relative 2^-8 of one term; the bound is 2^-7 of the plane's largest
// magnitude (every term of a sum flipping, with room).
template <class T>
void compare(const View1<T>& got, const View1<double>& ref, index_t planes, index_t len, index_t hs,
             const std::string& what, bool bf16 = false) {
  const double u = std::is_same_v<T, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  for (index_t p = 0; p < planes; ++p) {
    double scale = 1, err = 0;
    for (index_t i = 0; i < len; ++i) scale = std::max(scale, std::fabs(ref(p * len + i)));
    for (index_t i = 0; i < len; ++i) {
      REQUIRE(std::isfinite(double(got(p * len + i))));
      err = std::max(err, std::fabs(double(got(p * len + i)) - ref(p * len + i)));
    }
    INFO(what << " plane " << p << " max error " << err << " scale " << scale);
    REQUIRE(err <= (bf16 ? std::ldexp(1.0, -7) : 8.0 * double(hs + Tc) * u) * scale);
  }
}

// The largest difference between two float results, relative to b's largest magnitude.
double relative_difference(const View1<float>& a, const View1<float>& b) {
  double scale = 1e-30, err = 0;
  for (std::size_t i = 0; i < a.extent(0); ++i) {
    scale = std::max(scale, double(std::fabs(b(i))));
    err = std::max(err, double(std::fabs(a(i) - b(i))));
  }
  return err / scale;
}

template <class T>
bool same_bits(const View1<T>& a, const View1<T>& b) {
  for (std::size_t i = 0; i < a.extent(0); ++i)
    if (!(a(i) == b(i))) return false;
  return true;
}

template <class S>
constexpr index_t value_planes() {
  return has_second_v<S> ? 1 + 2 * K : has_tangents_v<S> ? 1 + K : 1;
}

// The forward in mode S: batched (T) against the rows (double).
template <class T, template <class> class M>
void check_forward(const Layout& l, bool x_second, index_t blocks, std::mt19937& g) {
  using S = M<T>;
  using R = M<double>;
  const QkvLayout& L = l.L;
  const index_t N = B * Tc, C = L.H * L.hs, R1 = B * L.H * Tc;
  Inputs x = inputs(l, g, 1.5);
  Buf y(N, C, g, 0), lse(R1, 1, g, 0), yr(N, C, g, 0), lser(R1, 1, g, 0);
  const index_t planes = attention_score_planes(false, has_tangents_v<S>, has_second_v<S>, K);
  // The score operands of seqs sequences (a forward with tangents).
  auto with_operands = [&](AttentionScratch<T> sc, index_t seqs) {
    sc.operands = View1<T>("operands", seqs * attention_operand_values(L, Tc, l.width, false, value_planes<S>(),
                                                                       has_tangents_v<S>, has_second_v<S>, false, K));
    return sc;
  };
  // Chunks of 2, 1 sequences; then all three at once.
  attention_forward_batched<S>(ExecSpace(), y.act<T>(), lse.act1<T>(), x.acts<T>(), L, B, Tc, false, false, x_second,
                               with_operands(scratch<T>(planes, L.H, 2, blocks), 2));
  if (!x_second) x.zero_second();
  attention_forward<R>(ExecSpace(), yr.act<double>(), lser.act1<double>(), x.acts<double>(), L, B, Tc);
  ExecSpace().fence();
  const std::string what =
      std::string(l.name) + (x_second ? "" : ", x'' = 0") + ", " + std::to_string(blocks) + " query blocks";
  compare(y.view<T>(), yr.d, value_planes<S>(), N * C, L.hs, what + ": y");
  compare(lse.view<T>(), lser.d, value_planes<S>(), R1, L.hs, what + ": lse");
  Buf y2(N, C, g, 0), lse2(R1, 1, g, 0);
  attention_forward_batched<S>(ExecSpace(), y2.act<T>(), lse2.act1<T>(), x.acts<T>(), L, B, Tc, false, false, true,
                               with_operands(scratch<T>(planes, L.H, B, blocks), B));
  ExecSpace().fence();
  if (x_second) {
    INFO(what << ": one chunk and chunks of two give the same bits");
    REQUIRE(same_bits(y.view<T>(), y2.view<T>()));
    REQUIRE(same_bits(lse.view<T>(), lse2.view<T>()));
  }
}

// The reverse in mode S (T or Dual<T>): y, lse from the rows' tangent
// forward in double; batched (T) against the rows (double).
template <class T, template <class> class M>
void check_reverse(const Layout& l, index_t blocks, std::mt19937& g) {
  using S = M<T>;
  using R = M<double>;
  const QkvLayout& L = l.L;
  const index_t N = B * Tc, C = L.H * L.hs, R1 = B * L.H * Tc;
  Inputs x = inputs(l, g, 1.5);
  Buf y(N, C, g, 0), lse(R1, 1, g, 0), dy(N, C, g, 1.0);
  attention_forward<Dual<double>>(ExecSpace(), y.act<double>(), lse.act1<double>(), x.acts<double>(), L, B, Tc);
  ExecSpace().fence();
  y.from(y);
  lse.from(lse);
  Inputs dx = inputs(l, g, 0), dxr = inputs(l, g, 0);
  Buf D(R1, 1, g, 0), Dr(R1, 1, g, 0);
  AttentionScratch<T> sc = scratch<T>(attention_score_planes(true, has_tangents_v<S>, false, K), L.H, 2, blocks);
  sc.operands = View1<T>("operands",
                         2 * attention_operand_values(L, Tc, l.width, true, 1 + K, has_tangents_v<S>, false, false, K));
  attention_reverse_batched<S>(ExecSpace(), dx.acts<T>(), D.act1<T>(), dy.act<T>(), x.acts<T>(), y.act<T>(),
                               lse.act1<T>(), L, B, Tc, false, false, sc);
  attention_reverse<R>(ExecSpace(), dxr.acts<double>(), Dr.act1<double>(), dy.act<double>(), x.acts<double>(),
                       y.act<double>(), lse.act1<double>(), L, B, Tc);
  ExecSpace().fence();
  const index_t planes = has_tangents_v<S> ? 1 + K : 1;
  const std::string what = std::string(l.name) + ", " + std::to_string(blocks) + " query blocks: reverse";
  compare(dx.q.view<T>(), dxr.q.d, planes, N * dx.q.C, L.hs, what + " d(q)");
  if (l.separate) {
    compare(dx.k.view<T>(), dxr.k.d, planes, N * dx.k.C, L.hs, what + " dk");
    compare(dx.v.view<T>(), dxr.v.d, planes, N * dx.v.C, L.hs, what + " dv");
  }
  compare(D.view<T>(), Dr.d, planes, R1, L.hs, what + " D");
}

template <class T>
using Primal = T;

// Under bf16-amp, in float: batched against the rows with the same policy,
// forward (mode M) and its reverse (mode R: T or Dual); and the rounding is
// really there: the batched bf16 result is not the FP32 one.
template <template <class> class M>
void check_bf16_forward(const Layout& l, std::mt19937& g) {
  using S = M<float>;
  const QkvLayout& L = l.L;
  const index_t N = B * Tc, C = L.H * L.hs, R1 = B * L.H * Tc;
  Inputs x = inputs(l, g, 1.5);
  Buf y(N, C, g, 0), lse(R1, 1, g, 0), yr(N, C, g, 0), lser(R1, 1, g, 0), y32(N, C, g, 0), lse32(R1, 1, g, 0);
  const index_t planes = attention_score_planes(false, has_tangents_v<S>, has_second_v<S>, K);
  AttentionScratch<float> sc = scratch<float>(planes, L.H, 2, 4);
  sc.operands = View1<float>("operands", 2 * attention_operand_values(L, Tc, 3 * l.width, false, 1 + 2 * K,
                                                                      has_tangents_v<S>, has_second_v<S>, true, K));
  // Once with the operands in bfloat16 storage (the default: the
  // probabilities narrowed in place over their scores, the rounded q, k, v
  // and score operands 2 bytes a value), its products recorded as
  // bfloat16's; once as rounded floats. The same values either way, so the
  // same bits: a misplaced row, plane or narrowing race is O(1) off.
  GemmWork& w = gemm_work();
  w = GemmWork();
  w.on = true;
  attention_forward_batched<S>(ExecSpace(), y.act<float>(), lse.act1<float>(), x.acts<float>(), L, B, Tc, false, true,
                               true, sc);
  ExecSpace().fence();
  w.on = false;
  REQUIRE(!w.labels["gnh::gemm_mapped"].products.empty());
  for (const auto& [key, count] : w.labels["gnh::gemm_mapped"].products) REQUIRE(key[4] == 2);
  w = GemmWork();
  Buf yf(N, C, g, 0), lsef(R1, 1, g, 0);
  AttentionScratch<float> floats = sc;
  floats.bf16_storage = false;
  attention_forward_batched<S>(ExecSpace(), yf.act<float>(), lsef.act1<float>(), x.acts<float>(), L, B, Tc, false, true,
                               true, floats);
  attention_forward_batched<S>(ExecSpace(), y32.act<float>(), lse32.act1<float>(), x.acts<float>(), L, B, Tc, false,
                               false, true, sc);
  ExecSpace().fence();
  REQUIRE(std::memcmp(y.f.data(), yf.f.data(), sizeof(float) * y.f.extent(0)) == 0);
  REQUIRE(std::memcmp(lse.f.data(), lsef.f.data(), sizeof(float) * lse.f.extent(0)) == 0);
  attention_forward<S>(ExecSpace(), yr.act<float>(), lser.act1<float>(), x.acts<float>(), L, B, Tc, true);
  ExecSpace().fence();
  for (std::size_t i = 0; i < yr.d.extent(0); ++i) yr.d(i) = yr.f(i);
  const std::string what = std::string(l.name) + ", bf16-amp";
  compare(y.view<float>(), yr.d, value_planes<S>(), N * C, L.hs, what + ": y", true);
  INFO(what << ": bf16-amp against FP32, relative " << relative_difference(y.f, y32.f));
  REQUIRE(relative_difference(y.f, y32.f) > 1e-4);  // bfloat16 operands: 2^-9 relative each
}

template <template <class> class M>
void check_bf16_reverse(const Layout& l, std::mt19937& g) {
  using S = M<float>;
  const QkvLayout& L = l.L;
  const index_t N = B * Tc, C = L.H * L.hs, R1 = B * L.H * Tc;
  Inputs x = inputs(l, g, 1.5);
  Buf y(N, C, g, 0), lse(R1, 1, g, 0), dy(N, C, g, 1.0);
  attention_forward<Dual<float>>(ExecSpace(), y.act<float>(), lse.act1<float>(), x.acts<float>(), L, B, Tc, true);
  ExecSpace().fence();
  Inputs dx = inputs(l, g, 0), dxr = inputs(l, g, 0);
  Buf D(R1, 1, g, 0), Dr(R1, 1, g, 0);
  AttentionScratch<float> sc = scratch<float>(attention_score_planes(true, has_tangents_v<S>, false, K), L.H, 2, 4);
  sc.operands = View1<float>(
      "operands", 2 * attention_operand_values(L, Tc, 3 * l.width, true, 1 + K, has_tangents_v<S>, false, true, K));
  attention_reverse_batched<S>(ExecSpace(), dx.acts<float>(), D.act1<float>(), dy.act<float>(), x.acts<float>(),
                               y.act<float>(), lse.act1<float>(), L, B, Tc, false, true, sc);
  attention_reverse<S>(ExecSpace(), dxr.acts<float>(), Dr.act1<float>(), dy.act<float>(), x.acts<float>(),
                       y.act<float>(), lse.act1<float>(), L, B, Tc, true);
  ExecSpace().fence();
  for (std::size_t i = 0; i < dxr.q.d.extent(0); ++i) dxr.q.d(i) = dxr.q.f(i);
  const index_t planes = has_tangents_v<S> ? 1 + K : 1;
  compare(dx.q.view<float>(), dxr.q.d, planes, N * dx.q.C, L.hs, std::string(l.name) + ", bf16-amp: reverse d(q)",
          true);
}

}  // namespace

TEMPLATE_TEST_CASE("batched attention equals the row kernels in every mode and layout", "[attention][batched]", float,
                   double) {
  using T = TestType;
  std::mt19937 g(7);
  // Whole planes (1 block), blocks of 4, 4, 4 and 1 rows (4), of 5, 5 and 3
  // (3), of one row each (13).
  for (const index_t blocks : {1, 4, 3, 13})
    for (const Layout& l : layouts()) {
      check_forward<T, Primal>(l, true, blocks, g);
      check_forward<T, Dual>(l, true, blocks, g);
      check_forward<T, Jet2>(l, true, blocks, g);
      check_forward<T, Jet2>(l, false, blocks, g);
      check_reverse<T, Primal>(l, blocks, g);
      check_reverse<T, Dual>(l, blocks, g);
    }
}

// The score products that `call` issues, from the work ledger: those whose
// n is not the head width hs (n is a block's end; the products of the
// outputs, dq, dk and dv have n = hs), by inner dimension, and how many of
// them read their plane back to accumulate.
template <class F>
std::map<index_t, double> ledger_scores(index_t hs, double& accumulating, F&& call) {
  GemmWork& w = gemm_work();
  w = GemmWork();
  w.on = true;
  call();
  ExecSpace().fence();
  w.on = false;
  std::map<index_t, double> by_inner;
  accumulating = 0;
  for (const auto& [key, count] : w.labels["gnh::gemm_mapped"].products) {
    if (key[1] == hs) continue;
    by_inner[key[2]] += count;
    if (key[5] != index_t(sizeof(float))) accumulating += count;
  }
  w = GemmWork();
  return by_inner;
}

// The score products of a forward in mode S (float).
template <template <class> class M>
std::map<index_t, double> score_products(const Layout& l, bool x_second, index_t blocks, double& accumulating) {
  using S = M<float>;
  const QkvLayout& L = l.L;
  std::mt19937 g(5);
  Inputs x = inputs(l, g, 1.0);
  Buf y(B * Tc, L.H * L.hs, g, 0), lse(B * L.H * Tc, 1, g, 0);
  AttentionScratch<float> sc =
      scratch<float>(attention_score_planes(false, has_tangents_v<S>, has_second_v<S>, K), L.H, B, blocks);
  sc.operands = View1<float>("operands", B * attention_operand_values(L, Tc, l.width, false, value_planes<S>(),
                                                                      has_tangents_v<S>, has_second_v<S>, false, K));
  return ledger_scores(L.hs, accumulating, [&] {
    attention_forward_batched<S>(ExecSpace(), y.act<float>(), lse.act1<float>(), x.acts<float>(), L, B, Tc, false,
                                 false, x_second, sc);
  });
}

// The same of the reverse in mode Dual (float): S, dP, and per direction S'
// and dP'.
std::map<index_t, double> reverse_score_products(const Layout& l, index_t blocks, double& accumulating) {
  using S = Dual<float>;
  const QkvLayout& L = l.L;
  std::mt19937 g(6);
  const index_t N = B * Tc, C = L.H * L.hs, R1 = B * L.H * Tc;
  Inputs x = inputs(l, g, 1.0), dx = inputs(l, g, 0);
  Buf y(N, C, g, 0), lse(R1, 1, g, 0), dy(N, C, g, 1.0), D(R1, 1, g, 0);
  attention_forward<S>(ExecSpace(), y.act<float>(), lse.act1<float>(), x.acts<float>(), L, B, Tc);
  AttentionScratch<float> sc = scratch<float>(attention_score_planes(true, true, false, K), L.H, B, blocks);
  sc.operands =
      View1<float>("operands", B * attention_operand_values(L, Tc, l.width, true, 1 + K, true, false, false, K));
  return ledger_scores(L.hs, accumulating, [&] {
    attention_reverse_batched<S>(ExecSpace(), dx.acts<float>(), D.act1<float>(), dy.act<float>(), x.acts<float>(),
                                 y.act<float>(), lse.act1<float>(), L, B, Tc, false, false, sc);
  });
}

TEST_CASE("with tangents each score plane is written by one product, none read back", "[attention][batched]") {
  // The derivative planes' products take a concatenated inner dimension
  // (S' and the reverse's dP' over 2 hs; S'' over 3 hs, or hs where x'' is
  // zero): per block and (sequence, head) one product a plane, so the
  // primal's and one a plane of each direction, and none accumulates into
  // a plane.
  for (const Layout& l : layouts())
    for (const index_t blocks : {1, 4}) {
      CAPTURE(l.name, blocks);
      const double per = double(blocks * B * l.L.H);
      double acc = 0;
      auto dual = score_products<Dual>(l, true, blocks, acc);
      REQUIRE(acc == 0);
      REQUIRE(dual == std::map<index_t, double>{{l.L.hs, per}, {2 * l.L.hs, K * per}});
      auto jet = score_products<Jet2>(l, true, blocks, acc);
      REQUIRE(acc == 0);
      REQUIRE(jet == std::map<index_t, double>{{l.L.hs, per}, {2 * l.L.hs, K * per}, {3 * l.L.hs, K * per}});
      auto cut = score_products<Jet2>(l, false, blocks, acc);
      REQUIRE(acc == 0);
      REQUIRE(cut == std::map<index_t, double>{{l.L.hs, (1 + K) * per}, {2 * l.L.hs, K * per}});
      // The tangent of the reverse: S and dP, then S' = [Q' | Q][K | K']^T and
      // dP' = [dY' | dY][V | V']^T a direction.
      auto rev = reverse_score_products(l, blocks, acc);
      REQUIRE(acc == 0);
      REQUIRE(rev == std::map<index_t, double>{{l.L.hs, 2 * per}, {2 * l.L.hs, 2 * K * per}});
    }
}

TEST_CASE("batched attention under bf16-amp rounds the operands the row kernels round", "[attention][batched][bf16]") {
  std::mt19937 g(11);
  for (const Layout& l : layouts()) {
    check_bf16_forward<Primal>(l, g);
    check_bf16_forward<Dual>(l, g);
    check_bf16_forward<Jet2>(l, g);
    check_bf16_reverse<Primal>(l, g);
    check_bf16_reverse<Dual>(l, g);
  }
}

TEST_CASE("the batched path is chosen on request and refuses a bad name", "[attention][batched]") {
  REQUIRE(std::string(attention_path_name(AttentionPath::batched)) == "batched");
  setenv("GNH_ATTENTION", "batched", 1);
  REQUIRE(attention_path<double>(false, false) == AttentionPath::batched);
  REQUIRE(attention_path<float>(false, false) == AttentionPath::batched);
  REQUIRE(attention_path<float>(true, false) == AttentionPath::batched);  // bf16-amp too
  setenv("GNH_ATTENTION", "fastest", 1);
  REQUIRE_THROWS_WITH(attention_path<float>(false, false), Catch::Contains("GNH_ATTENTION=fastest"));
  unsetenv("GNH_ATTENTION");
  REQUIRE(attention_path<double>(false, false) == AttentionPath::rows);
  REQUIRE(attention_path<float>(true, false) == AttentionPath::rows);      // bf16-amp on a host: the rows
  REQUIRE(attention_path<double>(false, true) == AttentionPath::batched);  // GPU-shaped on the host
}

// The fused forward (attention_fused.hpp) in each mode it takes (the primal,
// tangents, second order with x'' zero), at contexts of one partial tile (13)
// and of several query and key tiles with a partial last one (77 = 2 x 32 +
// 13), heads from 5 columns (padded to 16) to 64 (four 16-column blocks),
// every layout: against the batched GEMMs and the row kernels under the same
// bf16-amp policy (q, k, v and the probabilities rounded to bfloat16, the
// scores and softmax FP32). The three round the same operands; the fused
// kernel's statistics add the same terms in another FP32 order (a running
// maximum, tile by tile), so a probability may round to the other bfloat16
// neighbour: compare()'s bf16 bound, 2^-7 of a plane's largest magnitude.
template <template <class> class M>
void check_fused(const Layout& l, index_t Tq, std::mt19937& g, double trend = 0, double shift = 0) {
  using S = M<float>;
  constexpr bool tan = has_tangents_v<S>, sec = has_second_v<S>;
  const QkvLayout& L = l.L;
  const index_t N = B * Tq, C = L.H * L.hs, R1 = B * L.H * Tq;
  Inputs x;
  x.separate = l.separate;
  x.q = Buf(N, l.width, g, 1.5);
  if (l.separate) x.k = Buf(N, L.G * L.hs, g, 1.5), x.v = Buf(N, L.G * L.hs, g, 1.5);
  x.zero_second();  // the fused kernel and the cut forwards take x'' as zero
  // trend (separate layouts): every query's first column raised by trend and
  // every key's by trend t / Tq, so that the scores grow with the key's
  // position (attention on the latest keys) and s' = q' k + q k' with it.
  for (index_t n = 0; trend > 0 && n < N; ++n)
    for (index_t h = 0; h < L.H; ++h) {
      const double t = double(n % Tq) / double(Tq);
      x.q.f(n * l.width + h * L.hs) += float(trend);
      x.q.d(n * l.width + h * L.hs) = x.q.f(n * l.width + h * L.hs);
      if (h < L.G) {
        x.k.f(n * L.G * L.hs + h * L.hs) += float(trend * t);
        x.k.d(n * L.G * L.hs + h * L.hs) = x.k.f(n * L.G * L.hs + h * L.hs);
      }
    }
  // shift (separate layouts): every key's first column raised by shift and
  // every direction's q' there set to it, so that s' = q' k + q k' has a
  // common part (scale shift^2) far larger than its spread over the keys,
  // and S raised by a row constant (no change to P).
  for (index_t n = 0; shift > 0 && n < N; ++n)
    for (index_t h = 0; h < L.H; ++h) {
      for (index_t k = 0; k < K; ++k) {
        const index_t i = (1 + k) * N * l.width + n * l.width + h * L.hs;
        x.q.d(i) = x.q.f(i) = float(shift);
      }
      if (h < L.G) x.k.d(n * L.G * L.hs + h * L.hs) = x.k.f(n * L.G * L.hs + h * L.hs) += float(shift);
    }
  Buf y(N, C, g, 0), lse(R1, 1, g, 0), yb(N, C, g, 0), lseb(R1, 1, g, 0), yr(N, C, g, 0), lser(R1, 1, g, 0);
  REQUIRE(attention_fused_fits(L, tan, sec));
  // The second order's cut at y: acc(k, n) += <a(n), y''_k(n)> for an
  // adjoint a, added to what acc held.
  const Buf a(N, C, g, 1.0);
  View2<double> acc("acc", K, N), acc0("acc0", K, N), acco("acco", K, N), accp("accp", K, N);
  View1<float> partial("partial", K * L.H * N);
  for (index_t i = 0; i < K * N; ++i) acc.data()[i] = acc0.data()[i] = std::uniform_real_distribution<double>(-1, 1)(g);
  const FusedCut cut{a.act<float>(), acc, partial.data()}, cuto{a.act<float>(), acco, partial.data()},
      cutp{a.act<float>(), accp, partial.data()};
  attention_forward_fused<S>(ExecSpace(), y.act<float>(), lse.act1<float>(), x.acts<float>(), L, B, Tq, nullptr, false,
                             sec ? &cut : nullptr);
  AttentionScratch<float> sc;
  sc.query_blocks = 2;
  sc.scores = View1<float>("scores", attention_score_planes(false, tan, sec, K) * L.H * Tq * Tq * B);
  sc.pointers.pointers = View1<std::uintptr_t>("pointers", 3 * K * B * L.H);
  sc.operands = View1<float>(
      "operands", B * attention_operand_values(L, Tq, 3 * l.width, false, 1 + 2 * K, tan, sec, true, K, true));
  attention_forward_batched<S>(ExecSpace(), yb.act<float>(), lseb.act1<float>(), x.acts<float>(), L, B, Tq, false, true,
                               false, sc);
  attention_forward<S>(ExecSpace(), yr.act<float>(), lser.act1<float>(), x.acts<float>(), L, B, Tq, true);
  ExecSpace().fence();
  for (Buf* b : {&yb, &lseb, &yr, &lser})
    for (std::size_t i = 0; i < b->d.extent(0); ++i) b->d(i) = b->f(i);
  const std::string what = std::string(l.name) + ", hs " + std::to_string(L.hs) + ", Tc " + std::to_string(Tq);
  // Written as the output projection's rounded input (y and y' planes): the
  // rounding of the y and y' written without it, bit for bit; y'' and the
  // statistics as without it.
  Buf yo(N, C, g, 0), lseo(R1, 1, g, 0);
  View1<float> out("out", (1 + (tan ? K : 0)) * N * C);
  attention_forward_fused<S>(ExecSpace(), yo.act<float>(), lseo.act1<float>(), x.acts<float>(), L, B, Tq, out.data(),
                             false, sec ? &cuto : nullptr);
  ExecSpace().fence();
  for (index_t i = 0; i < index_t(out.extent(0)); ++i) REQUIRE(out(i) == round_bf16(y.f(i)));
  REQUIRE(std::memcmp(lseo.f.data(), lse.f.data(), sizeof(float) * lse.f.extent(0)) == 0);
  if constexpr (tan) {
    // In pair blocks (the output projection's pair products, kernels/room.hpp):
    // y in every block, y'_k in its slot, the same bits.
    const RoomLayout room{N, C, (K + 1) / 2};
    View1<float> pairs("pairs", 3 * room.pairs * N * C);
    attention_forward_fused<S>(ExecSpace(), yo.act<float>(), lseo.act1<float>(), x.acts<float>(), L, B, Tq,
                               pairs.data(), false, sec ? &cutp : nullptr, room);
    ExecSpace().fence();
    for (index_t n = 0; n < N; ++n)
      for (index_t c = 0; c < C; ++c) {
        for (index_t j = 0; j < room.pairs; ++j) REQUIRE(pairs(room.value(n, c, j)) == out(n * C + c));
        for (index_t k = 0; k < K; ++k) REQUIRE(pairs(room.direction(k, n, c)) == out((N + k * N + n) * C + c));
      }
  }
  // y'' is never written in the second order: y's planes up to y' compared.
  constexpr index_t yp = value_planes<std::conditional_t<sec, Dual<float>, S>>();
  compare(y.view<float>(), yb.d, yp, N * C, L.hs, what + ": y against batched", true);
  compare(lse.view<float>(), lseb.d, value_planes<S>(), R1, L.hs, what + ": lse against batched", true);
  compare(y.view<float>(), yr.d, yp, N * C, L.hs, what + ": y against rows", true);
  compare(lse.view<float>(), lser.d, value_planes<S>(), R1, L.hs, what + ": lse against rows", true);
  if constexpr (sec) {
    // The cut against <a, y''> of the batched path's y'': y'' within compare()'s
    // bf16 bound (2^-7 of its plane's largest magnitude) over the row's
    // sum_c |a|, and a rounded to bfloat16 as the fused kernel reads it (a
    // relative 2^-9, 2^-8 with room, of sum_c |a y''|).
    for (index_t k = 0; k < K; ++k) {
      double big = 1;
      for (index_t i = 0; i < N * C; ++i) big = std::max(big, std::fabs(yb.d((1 + K + k) * N * C + i)));
      for (index_t n = 0; n < N; ++n) {
        double ref = 0, abs_a = 0, abs_ay = 0;
        for (index_t c = 0; c < C; ++c) {
          const double av = a.d(n * C + c), ydd = yb.d((1 + K + k) * N * C + n * C + c);
          ref += av * ydd, abs_a += std::fabs(av), abs_ay += std::fabs(av * ydd);
        }
        const double got = acc(k, n) - acc0(k, n);
        INFO(what << ": the cut, direction " << k << " row " << n << ": " << got << " against " << ref);
        REQUIRE(std::fabs(got - ref) <= std::ldexp(1.0, -7) * big * abs_a + std::ldexp(1.0, -8) * abs_ay);
        // With the output rounded: the same contraction (added to zero).
        REQUIRE(std::fabs(acco(k, n) - got) <= 1e-12 * (1 + std::fabs(got)));
        REQUIRE(accp(k, n) == acco(k, n));
      }
    }
  }
}

std::vector<Layout> fused_layouts() {
  std::vector<Layout> v = layouts();
  v.push_back({"grouped", QkvLayout::fused(4, 2, 24), false, 8 * 24});
  v.push_back({"interleaved", QkvLayout::interleaved(2, 40), false, 6 * 40});
  v.push_back({"separate, one key/value head", QkvLayout::separate(2, 1, 64), true, 2 * 64});
  return v;
}

TEST_CASE("the fused forward equals the batched GEMMs and the rows under bf16-amp", "[attention][fused][bf16]") {
  std::mt19937 g(19);
  for (const index_t Tq : {13, 77})
    for (const Layout& l : fused_layouts()) {
      check_fused<Primal>(l, Tq, g);
      check_fused<Dual>(l, Tq, g);
      check_fused<Jet2>(l, Tq, g);
    }
}

// [long]: 193 s under qemu-aarch64 (cmake/cross-aarch64.sh leaves it to the native suite).
TEST_CASE("the fused forward where attention is on the latest keys", "[attention][fused][bf16][long]") {
  // Scores that grow with the key's position put p on the latest keys of a
  // long row, and s' (through q k') trends with them, so that the first key
  // tiles' mean of s' is far from lse'. The fused directions' p' and p''
  // must stay centred on lse' and lse'' themselves: p' and p'' formed about
  // such a nearby centre and recentred after the walk (one walk of the keys
  // instead of two) put y'' 1.0-1.1% of a plane's largest value off the
  // batched path here, over the 2^-7 bound (perf/NOTES.md).
  std::mt19937 g(23);
  const index_t Tq = 301;  // 9 whole key tiles and a partial one
  for (const double trend : {4.0, 8.0}) {
    check_fused<Dual>(fused_layouts()[3], Tq, g, trend);
    check_fused<Jet2>(fused_layouts()[3], Tq, g, trend);
    check_fused<Jet2>(fused_layouts()[6], Tq, g, trend);
  }
}

TEST_CASE("the fused second order where s' has a large common part", "[attention][fused][bf16]") {
  // One walk of the keys forms y' as (P s') V + P V' - lse' y: with s' far
  // from zero against its spread (lse' / spread about 30 here), P s' rounded
  // to bfloat16 once would leave a 2^-9 lse' / spread error in y' after the
  // subtraction; in two parts (high, rest) it holds to 2^-17 of that.
  std::mt19937 g(29);
  for (const double shift : {8.0, 16.0}) {
    check_fused<Jet2>(fused_layouts()[3], 77, g, 0, shift);
    check_fused<Jet2>(fused_layouts()[6], 77, g, 0, shift);
  }
}

TEST_CASE("the fused forward records its products once, over the causal tiles", "[attention][fused]") {
  // Jet2 at Tc = 77, hs 5, 4 heads, K = 3: per (sequence, head) the primal's
  // score products twice and y (3), and per direction one walk of 9 (S, S'
  // in two, S'', A V^T, A V'^T, (P s') V in two parts, P V'): 3 x 4 x 3 and
  // 3 x 4 x 3 x 9 products of 77 x 77 x 5 over the query tiles' key extents
  // (32, 64 and 96 keys for tiles of 32 rows): 6144 of the 77^2 pairs.
  const Layout l = layouts()[0];
  const index_t Tq = 77, N = B * Tq, C = l.L.H * l.L.hs;
  std::mt19937 g(3);
  Buf q(N, l.width, g, 1.0), y(N, C, g, 0), lse(B * l.L.H * Tq, 1, g, 0), a(N, C, g, 1.0);
  View2<double> acc("acc", K, N);
  View1<float> partial("partial", K * l.L.H * N);
  const FusedCut cut{a.act<float>(), acc, partial.data()};
  GemmWork& w = gemm_work();
  w = GemmWork();
  w.on = true;
  attention_forward_fused<Jet2<float>>(ExecSpace(), y.act<float>(), lse.act1<float>(),
                                       {q.act<float>(), q.act<float>(), q.act<float>()}, l.L, B, Tq, nullptr, false,
                                       &cut);
  ExecSpace().fence();
  w.on = false;
  const double causal = 6144.0 / (77.0 * 77.0);
  for (const auto& [label, products] : {std::pair<const char*, double>{"gnh::attention::fused::forward", 3.0},
                                        {"gnh::attention::fused::second_order", double(K) * 9.0}}) {
    INFO(label);
    const LabelWork& lw = w.labels[label];
    REQUIRE(lw.products.size() == 1);
    const auto& [key, count] = *lw.products.begin();
    REQUIRE(key == std::array<index_t, 6>{Tq, Tq, l.L.hs, index_t(GemmUnit::fused), 2, 4});
    REQUIRE(count == Approx(double(B * l.L.H) * products * causal).epsilon(1e-12));
    REQUIRE(lw.flops(GemmUnit::tensor) == lw.flops(GemmUnit::fused));
    REQUIRE(lw.total_bytes() > 0);
  }
  REQUIRE(w.labels["gnh::attention::fused::cut"].total_bytes() > 0);
  // Without the cut's adjoint the second order is refused.
  REQUIRE_THROWS_WITH(
      attention_forward_fused<Jet2<float>>(ExecSpace(), y.act<float>(), lse.act1<float>(),
                                           {q.act<float>(), q.act<float>(), q.act<float>()}, l.L, B, Tq),
      Catch::Contains("without its cut's adjoint"));
  w = GemmWork();
}

// The fused reverse of the primal (attention_fused.hpp): dq, dk, dv and D
// against the batched GEMMs and the row kernels under bf16-amp, from the
// same forward's y and lse, at the same contexts, heads and layouts as the
// forward (grouped query heads summed into their key/value head, a context
// of one partial tile and of several). Every path rounds q, k, v, dy, P and
// dS to bfloat16 and keeps S, dP and D in FP32; their sums go in other FP32
// orders (D over hs, S and dP tile by tile), so an operand may round to the
// other bfloat16 neighbour: within 2^-7 of each output's largest magnitude,
// as the forward. D adds the same hs products in another order: within
// 2 hs 2^-24 of its largest magnitude.
void check_fused_reverse(const Layout& l, index_t Tq, std::mt19937& g) {
  const QkvLayout& L = l.L;
  const index_t N = B * Tq, C = L.H * L.hs, R1 = B * L.H * Tq;
  auto make = [&](double amp) {
    Inputs a;
    a.separate = l.separate;
    a.q = Buf(N, l.width, g, amp);
    if (l.separate) a.k = Buf(N, L.G * L.hs, g, amp), a.v = Buf(N, L.G * L.hs, g, amp);
    return a;
  };
  const Inputs x = make(1.5);
  Inputs dx = make(0), dxb = make(0), dxr = make(0);
  Buf dy(N, C, g, 1.0), y(N, C, g, 0), lse(R1, 1, g, 0), D(R1, 1, g, 0), Db(R1, 1, g, 0), Dr(R1, 1, g, 0);
  REQUIRE(attention_fused_reverse_fits(L));
  attention_forward_fused<float>(ExecSpace(), y.act<float>(), lse.act1<float>(), x.acts<float>(), L, B, Tq);
  attention_reverse_fused(ExecSpace(), dx.acts<float>(), D.act1<float>(), dy.act<float>(), x.acts<float>(),
                          y.act<float>(), lse.act1<float>(), L, B, Tq);
  AttentionScratch<float> sc;
  sc.query_blocks = 2;
  sc.scores = View1<float>("scores", attention_score_planes(true, false, false, K) * L.H * Tq * Tq * B);
  sc.pointers.pointers = View1<std::uintptr_t>("pointers", 3 * K * B * L.H);
  sc.operands =
      View1<float>("operands", B * attention_operand_values(L, Tq, 3 * l.width, true, 1 + K, false, false, true, K));
  attention_reverse_batched<float>(ExecSpace(), dxb.acts<float>(), Db.act1<float>(), dy.act<float>(), x.acts<float>(),
                                   y.act<float>(), lse.act1<float>(), L, B, Tq, false, true, sc);
  attention_reverse<float>(ExecSpace(), dxr.acts<float>(), Dr.act1<float>(), dy.act<float>(), x.acts<float>(),
                           y.act<float>(), lse.act1<float>(), L, B, Tq, true);
  ExecSpace().fence();
  const std::string what = std::string(l.name) + ", hs " + std::to_string(L.hs) + ", Tc " + std::to_string(Tq);
  auto check = [&](const View1<float>& got, const View1<float>& ref, index_t len, double bound, const char* name) {
    double scale = 0, err = 0;
    for (index_t i = 0; i < len; ++i) {
      REQUIRE(std::isfinite(got(i)));
      scale = std::max(scale, double(std::fabs(ref(i))));
      err = std::max(err, double(std::fabs(got(i) - ref(i))));
    }
    INFO(what << ": " << name << " max error " << err << " scale " << scale);
    REQUIRE(scale > 0);
    REQUIRE(err <= bound * scale);
  };
  const double flip = std::ldexp(1.0, -7), sums = 2.0 * double(L.hs) * std::ldexp(1.0, -24);
  for (const Inputs* ref : {&dxb, &dxr}) {
    check(dx.q.f, ref->q.f, N * l.width, flip, "dx (q, or q|k|v)");
    if (l.separate) {
      check(dx.k.f, ref->k.f, N * L.G * L.hs, flip, "dk");
      check(dx.v.f, ref->v.f, N * L.G * L.hs, flip, "dv");
    }
  }
  check(D.f, Db.f, R1, sums, "D against batched");
  check(D.f, Dr.f, R1, sums, "D against rows");
}

TEST_CASE("the fused reverse equals the batched GEMMs and the rows under bf16-amp", "[attention][fused][bf16]") {
  std::mt19937 g(23);
  for (const index_t Tq : {13, 77})
    for (const Layout& l : fused_layouts()) check_fused_reverse(l, Tq, g);
}

TEST_CASE("the fused reverse records its products once, over the causal tiles", "[attention][fused]") {
  // Per (sequence, head): S and dP on each side, dq, dk and dv: 7 products
  // of 77 x 77 x 5 over the query tiles' key extents (6144 of the 77^2 pairs).
  const Layout l = layouts()[0];
  const index_t Tq = 77, N = B * Tq, C = l.L.H * l.L.hs, R1 = B * l.L.H * Tq;
  std::mt19937 g(5);
  Buf q(N, l.width, g, 1.0), dq(N, l.width, g, 0), dy(N, C, g, 1.0), y(N, C, g, 0), lse(R1, 1, g, 0), D(R1, 1, g, 0);
  const QkvActs<float> x{q.act<float>(), q.act<float>(), q.act<float>()},
      dx{dq.act<float>(), dq.act<float>(), dq.act<float>()};
  attention_forward_fused<float>(ExecSpace(), y.act<float>(), lse.act1<float>(), x, l.L, B, Tq);
  GemmWork& w = gemm_work();
  w = GemmWork();
  w.on = true;
  attention_reverse_fused(ExecSpace(), dx, D.act1<float>(), dy.act<float>(), x, y.act<float>(), lse.act1<float>(), l.L,
                          B, Tq);
  ExecSpace().fence();
  w.on = false;
  const LabelWork& lw = w.labels["gnh::attention::fused::reverse"];
  REQUIRE(lw.products.size() == 1);
  const auto& [key, count] = *lw.products.begin();
  REQUIRE(key == std::array<index_t, 6>{Tq, Tq, l.L.hs, index_t(GemmUnit::fused), 2, 4});
  REQUIRE(count == Approx(double(B * l.L.H * 7) * 6144.0 / (77.0 * 77.0)).epsilon(1e-12));
  REQUIRE(lw.total_bytes() > 0);
  w = GemmWork();
  // Heads wider than the tiles are refused in one line.
  const QkvLayout wide = QkvLayout::fused(2, 2, kFusedWidth + 1);
  REQUIRE_FALSE(attention_fused_reverse_fits(wide));
  Buf wq(B * 8, 6 * wide.hs, g, 1.0), wy(B * 8, 2 * wide.hs, g, 0), wl(B * 2 * 8, 1, g, 0);
  const QkvActs<float> wx{wq.act<float>(), wq.act<float>(), wq.act<float>()};
  REQUIRE_THROWS_WITH(attention_reverse_fused(ExecSpace(), wx, wl.act1<float>(), wy.act<float>(), wx, wy.act<float>(),
                                              wl.act1<float>(), wide, B, 8),
                      Catch::Contains("reverse (fused)") && Catch::Contains("65 columns"));
}

TEST_CASE("the fused forward refuses heads wider than its tiles", "[attention][fused]") {
  const QkvLayout wide = QkvLayout::fused(2, 2, kFusedWidth + 1);
  REQUIRE_FALSE(attention_fused_fits(wide, true, true));
  std::mt19937 g(3);
  Buf q(B * 8, 6 * wide.hs, g, 1.0), y(B * 8, 2 * wide.hs, g, 0), lse(B * 2 * 8, 1, g, 0);
  REQUIRE_THROWS_WITH(attention_forward_fused<float>(ExecSpace(), y.act<float>(), lse.act1<float>(),
                                                     {q.act<float>(), q.act<float>(), q.act<float>()}, wide, B, 8),
                      Catch::Contains("fused") && Catch::Contains("65 columns"));
}

// The mapped batches themselves (gemm_mapped.hpp): products over a
// four-part batch index with strides of every kind (a shared operand, a
// column offset, a block, a plane), both operands transposed, queued past the
// queue's length and its pointer scratch (so that it flushes on its own),
// each against a plain triple loop in double. Products that accumulate into
// the same C run in their queued order.
TEST_CASE("mapped batched products equal the loops, queued past the queue's length", "[batched][gemm]") {
  const index_t m = 5, n = 4, k = 3;
  const BatchExtents e{{2, 3, 1, 2}};  // 12 products
  const index_t count = e.count();
  std::mt19937 g(5);
  std::uniform_real_distribution<double> u(-1, 1);
  // A: (k x m) blocks transposed, a column offset per i3; B: one shared (n x k) block, transposed.
  View1<double> A("A", 4096), Bm("B", n * k), C("C", 4096), want("want", 4096);
  for (std::size_t i = 0; i < A.extent(0); ++i) A(i) = u(g);
  for (std::size_t i = 0; i < Bm.extent(0); ++i) Bm(i) = u(g);
  Mapped<const double> a{A.data(), 2 * m, {700, 60, 0, m}};  // ld 2m: two products side by side in a row
  Mapped<const double> b{Bm.data(), k, {0, 0, 0, 0}};
  Mapped<double> c{C.data(), n, {1000, 100, 0, 30}};
  MappedProduct<double> p(true, true, m, n, k, 1.0, a, b, 0.0, c, e);
  for (index_t i = 0; i < count; ++i) {
    const double* Ai = a.at(e, i);
    const double* Bi = b.at(e, i);
    double* Wi = want.data() + (c.at(e, i) - C.data());
    for (index_t r = 0; r < m; ++r)
      for (index_t s = 0; s < n; ++s) {
        double dot = 0;
        for (index_t t = 0; t < k; ++t) dot += Ai[t * a.ld + r] * Bi[s * b.ld + t];
        Wi[r * c.ld + s] = dot * 23.0;  // 1 + 11 x 2
      }
  }
  // Pointer room for twenty batches (the queue flushes at its eight
  // products), then for one (it flushes before every product).
  for (const index_t room : {20 * 3 * count, 3 * count + 5}) {
    MappedScratch scratch;
    scratch.pointers = View1<std::uintptr_t>("pointers", room);
    MappedQueue<double> q(ExecSpace(), false, scratch);
    // C = A^T B^T, then C += 2 A^T B^T eleven times.
    for (int rep = 0; rep < 12; ++rep) {
      p.alpha = rep == 0 ? 1.0 : 2.0;
      p.beta = rep == 0 ? 0.0 : 1.0;
      q.add(p);
    }
    q.flush();
    ExecSpace().fence();
    for (index_t i = 0; i < count; ++i) {
      const double* Ci = c.at(e, i);
      const double* Wi = want.data() + (Ci - C.data());
      for (index_t r = 0; r < m; ++r)
        for (index_t s = 0; s < n; ++s) {
          INFO("room " << room << " product " << i << " entry " << r << "," << s);
          // Twelve passes over a 3-term dot, each within a few roundings of 2^-53 of values below 30.
          REQUIRE(std::fabs(Ci[r * c.ld + s] - Wi[r * c.ld + s]) <= 1e-13);
        }
    }
  }
  // A batch larger than the pointer scratch: one clear line.
  MappedScratch small;
  small.pointers = View1<std::uintptr_t>("small", 3 * count - 1);
  MappedQueue<double> q2(ExecSpace(), false, small);
  REQUIRE_THROWS_WITH(q2.add(p), Catch::Contains("holds no batch of 12 products"));
}
