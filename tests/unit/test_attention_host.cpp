// SPDX-License-Identifier: BSD-3-Clause
// The tiled FP32 host attention (attention_host.cpp) against the portable
// kernels of attention.hpp run in double on the same inputs: forward, reverse
// and second-order forward with several directions, at sizes that cross the
// 64-row query tiles and are not multiples of them.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/attention_host.hpp"
#include "kernels/host_gemm.hpp"

using namespace gnh;
using namespace gnh::kernels;

namespace {

struct Planes {
  View1<float> f;
  View1<double> d;
};

Planes random_planes(index_t n, std::mt19937& g, float amp) {
  Planes p{View1<float>("f", n), View1<double>("d", n)};
  std::uniform_real_distribution<float> u(-amp, amp);
  for (index_t i = 0; i < n; ++i) {
    p.f(i) = u(g);
    p.d(i) = p.f(i);
  }
  return p;
}

template <class T>
Act2<T> act(const View1<T>& buf, index_t K, index_t N, index_t C, bool tangents, bool second) {
  Act2<T> a;
  a.v = Span2<T>(buf.data(), N, C);
  if (tangents) a.d = Span3<T>(buf.data() + N * C, K, N, C);
  if (second) a.dd = Span3<T>(buf.data() + (1 + K) * N * C, K, N, C);
  return a;
}
template <class T>
Act1<T> act1(const View1<T>& buf, index_t K, index_t N, bool tangents, bool second) {
  Act1<T> a;
  a.v = Span1<T>(buf.data(), N);
  if (tangents) a.d = Span2<T>(buf.data() + N, K, N);
  if (second) a.dd = Span2<T>(buf.data() + (1 + K) * N, K, N);
  return a;
}

// Float against double, plane by plane (each a block of `len` values): the
// largest difference within 8 (hs + T) u max(1, max|ref|) of the plane. The
// float path rounds each score (an hs-term dot), each softmax weight and each
// output (a T-term sum), each within a few units of u = 2^-24 relative to the
// magnitudes involved; 8 covers the exp/log evaluations and the derivative
// recurrences, which combine a handful of such terms.
void compare(const View1<float>& got, const View1<double>& ref, index_t planes, index_t len, index_t hs, index_t T,
             const char* what) {
  const double u = std::ldexp(1.0, -24);
  for (index_t p = 0; p < planes; ++p) {
    double scale = 1, err = 0;
    for (index_t i = 0; i < len; ++i) scale = std::max(scale, std::fabs(ref(p * len + i)));
    for (index_t i = 0; i < len; ++i) {
      REQUIRE(std::isfinite(got(p * len + i)));
      err = std::max(err, std::fabs(got(p * len + i) - ref(p * len + i)));
    }
    INFO(what << " plane " << p << " max error " << err << " scale " << scale);
    REQUIRE(err <= 8.0 * double(hs + T) * u * scale);
  }
}

}  // namespace

TEST_CASE("tiled host attention equals the portable kernels to rounding", "[attention][host]") {
  // The tiles multiply with gnh's kernel for this CPU, or with the vendor BLAS
  // where there is none (Arm) or GNH_HOST_GEMM=vendor pins it (CTest runs this
  // file both ways: test_attention_host_vendor).
  const char* pin = std::getenv("GNH_HOST_GEMM");
  if (pin && std::string(pin) == "vendor") REQUIRE(host::native_kernel() == host::GemmKernel::none);
  if (host::native_kernel() == host::GemmKernel::none && !host::vendor_panels_available()) {
    REQUIRE_FALSE(host::attention_available());
    return;
  }
  // With a host sgemm the float calls below must take the tiled path.
  REQUIRE(host::attention_available());
  const ExecSpace space;
  for (const auto& shape : {std::array<index_t, 4>{2, 150, 3, 8}, std::array<index_t, 4>{1, 64, 2, 32},
                            std::array<index_t, 4>{3, 5, 1, 4}}) {
    const index_t B = shape[0], T = shape[1], H = shape[2], hs = shape[3], C = H * hs, N = B * T, K = 3;
    const index_t R = B * H * T;
    INFO("B " << B << " T " << T << " H " << H << " hs " << hs);
    std::mt19937 g(unsigned(B * 1000 + T));
    // Planes: value, K tangents, K second-order. Amplitude 1.5 gives scores up
    // to ~1.5^2 sqrt(hs), so the softmax is far from uniform.
    Planes qkv = random_planes((1 + 2 * K) * N * 3 * C, g, 1.5f);
    Planes dy = random_planes(N * C, g, 1.0f);

    SECTION("forward") {
      View1<float> y("y", N * C), lse("lse", R);
      View1<double> yr("yr", N * C), lser("lser", R);
      Kokkos::deep_copy(y, std::nanf(""));
      attention_forward<float>(space, act(y, K, N, C, false, false), act1(lse, K, R, false, false),
                               act(qkv.f, K, N, 3 * C, false, false), B, T, int(H));
      attention_forward<double>(space, act(yr, K, N, C, false, false), act1(lser, K, R, false, false),
                                act(qkv.d, K, N, 3 * C, false, false), B, T, int(H));
      compare(y, yr, 1, N * C, hs, T, "y");
      compare(lse, lser, 1, R, hs, T, "lse");
    }
    SECTION("second-order forward, three directions") {
      View1<float> y("y", (1 + 2 * K) * N * C), lse("lse", (1 + 2 * K) * R);
      View1<double> yr("yr", (1 + 2 * K) * N * C), lser("lser", (1 + 2 * K) * R);
      Kokkos::deep_copy(y, std::nanf(""));
      attention_forward<Jet2<float>>(space, act(y, K, N, C, true, true), act1(lse, K, R, true, true),
                                     act(qkv.f, K, N, 3 * C, true, true), B, T, int(H));
      attention_forward<Jet2<double>>(space, act(yr, K, N, C, true, true), act1(lser, K, R, true, true),
                                      act(qkv.d, K, N, 3 * C, true, true), B, T, int(H));
      compare(y, yr, 1 + 2 * K, N * C, hs, T, "y planes");
      compare(lse, lser, 1 + 2 * K, R, hs, T, "lse planes");
    }
    SECTION("second-order forward with qkv'' taken as zero (adjoint cuts)") {
      // Host tiles skip the products of qkv'' and leave its planes alone; the
      // portable rows zero the planes and run as usual: the same values.
      View1<float> y("y", (1 + 2 * K) * N * C), lse("lse", (1 + 2 * K) * R);
      View1<double> yr("yr", (1 + 2 * K) * N * C), lser("lser", (1 + 2 * K) * R);
      Kokkos::deep_copy(y, std::nanf(""));
      const float before = qkv.f((1 + K) * N * 3 * C);
      attention_forward<Jet2<float>>(space, act(y, K, N, C, true, true), act1(lse, K, R, true, true),
                                     act(qkv.f, K, N, 3 * C, true, true), B, T, int(H), false, default_row_shape(),
                                     false);
      attention_forward<Jet2<double>>(space, act(yr, K, N, C, true, true), act1(lser, K, R, true, true),
                                      act(qkv.d, K, N, 3 * C, true, true), B, T, int(H), false, default_row_shape(),
                                      false);
      REQUIRE(qkv.f((1 + K) * N * 3 * C) == before);
      REQUIRE(qkv.d((1 + K) * N * 3 * C) == 0.0);
      compare(y, yr, 1 + 2 * K, N * C, hs, T, "y planes");
      compare(lse, lser, 1 + 2 * K, R, hs, T, "lse planes");
    }
    SECTION("tangent forward, three directions") {
      View1<float> y("y", (1 + K) * N * C), lse("lse", (1 + K) * R);
      View1<double> yr("yr", (1 + K) * N * C), lser("lser", (1 + K) * R);
      Kokkos::deep_copy(y, std::nanf(""));
      attention_forward<Dual<float>>(space, act(y, K, N, C, true, false), act1(lse, K, R, true, false),
                                     act(qkv.f, K, N, 3 * C, true, false), B, T, int(H));
      attention_forward<Dual<double>>(space, act(yr, K, N, C, true, false), act1(lser, K, R, true, false),
                                      act(qkv.d, K, N, 3 * C, true, false), B, T, int(H));
      compare(y, yr, 1 + K, N * C, hs, T, "y planes");
      compare(lse, lser, 1 + K, R, hs, T, "lse planes");
    }
    SECTION("tangent of the reverse, three directions") {
      Planes dyk = random_planes((1 + K) * N * C, g, 1.0f);
      View1<float> y("y", (1 + K) * N * C), lse("lse", (1 + K) * R), dqkv("dqkv", (1 + K) * N * 3 * C),
          D("D", (1 + K) * R);
      View1<double> yr("yr", (1 + K) * N * C), lser("lser", (1 + K) * R), dqkvr("dqkvr", (1 + K) * N * 3 * C),
          Dr("Dr", (1 + K) * R);
      attention_forward<Dual<float>>(space, act(y, K, N, C, true, false), act1(lse, K, R, true, false),
                                     act(qkv.f, K, N, 3 * C, true, false), B, T, int(H));
      attention_forward<Dual<double>>(space, act(yr, K, N, C, true, false), act1(lser, K, R, true, false),
                                      act(qkv.d, K, N, 3 * C, true, false), B, T, int(H));
      Kokkos::deep_copy(dqkv, std::nanf(""));
      attention_reverse<Dual<float>>(space, act(dqkv, K, N, 3 * C, true, false), act1(D, K, R, true, false),
                                     act(dyk.f, K, N, C, true, false), act(qkv.f, K, N, 3 * C, true, false),
                                     act(y, K, N, C, true, false), act1(lse, K, R, true, false), B, T, int(H));
      attention_reverse<Dual<double>>(space, act(dqkvr, K, N, 3 * C, true, false), act1(Dr, K, R, true, false),
                                      act(dyk.d, K, N, C, true, false), act(qkv.d, K, N, 3 * C, true, false),
                                      act(yr, K, N, C, true, false), act1(lser, K, R, true, false), B, T, int(H));
      compare(dqkv, dqkvr, 1 + K, N * 3 * C, hs, T, "dqkv planes");
      compare(D, Dr, 1 + K, R, hs, T, "D planes");
    }
    SECTION("reverse") {
      View1<float> y("y", N * C), lse("lse", R), dqkv("dqkv", N * 3 * C), D("D", R);
      View1<double> yr("yr", N * C), lser("lser", R), dqkvr("dqkvr", N * 3 * C), Dr("Dr", R);
      attention_forward<float>(space, act(y, K, N, C, false, false), act1(lse, K, R, false, false),
                               act(qkv.f, K, N, 3 * C, false, false), B, T, int(H));
      attention_forward<double>(space, act(yr, K, N, C, false, false), act1(lser, K, R, false, false),
                                act(qkv.d, K, N, 3 * C, false, false), B, T, int(H));
      Kokkos::deep_copy(dqkv, std::nanf(""));
      attention_reverse<float>(space, act(dqkv, K, N, 3 * C, false, false), act1(D, K, R, false, false),
                               act(dy.f, K, N, C, false, false), act(qkv.f, K, N, 3 * C, false, false),
                               act(y, K, N, C, false, false), act1(lse, K, R, false, false), B, T, int(H));
      attention_reverse<double>(space, act(dqkvr, K, N, 3 * C, false, false), act1(Dr, K, R, false, false),
                                act(dy.d, K, N, C, false, false), act(qkv.d, K, N, 3 * C, false, false),
                                act(yr, K, N, C, false, false), act1(lser, K, R, false, false), B, T, int(H));
      compare(dqkv, dqkvr, 1, N * 3 * C, hs, T, "dqkv");
      compare(D, Dr, 1, R, hs, T, "D");
      if (host::attention_available()) {
        // The probabilities kept by the forward (the gradient engine's, at short
        // contexts): the forward's y and lse keep their bits, and the reverse
        // from them agrees with the double reference as closely.
        View1<float> yk("yk", N * C), lsek("lsek", R), dqkvk("dqkvk", N * 3 * C), Dk("Dk", R);
        View1<float> P("P", B * H * host::attention_kept_elements(T));
        Kokkos::deep_copy(P, std::nanf(""));
        attention_forward<float>(space, act(yk, K, N, C, false, false), act1(lsek, K, R, false, false),
                                 act(qkv.f, K, N, 3 * C, false, false), B, T, int(H), false, default_row_shape(), true,
                                 P.data());
        REQUIRE(std::memcmp(yk.data(), y.data(), sizeof(float) * N * C) == 0);
        REQUIRE(std::memcmp(lsek.data(), lse.data(), sizeof(float) * R) == 0);
        Kokkos::deep_copy(dqkvk, std::nanf(""));
        attention_reverse<float>(space, act(dqkvk, K, N, 3 * C, false, false), act1(Dk, K, R, false, false),
                                 act(dy.f, K, N, C, false, false), act(qkv.f, K, N, 3 * C, false, false),
                                 act(yk, K, N, C, false, false), act1(lsek, K, R, false, false), B, T, int(H), false,
                                 default_row_shape(), P.data());
        compare(dqkvk, dqkvr, 1, N * 3 * C, hs, T, "dqkv from the kept probabilities");
        compare(Dk, Dr, 1, R, hs, T, "D from the kept probabilities");
      }
    }
  }
}

TEST_CASE("tiled host attention: any split of the (sequence, head) pairs gives the same bits",
          "[attention][host][threads]") {
  // Threads on one rank take disjoint ranges of the B*H pairs; each pair's
  // outputs (its y and lse rows, its q, k and v columns of dqkv) are written by
  // its own range alone, so the split cannot change a bit.
  if (!host::attention_available()) return;
  const index_t B = 2, T = 150, H = 3, hs = 8, C = H * hs, N = B * T, K = 2, R = B * H * T, BH = B * H;
  std::mt19937 g(17);
  Planes qkv = random_planes((1 + 2 * K) * N * 3 * C, g, 1.5f);
  Planes dy = random_planes((1 + K) * N * C, g, 1.0f);
  const std::vector<std::vector<index_t>> splits = {{0, BH}, {0, 1, BH}, {0, 1, 4, BH}, {0, 2, 3, 5, BH}};
  std::vector<std::vector<float>> outs;
  for (const auto& cut : splits) {
    std::vector<float> y((1 + 2 * K) * N * C, std::nanf("")), lse((1 + 2 * K) * R, std::nanf(""));
    std::vector<float> yd((1 + K) * N * C, std::nanf("")), lsed((1 + K) * R, std::nanf(""));
    std::vector<float> dqkv((1 + K) * N * 3 * C, std::nanf("")), D((1 + K) * R, std::nanf(""));
    const float* q = qkv.f.data();
    const QkvLayout L = QkvLayout::fused(H, H, hs);
    auto part = [&](const float* p) {
      Qkv3<const float> r;
      for (int i = 0; i < 3; ++i) r.p[i] = p, r.ld[i] = 3 * C;
      return r;
    };
    auto out = [&](float* p) {
      Qkv3<float> r;
      for (int i = 0; i < 3; ++i) r.p[i] = p, r.ld[i] = 3 * C;
      return r;
    };
    for (std::size_t i = 0; i + 1 < cut.size(); ++i) {
      host::attention_forward_jet2(y.data(), y.data() + N * C, y.data() + (1 + K) * N * C, lse.data(), lse.data() + R,
                                   lse.data() + (1 + K) * R, part(q), part(q + N * 3 * C),
                                   part(q + (1 + K) * N * 3 * C), K, L, B, T, cut[i], cut[i + 1]);
      host::attention_forward_dual(yd.data(), yd.data() + N * C, lsed.data(), lsed.data() + R, part(q),
                                   part(q + N * 3 * C), K, L, B, T, cut[i], cut[i + 1]);
    }
    for (std::size_t i = 0; i + 1 < cut.size(); ++i)
      host::attention_reverse_dual(out(dqkv.data()), out(dqkv.data() + N * 3 * C), D.data(), D.data() + R, dy.f.data(),
                                   dy.f.data() + N * C, part(q), part(q + N * 3 * C), yd.data(), yd.data() + N * C,
                                   lsed.data(), lsed.data() + R, K, L, B, T, cut[i], cut[i + 1]);
    std::vector<float> all;
    for (const auto* v : {&y, &lse, &yd, &lsed, &dqkv, &D}) {
      REQUIRE(std::all_of(v->begin(), v->end(), [](float x) { return std::isfinite(x); }));
      all.insert(all.end(), v->begin(), v->end());
    }
    outs.push_back(std::move(all));
  }
  for (std::size_t s = 1; s < outs.size(); ++s) {
    INFO("split " << s);
    REQUIRE(std::memcmp(outs[s].data(), outs[0].data(), sizeof(float) * outs[0].size()) == 0);
  }
}
