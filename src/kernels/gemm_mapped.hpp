// SPDX-License-Identifier: BSD-3-Clause
// Batches of products C_i = alpha op(A_i) op(B_i) + beta C_i whose operands
// sit at affine offsets of a four-part batch index: product i = (i0, i1, i2,
// i3), row-major over the batch's extents, reads X_i = base + sum_j i_j
// stride_j, rows ld apart. Attention's products over (direction, sequence,
// key/value head, query head of the group) are such a batch, none of them one
// stride apart (a head's columns are strided within a row, a sequence's rows
// are a block, a direction's plane is another).
//
// On CUDA with cuBLAS: per group of at most `capacity` products, one kernel
// writes the three pointer arrays into the caller's scratch and one
// cublasGemmBatchedEx call runs them (tensor cores: TF32 math for float under
// the tf32 policy; FP64 for double). No host round trip, no fence.
// On host backends: the products in parallel over the space's threads, each
// on one thread (gnh's sgemm for float where the CPU has one, else the vendor
// BLAS; a plain loop for double where the link has no BLAS), so the bits do
// not depend on the thread count. Two products of one call must not write the
// same C.
#pragma once
#include <cstdint>

#include "core/types.hpp"

namespace gnh::kernels {

struct BatchExtents {
  index_t n[4] = {1, 1, 1, 1};
  KOKKOS_INLINE_FUNCTION index_t count() const { return n[0] * n[1] * n[2] * n[3]; }
};

template <class T>
struct Mapped {
  T* base = nullptr;
  index_t ld = 0;
  index_t stride[4] = {0, 0, 0, 0};
  KOKKOS_INLINE_FUNCTION T* at(const BatchExtents& e, index_t i) const {
    const index_t i3 = i % e.n[3], i2 = (i / e.n[3]) % e.n[2], i1 = (i / (e.n[3] * e.n[2])) % e.n[1],
                  i0 = i / (e.n[3] * e.n[2] * e.n[1]);
    return base + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }
};

// The products per pointer-array group on CUDA: the scratch holds three
// arrays of this many pointers. Host backends need none.
// (Addresses as integers: a View's element type cannot be a pointer.)
struct MappedScratch {
  View1<std::uintptr_t> pointers;
  index_t capacity() const { return index_t(pointers.extent(0)) / 3; }
};

// C_i = alpha op(A_i) op(B_i) + beta C_i, each m x n with inner dimension k,
// for every i of e. tf32: float products in TF32 tensor-core math where that
// is what the backend has (cuBLAS), exact FP32 elsewhere.
template <class T>
void gemm_mapped(const ExecSpace& space, bool tf32, bool ta, bool tb, index_t m, index_t n, index_t k, T alpha,
                 const Mapped<const T>& A, const Mapped<const T>& B, T beta, const Mapped<T>& C, const BatchExtents& e,
                 const MappedScratch& scratch);

namespace host {
// One product on the calling thread (row-major, lda/ldb/ldc the row strides).
void gemm_one(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* A,
              std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);
void gemm_one(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* A,
              std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc);
}  // namespace host

}  // namespace gnh::kernels
