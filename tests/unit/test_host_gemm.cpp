// SPDX-License-Identifier: BSD-3-Clause
// gnh's host sgemm (kernels/host_gemm.cpp) against a double reference, for
// every kernel this CPU supports, at sizes that hit every edge of its blocking.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/blas.hpp"
#include "kernels/gemm_probe.hpp"
#include "kernels/host_gemm.hpp"
#include "kernels/host_parallel.hpp"

// OpenBLAS's thread control, where the BLAS linked is OpenBLAS.
extern "C" {
void openblas_set_num_threads(int threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

using namespace gnh;
using namespace gnh::kernels;

namespace {

struct Problem {
  bool ta, tb;
  std::int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  std::vector<float> A, B, C0;
};

Problem make(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, float beta,
             std::int64_t pad, unsigned seed) {
  Problem p{ta, tb, m, n, k, 0, 0, 0, alpha, beta, {}, {}, {}};
  p.lda = (ta ? m : k) + pad;
  p.ldb = (tb ? k : n) + pad;
  p.ldc = n + pad;
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p.A.resize(std::size_t((ta ? k : m) * p.lda));
  p.B.resize(std::size_t((tb ? n : k) * p.ldb));
  p.C0.resize(std::size_t(m * p.ldc));
  for (auto& x : p.A) x = u(g);
  for (auto& x : p.B) x = u(g);
  for (auto& x : p.C0) x = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : u(g);
  return p;
}

float a_at(const Problem& p, std::int64_t i, std::int64_t q) { return p.ta ? p.A[q * p.lda + i] : p.A[i * p.lda + q]; }
float b_at(const Problem& p, std::int64_t q, std::int64_t j) { return p.tb ? p.B[j * p.ldb + q] : p.B[q * p.ldb + j]; }

// Checks C against the double-precision product. Bound: a k-term FMA chain in
// float has error <= k u sum|a b| (u = 2^-24, first order), and the alpha and
// beta updates add 3 more roundings of terms bounded by |alpha| sum|a b| and
// |beta c|; the padding between rows must be untouched.
void check(const Problem& p, const std::vector<float>& C) {
  const double u = std::ldexp(1.0, -24);
  for (std::int64_t i = 0; i < p.m; ++i) {
    for (std::int64_t j = 0; j < p.n; ++j) {
      double s = 0, sa = 0;
      for (std::int64_t q = 0; q < p.k; ++q) {
        const double t = double(a_at(p, i, q)) * double(b_at(p, q, j));
        s += t;
        sa += std::fabs(t);
      }
      const double c0 = p.C0[i * p.ldc + j];
      const double ref = p.alpha * s + (p.beta == 0.0f ? 0.0 : p.beta * c0);
      const double tol = (p.k + 3) * u * (std::fabs(p.alpha) * sa + (p.beta == 0.0f ? 0.0 : std::fabs(p.beta * c0)));
      const double got = C[i * p.ldc + j];
      INFO("m " << p.m << " n " << p.n << " k " << p.k << " ta " << p.ta << " tb " << p.tb << " at " << i << "," << j);
      REQUIRE(std::isfinite(got));
      REQUIRE(std::fabs(got - ref) <= tol);
    }
    for (std::int64_t j = p.n; j < p.ldc; ++j) {
      const float before = p.C0[i * p.ldc + j], after = C[i * p.ldc + j];
      REQUIRE(std::memcmp(&before, &after, sizeof(float)) == 0);
    }
  }
}

std::vector<float> run(host::GemmKernel kernel, const Problem& p) {
  std::vector<float> C = p.C0;
  REQUIRE(host::sgemm_using(kernel, p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.A.data(), p.lda, p.B.data(), p.ldb, p.beta,
                            C.data(), p.ldc));
  return C;
}

std::vector<host::GemmKernel> kernels_here() {
  std::vector<host::GemmKernel> ks;
  for (auto k : {host::GemmKernel::avx2, host::GemmKernel::avx512})
    if (host::supported(k)) ks.push_back(k);
  return ks;
}

}  // namespace

TEST_CASE("host sgemm matches the double product at blocking edges", "[host_gemm]") {
  const auto ks = kernels_here();
  if (ks.empty()) {
    // No x86 vector kernel on this CPU: the entry point must decline, so that
    // every caller takes the vendor BLAS.
    REQUIRE_FALSE(host::sgemm_using(host::GemmKernel::avx512, false, false, 1, 1, 1, 1.0f, nullptr, 1, nullptr, 1, 0.0f,
                                    nullptr, 1));
    return;
  }
  unsigned seed = 1;
  // Sizes around the register tiles (6/12 rows, 16/32 columns), the packed
  // blocks (MC 120 rows, KC 256 deep) and one NC (2048 columns) crossing.
  const std::int64_t dims[][3] = {{1, 1, 1},      {5, 7, 3},      {12, 32, 1},   {13, 33, 17}, {6, 16, 256},
                                  {121, 47, 257}, {240, 64, 513}, {31, 2049, 9}, {7, 130, 600}};
  for (auto kernel : ks) {
    for (const auto& d : dims)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        for (const auto& ab : {std::pair<float, float>{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 0.25f}}) {
          const Problem p = make(ta, tb, d[0], d[1], d[2], ab.first, ab.second, (seed % 3) * 5, seed);
          ++seed;
          check(p, run(kernel, p));
        }
      }
  }
}

TEST_CASE("host sgemm: a row's result does not depend on the rows around it", "[host_gemm]") {
  // The same C(i,:) whether it is computed alone or inside a larger block,
  // bit for bit: what makes results independent of batch size and padding.
  for (auto kernel : kernels_here()) {
    for (int t = 0; t < 4; ++t) {
      const Problem p = make(t & 1, t & 2, 131, 77, 300, 1.0f, 0.0f, 0, 99 + t);
      const std::vector<float> C = run(kernel, p);
      for (std::int64_t i : {0, 11, 12, 119, 120, 130}) {
        // One row: op(A) restricted to row i, the same op(B).
        Problem r = p;
        r.m = 1;
        if (p.ta) {  // A stored (k, m): take column i
          r.lda = 1;
          r.A.assign(std::size_t(p.k), 0.0f);
          for (std::int64_t q = 0; q < p.k; ++q) r.A[q] = p.A[q * p.lda + i];
        } else {
          r.A.assign(p.A.begin() + i * p.lda, p.A.begin() + (i + 1) * p.lda);
        }
        r.C0.assign(std::size_t(p.ldc), std::numeric_limits<float>::quiet_NaN());
        const std::vector<float> Ci = run(kernel, r);
        REQUIRE(std::memcmp(Ci.data(), C.data() + i * p.ldc, sizeof(float) * p.n) == 0);
      }
    }
  }
}

TEST_CASE("host sgemm: panels of C on any number of threads give the bits of one call", "[host_gemm][threads]") {
  // Threads on one rank each own a panel of whole rows (or columns, when C is
  // wider than tall): together the panels cover C exactly once, and every
  // element is accumulated as in one call, so the bits do not depend on the
  // thread count. Run one panel after another here, and through sgemm_on on the
  // host space's threads (OpenMP: several; Serial: one).
  const Kokkos::DefaultHostExecutionSpace host_space;
  for (auto kernel : kernels_here()) {
    for (int t = 0; t < 4; ++t)
      for (const auto& d : {std::array<std::int64_t, 3>{300, 77, 130}, std::array<std::int64_t, 3>{41, 500, 257},
                            std::array<std::int64_t, 3>{96, 96, 64}}) {
        const Problem p = make(t & 1, t & 2, d[0], d[1], d[2], 0.75f, t == 3 ? 0.0f : 0.5f, 2, 500 + t);
        const std::vector<float> whole = run(kernel, p);
        for (std::int64_t threads = 1; threads <= 7; ++threads) {
          const std::int64_t count = host::panel_count(p.m, p.n, threads);
          INFO("m " << p.m << " n " << p.n << " threads " << threads << " panels " << count);
          REQUIRE(count >= 1);
          REQUIRE(count <= threads);
          std::vector<int> owners(std::size_t(p.m * p.n), 0);
          std::vector<float> C = p.C0;
          for (std::int64_t i = 0; i < count; ++i) {
            const host::Panel q = host::panel_of(p.m, p.n, count, i);
            REQUIRE((q.m == p.m || q.n == p.n));
            REQUIRE(std::min(q.m, q.n) >= (count > 1 ? 1 : 0));
            for (std::int64_t r = q.i0; r < q.i0 + q.m; ++r)
              for (std::int64_t c = q.j0; c < q.j0 + q.n; ++c) ++owners[std::size_t(r * p.n + c)];
            REQUIRE(host::sgemm_panel(kernel, q, p.ta, p.tb, p.k, p.alpha, p.A.data(), p.lda, p.B.data(), p.ldb, p.beta,
                                      C.data(), p.ldc));
          }
          REQUIRE(std::all_of(owners.begin(), owners.end(), [](int o) { return o == 1; }));
          REQUIRE(std::memcmp(C.data(), whole.data(), sizeof(float) * C.size()) == 0);
        }
        std::vector<float> C = p.C0;
        REQUIRE(host::sgemm_on(host_space, kernel, p.ta, p.tb, p.m, p.n, p.k, p.alpha, p.A.data(), p.lda, p.B.data(),
                               p.ldb, p.beta, C.data(), p.ldc));
        host_space.fence();
        REQUIRE(std::memcmp(C.data(), whole.data(), sizeof(float) * C.size()) == 0);
      }
  }
  // The vendor BLAS per panel (what several threads of gnh's run when the
  // probe picks it) is a correct product; its bits may depend on the panel,
  // as the BLAS blocks by size.
#ifdef KOKKOSKERNELS_ENABLE_TPL_BLAS
  REQUIRE(host::vendor_panels_available());  // the link holds the host BLAS Kokkos Kernels uses
#endif
  if (host::vendor_panels_available()) {
    for (int t = 0; t < 4; ++t) {
      const Problem p = make(t & 1, t & 2, 150, 61, 97, 0.5f, 1.0f, 3, 900 + t);
      std::vector<float> C = p.C0;
      const std::int64_t count = host::panel_count(p.m, p.n, 3);
      REQUIRE(count == 3);
      for (std::int64_t i = 0; i < count; ++i)
        REQUIRE(host::sgemm_panel(host::GemmKernel::none, host::panel_of(p.m, p.n, count, i), p.ta, p.tb, p.k, p.alpha,
                                  p.A.data(), p.lda, p.B.data(), p.ldb, p.beta, C.data(), p.ldc));
      check(p, C);
    }
  }
  // Small products stay whole: a panel is at least kMinPanel wide.
  CHECK(host::panel_count(40, 40, 8) == 1);
  CHECK(host::panel_count(4 * host::kMinPanel, 8, 8) == 4);
  CHECK(host::panel_count(512, 512, 2) == 2);
}

TEST_CASE("host sgemm: the AVX2 and AVX-512 kernels agree bit for bit", "[host_gemm]") {
  // Both accumulate each C(i,j) as one FMA chain over the same KC blocks.
  if (!host::supported(host::GemmKernel::avx2) || !host::supported(host::GemmKernel::avx512)) return;
  for (int t = 0; t < 4; ++t) {
    const Problem p = make(t & 1, t & 2, 97, 301, 530, 0.75f, 0.5f, 3, 7 + t);
    const auto a = run(host::GemmKernel::avx2, p), b = run(host::GemmKernel::avx512, p);
    REQUIRE(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
  }
}

TEST_CASE("gnh::kernels::gemm on float views agrees with the vendor BLAS", "[host_gemm]") {
  const ExecSpace space;
  const index_t m = 70, n = 50, k = 90;
  View2<float> A("A", m, k), B("B", n, k), C("C", m, n), R("R", m, n);
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (index_t i = 0; i < m * k; ++i) A.data()[i] = u(g);
  for (index_t i = 0; i < n * k; ++i) B.data()[i] = u(g);
  Kokkos::deep_copy(C, std::numeric_limits<float>::quiet_NaN());
  gemm<float>(space, "N", "T", 1.0f, A, B, 0.0f, C);
  KokkosBlas::gemm("N", "T", 1.0f, A, B, 0.0f, R);
  space.fence();
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double sa = 0;
      for (index_t q = 0; q < k; ++q) sa += std::fabs(double(A(i, q)) * B(j, q));
      // Two float evaluations of the same sum, each within k u sum|ab|.
      REQUIRE(std::fabs(double(C(i, j)) - R(i, j)) <= 2 * k * std::ldexp(1.0, -24) * sa);
    }
}

TEST_CASE("an empty product writes beta C, never reading C where beta is 0", "[host_gemm]") {
  // C = 0 * A B + beta C with k = 0: beta 0 over NaN gives zeros (BLAS's
  // rule, which per-sequence gradients written with beta 0 rely on), beta 2
  // doubles C.
  const ExecSpace space;
  View2<float> A("A", 3, 0), B("B", 4, 0), C("C", 3, 4), D("D", 3, 4);
  Kokkos::deep_copy(C, std::numeric_limits<float>::quiet_NaN());
  Kokkos::deep_copy(D, 1.5f);
  gemm<float>(space, "N", "T", 1.0f, A, B, 0.0f, C);
  gemm<float>(space, "N", "T", 1.0f, A, B, 2.0f, D);
  space.fence();
  for (index_t i = 0; i < 12; ++i) {
    REQUIRE(C.data()[i] == 0.0f);
    REQUIRE(D.data()[i] == 3.0f);
  }
}

TEST_CASE("the start-up probe never picks the slower of gnh's kernel and the vendor BLAS", "[gemm][probe]") {
  using namespace gnh::kernels;
  const auto shapes = model_gemm_shapes(96, 1000, 4096);
  REQUIRE(shapes.size() == 15);  // five dense GEMMs, three orientations each
  CHECK(shapes[0].m == 512);     // rows capped
  CHECK((shapes[0].n == 288 && shapes[0].k == 96 && !shapes[0].ta && shapes[0].tb));
  CHECK((shapes[14].m == 1000 && shapes[14].n == 96 && shapes[14].k == 512 && shapes[14].ta));

  const GemmShape probe{false, true, 256, 384, 192, "probe"};
  const GemmProbe p = probe_host_gemm({probe}, 5);
  if (host::native_kernel() == host::GemmKernel::none) {
    CHECK(!p.probed);
    CHECK(p.chosen == host::GemmKernel::none);
    return;
  }
  REQUIRE(p.probed);
  REQUIRE(p.entries.size() == 1);
  // The choice follows its own measurements and the tie rule.
  CHECK((p.chosen == host::GemmKernel::none) == (p.native_total() > (1 + kProbeMargin) * p.vendor_total()));
  CHECK(p.margin == kProbeMargin);
}

TEST_CASE("the probe's tie rule on given times", "[gemm][probe]") {
  using namespace gnh::kernels;
  using host::GemmKernel;
  // Within the margin, either way, gnh's kernel: two probes of one machine
  // whose kernels are that close agree whatever their clocks said.
  for (const double vendor_over_native : {1.0, 0.999, 1.001, 0.9, 1.1, 1 / (1 + 0.99 * kProbeMargin)})
    CHECK(decide_host_gemm(GemmKernel::avx512, 1.0, vendor_over_native) == GemmKernel::avx512);
  // The vendor BLAS only when it is faster by more than the margin.
  CHECK(decide_host_gemm(GemmKernel::avx2, 1.0, 1 / (1 + 1.01 * kProbeMargin)) == GemmKernel::none);
  CHECK(decide_host_gemm(GemmKernel::avx2, 1.0, 0.5) == GemmKernel::none);
  CHECK(decide_host_gemm(GemmKernel::avx2, 1.0, 0.5, 1.5) == GemmKernel::avx2);  // a margin of its own
  // No kernel of gnh's on this CPU: the vendor's, whatever the times.
  CHECK(decide_host_gemm(GemmKernel::none, 1.0, 2.0) == GemmKernel::none);
}

TEST_CASE("a second measurement agrees with the start-up probe's choice", "[gemm][probe][bench]") {
  using namespace gnh::kernels;
  const GemmShape probe{false, true, 256, 384, 192, "probe"};
  const GemmProbe p = probe_host_gemm({probe}, 5);
  if (!p.probed) return;  // no gnh kernel on this CPU: nothing to choose
  // A second measurement agrees: the chosen kernel's best of 15 runs, the
  // two kernels taking turns so that the load of a shared 2-core machine (ctest
  // runs other tests beside this one) falls on both alike, is not above the
  // other's. The 15% allowance covers what remains: best-of-15 times of one
  // kernel here spread by up to ~10% from one measurement to the next, and two
  // kernels within that of each other may be picked either way.
  const GemmProbe again = probe_host_gemm({probe}, 15);
  const double native = again.entries.at(0).native_seconds, vendor = again.entries.at(0).vendor_seconds;
  INFO("native " << native << " s, vendor " << vendor << " s, chosen " << host::name(p.chosen));
  // gnh's kernel is kept while the vendor BLAS is faster by less than the tie
  // rule's margin, so its allowance is the margin on top.
  if (p.chosen == host::GemmKernel::none) CHECK(vendor <= 1.15 * native);
  else CHECK(native <= (1 + kProbeMargin) * 1.15 * vendor);
}

TEST_CASE("the vendor BLAS runs on gnh's threads only, one on a one-thread space", "[gemm][probe]") {
  // OpenBLAS left to itself starts a thread per core: the probe then timed
  // gnh's kernel on one thread against the vendor's on all cores, and every
  // rank of a node ran that many threads.
  if (!openblas_set_num_threads || !openblas_get_num_threads) return;  // another BLAS: nothing to check
  openblas_set_num_threads(2);
  const Kokkos::DefaultHostExecutionSpace host_space;
  float a = 2, b = 3, c = 0;
  REQUIRE_FALSE(host::sgemm_on(host_space, host::GemmKernel::none, false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c,
                               1));  // one panel: the caller's vendor BLAS, set to one thread first
  CHECK(openblas_get_num_threads() == 1);
}

TEST_CASE("select_kernel switches the dense GEMM and back", "[gemm][probe]") {
  using namespace gnh::kernels;
  const host::GemmKernel before = host::selected_kernel();
  host::select_kernel(host::GemmKernel::none);
  CHECK(host::selected_kernel() == host::GemmKernel::none);
  float a = 2, b = 3, c = 0;
  CHECK_FALSE(host::sgemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1));  // the vendor's turn
  host::select_kernel(before);
  CHECK(host::selected_kernel() == before);
}

TEST_CASE("gemm_batched: each product of a strided batch, a shared operand at stride 0", "[gemm]") {
  // The K directions of a GEMM as one batch (linear layers, LM head). On a
  // host space it is the products in turn, so the bits are those of one gemm
  // per product; the check is that operand i starts stride_i * i after the
  // first, and that stride 0 shares it.
  using gnh::index_t;
  const index_t m = 13, n = 21, k = 17, count = 3, sb = k * n + 5, sc = m * n + 7;
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> A(m * k), B(count * sb), C(count * sc), C1;
  for (auto* v : {&A, &B, &C})
    for (float& x : *v) x = u(gen);
  C1 = C;
  const std::vector<float> C0 = C;
  const ExecSpace space;
  const kernels::GemmPolicy<float> pol;
  kernels::gemm_batched<float>(space, pol, "N", "N", 2.0f, Span2<const float>(A.data(), m, k), 0,
                               Span2<const float>(B.data(), k, n), sb, 0.5f, Span2<float>(C.data(), m, n), sc, count);
  for (index_t i = 0; i < count; ++i)
    kernels::gemm<float>(space, pol, "N", "N", 2.0f, Span2<const float>(A.data(), m, k),
                         Span2<const float>(B.data() + i * sb, k, n), 0.5f, Span2<float>(C1.data() + i * sc, m, n));
  Kokkos::fence();
  REQUIRE(std::memcmp(C.data(), C1.data(), C.size() * sizeof(float)) == 0);
  // Each product is the double-precision one to rounding ((k + 2) eps of
  // its magnitude: k products summed, alpha and beta applied), and the gaps
  // between the products are left alone.
  const double e = std::numeric_limits<float>::epsilon();
  for (index_t i = 0; i < count; ++i) {
    for (index_t r = 0; r < m; ++r)
      for (index_t c = 0; c < n; ++c) {
        double want = 0.5 * double(C0[i * sc + r * n + c]), mag = std::fabs(want);
        for (index_t p = 0; p < k; ++p) {
          const double t = 2.0 * double(A[r * k + p]) * double(B[i * sb + p * n + c]);
          want += t;
          mag += std::fabs(t);
        }
        REQUIRE(std::fabs(double(C[i * sc + r * n + c]) - want) <= double(k + 2) * e * mag);
      }
    for (index_t g = m * n; g < sc; ++g) REQUIRE(C[i * sc + g] == C0[i * sc + g]);
  }
}
