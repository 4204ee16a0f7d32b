// SPDX-License-Identifier: BSD-3-Clause
// Batches of products C_i = alpha op(A_i) op(B_i) + beta C_i whose operands
// sit at affine offsets of a four-part batch index: product i = (i0, i1, i2,
// i3), row-major over the batch's extents, reads X_i = base + sum_j i_j
// stride_j, rows ld apart. Attention's products over (direction, sequence,
// key/value head, query head of the group) are such a batch, none of them one
// stride apart (a head's columns are strided within a row, a sequence's rows
// are a block, a direction's plane is another).
//
// On CUDA with cuBLAS: one kernel writes the pointer arrays of a queue of
// such batches into the caller's scratch, and one cublasGemmBatchedEx call
// runs each batch (tensor cores: TF32 math for float under the tf32 policy,
// bfloat16 for operands stored as bfloat16 (Mapped::half) with FP32
// accumulation and C; FP64 for double). No host round trip, no fence.
// On host backends: the same kernel writes the same pointers, and each
// batch's products run in parallel over the space's threads from them, each
// on one thread (gnh's sgemm for float where the CPU has one, else the vendor
// BLAS; a plain loop for double where the link has no BLAS; bfloat16
// operands widened to float first, exactly), so the bits do not depend on the
// thread count. Two products of one batch must not write
// the same C.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/types.hpp"

namespace gnh::kernels {

struct BatchExtents {
  index_t n[4] = {1, 1, 1, 1};
  KOKKOS_INLINE_FUNCTION index_t count() const { return n[0] * n[1] * n[2] * n[3]; }
};

// The address `off` elements past p, of T or, half, of bfloat16 storage
// (16 bits; an operand stored so is addressed through a T* all the same).
template <class T>
KOKKOS_INLINE_FUNCTION T* mapped_at(T* p, index_t off, bool half) {
  using U = std::conditional_t<std::is_const<T>::value, const std::uint16_t, std::uint16_t>;
  return half ? reinterpret_cast<T*>(reinterpret_cast<U*>(p) + off) : p + off;
}

// half: the operand is stored as bfloat16 (its ld and strides count those):
// a float product's A and B both or neither, never its C.
template <class T>
struct Mapped {
  T* base = nullptr;
  index_t ld = 0;
  index_t stride[4] = {0, 0, 0, 0};
  bool half = false;
  KOKKOS_INLINE_FUNCTION T* at(const BatchExtents& e, index_t i) const {
    const index_t i3 = i % e.n[3], i2 = (i / e.n[3]) % e.n[2], i1 = (i / (e.n[3] * e.n[2])) % e.n[1],
                  i0 = i / (e.n[3] * e.n[2] * e.n[1]);
    return mapped_at(base, i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3], half);
  }
};

// The pointer arrays of a queue: three per queued product, this many
// pointers in all (written on every backend; cuBLAS reads them on a GPU, the
// host's loop on a host).
// (Addresses as integers: a View's element type cannot be a pointer.)
struct MappedScratch {
  View1<std::uintptr_t> pointers;
  index_t capacity() const { return index_t(pointers.extent(0)); }
};

// One batch of products: C_i = alpha op(A_i) op(B_i) + beta C_i, each m x n
// with inner dimension k, for every i of e.
template <class T>
struct MappedProduct {
  bool ta = false, tb = false;
  index_t m = 0, n = 0, k = 0;
  T alpha = T(1), beta = T(0);
  Mapped<const T> A, B;
  Mapped<T> C;
  BatchExtents e;
  MappedProduct() = default;
  MappedProduct(bool ta_, bool tb_, index_t m_, index_t n_, index_t k_, T alpha_, const Mapped<const T>& A_,
                const Mapped<const T>& B_, T beta_, const Mapped<T>& C_, const BatchExtents& e_)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_), alpha(alpha_), beta(beta_), A(A_), B(B_), C(C_), e(e_) {}
};

// Products issued in order on one execution-space instance. On CUDA, flush()
// writes the pointer arrays of every queued product in one kernel and then
// makes one cublasGemmBatchedEx call per product: kMax products for one
// small launch (32: the causal blocks of attention's products, four to eight
// a product, for several products; the kernel's argument, 32 products'
// maps, is about 7 KB). A product that reads the C of another queued product must
// come after it in the queue (they run in order). tf32: float products in
// TF32 tensor-core math where the backend has it (cuBLAS), exact FP32
// elsewhere.
template <class T>
class MappedQueue {
 public:
  static constexpr int kMax = 32;
  MappedQueue(const ExecSpace& space, bool tf32, const MappedScratch& scratch)
      : space_(space), tf32_(tf32), scratch_(scratch) {}
  MappedQueue(const MappedQueue&) = delete;
  MappedQueue& operator=(const MappedQueue&) = delete;
  // Flushes first when the queue or the pointer scratch is full.
  void add(const MappedProduct<T>& p);
  void flush();
  const ExecSpace& space() const { return space_; }

 private:
  ExecSpace space_;
  bool tf32_;
  MappedScratch scratch_;
  MappedProduct<T> q_[kMax];
  int n_ = 0;
  index_t used_ = 0;  // pointers the queued products need
};

}  // namespace gnh::kernels
