// SPDX-License-Identifier: BSD-3-Clause
// Mapped batches of products; see gemm_mapped.hpp.
#include "kernels/gemm_mapped.hpp"

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bf16.hpp"
#include "kernels/blas.hpp"
#include "kernels/host_gemm.hpp"

namespace gnh::kernels {

namespace {
// Writes the pointer arrays of the queued products: product j's A at
// first[j], its B and C count[j] and 2 count[j] after.
template <class T>
struct QueuedPointers {
  MappedProduct<T> q[MappedQueue<T>::kMax];
  index_t first[MappedQueue<T>::kMax + 1];
  int n;
  View1<std::uintptr_t> p;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i) const {
    int j = 0;
    while (j + 1 < n && i >= first[j + 1]) ++j;
    const index_t c = (first[j + 1] - first[j]) / 3, r = i - first[j], item = r % c;
    const MappedProduct<T>& m = q[j];
    const void* a = r < c       ? static_cast<const void*>(m.A.at(m.e, item))
                    : r < 2 * c ? static_cast<const void*>(m.B.at(m.e, item))
                                : static_cast<const void*>(m.C.at(m.e, item));
    p(i) = reinterpret_cast<std::uintptr_t>(a);
  }
};

#ifdef GNH_CUBLAS_MATH_MODE

// One product's call on its pointer arrays at p (A, B, C: count each).
template <class T>
void cublas_mapped(const ExecSpace& space, bool tf32, const MappedProduct<T>& m, const std::uintptr_t* p,
                   index_t count) {
  const cublasHandle_t handle = detail::cublas_on(space, false, "gnh::gemm_mapped");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasOperation_t oa = m.tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = m.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  constexpr bool is_float = std::is_same_v<T, float>;
  const cudaDataType_t type = is_float ? CUDA_R_32F : CUDA_R_64F;
  // Operands stored as bfloat16: bfloat16 tensor cores, FP32 accumulation and C.
  const cudaDataType_t in = m.A.half ? CUDA_R_16BF : type;
  const cublasComputeType_t compute =
      is_float ? (tf32 && !m.A.half ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_64F;
  const void* const* a = reinterpret_cast<const void* const*>(p);
  void* const* c = reinterpret_cast<void* const*>(p + 2 * count);
  detail::cublas_check(
      cublasGemmBatchedEx(handle, oa, ob, int(m.n), int(m.m), int(m.k), &m.alpha, a + count, in, int(m.B.ld), a, in,
                          int(m.A.ld), &m.beta, c, type, int(m.C.ld), int(count), compute, CUBLAS_GEMM_DEFAULT),
      "gnh::gemm_mapped", "mapped products", count, m.m, m.n, m.k);
}
#else
// One product's items on the host, from its pointer arrays at p (A, B, C:
// count each): in parallel over the space's threads, one item a thread.
// A stored operand of r x c (ld apart) as floats, rows c apart: bfloat16
// widened exactly.
template <class T>
std::vector<T> widened(const std::uintptr_t at, index_t r, index_t c, index_t ld) {
  std::vector<T> w(std::size_t(r * c));
  const auto* h = reinterpret_cast<const std::uint16_t*>(at);
  for (index_t i = 0; i < r; ++i)
    for (index_t j = 0; j < c; ++j) w[std::size_t(i * c + j)] = T(bf16_value(h[i * ld + j]));
  return w;
}

template <class T>
void host_mapped(const ExecSpace& space, const MappedProduct<T>& m, const std::uintptr_t* p, index_t count) {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible,
                "gnh::gemm_mapped runs on cuBLAS or on a host backend");
  const auto body = [=](const index_t i) {
    if (m.A.half) {
      // op(A) is m x k: A is k x m when transposed; likewise B.
      const index_t ar = m.ta ? m.k : m.m, ac = m.ta ? m.m : m.k, br = m.tb ? m.n : m.k, bc = m.tb ? m.k : m.n;
      const std::vector<T> a = widened<T>(p[i], ar, ac, m.A.ld), b = widened<T>(p[count + i], br, bc, m.B.ld);
      host::gemm_one(m.ta, m.tb, m.m, m.n, m.k, m.alpha, a.data(), ac, b.data(), bc, m.beta,
                     reinterpret_cast<T*>(p[2 * count + i]), m.C.ld);
      return;
    }
    host::gemm_one(m.ta, m.tb, m.m, m.n, m.k, m.alpha, reinterpret_cast<const T*>(p[i]), m.A.ld,
                   reinterpret_cast<const T*>(p[count + i]), m.B.ld, m.beta, reinterpret_cast<T*>(p[2 * count + i]),
                   m.C.ld);
  };
  if (space.concurrency() <= 1 || count == 1) {
    for (index_t i = 0; i < count; ++i) body(i);
    return;
  }
  Kokkos::parallel_for("gnh::gemm_mapped::host",
                       Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t> >(space, 0, count), body);
  space.fence();
}
#endif
}  // namespace

template <class T>
void MappedQueue<T>::add(const MappedProduct<T>& p) {
  const index_t need = 3 * p.e.count();
  if (p.e.count() <= 0 || p.m <= 0 || p.n <= 0) return;
  if (p.A.half != p.B.half || p.C.half || (p.A.half && !std::is_same<T, float>::value))
    throw std::logic_error("gnh::gemm_mapped: bfloat16 storage is for both operands of a float product, not its C");
  if (n_ == kMax || used_ + need > scratch_.capacity()) flush();
  if (need > scratch_.capacity())
    throw std::logic_error("gnh::gemm_mapped: pointer scratch of " + std::to_string(scratch_.capacity()) +
                           " holds no batch of " + std::to_string(p.e.count()) + " products");
  q_[n_++] = p;
  used_ += need;
}

template <class T>
void MappedQueue<T>::flush() {
  if (n_ == 0) return;
  // The pointers of every queued product in one kernel, on every backend
  // (the host reads its products' operands from them too, so that the path
  // and its launches are the GPU's).
  QueuedPointers<T> f{};
  f.n = n_;
  f.p = scratch_.pointers;
  f.first[0] = 0;
  for (int j = 0; j < n_; ++j) {
    f.q[j] = q_[j];
    f.first[j + 1] = f.first[j] + 3 * q_[j].e.count();
  }
  record_traffic("gnh::gemm_mapped::pointers", double(used_ * sizeof(std::uintptr_t)), 0);
  Kokkos::parallel_for("gnh::gemm_mapped::pointers", range(space_, used_), f);
#ifndef GNH_CUBLAS_MATH_MODE
  space_.fence();
#endif
  for (int j = 0; j < n_; ++j) {
    // A region per product: what profilers and the launch count see of a library call.
    const detail::GemmRegion region("gnh::gemm_mapped");
    record_gemm<T>("gnh::gemm_mapped", tf32_ || q_[j].A.half, q_[j].m, q_[j].n, q_[j].k, q_[j].e.count(),
                   q_[j].A.half ? 2 : sizeof(T), q_[j].beta != T(0));
#ifdef GNH_CUBLAS_MATH_MODE
    cublas_mapped(space_, tf32_, q_[j], scratch_.pointers.data() + f.first[j], q_[j].e.count());
#else
    (void)tf32_;
    host_mapped(space_, q_[j], scratch_.pointers.data() + f.first[j], q_[j].e.count());
#endif
  }
  n_ = 0;
  used_ = 0;
}

template class MappedQueue<float>;
template class MappedQueue<double>;

}  // namespace gnh::kernels
