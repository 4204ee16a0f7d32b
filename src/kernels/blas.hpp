// SPDX-License-Identifier: BSD-3-Clause
// The one GEMM entry point of the kernels: C = alpha op(A) op(B) + beta C on
// contiguous row-major blocks (the only shape Kokkos Kernels hands to the vendor
// BLAS; a strided operand silently falls back to a native kernel ~15x slower).
#pragma once
#include <KokkosBlas3_gemm.hpp>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "core/bf16.hpp"
#include "core/types.hpp"
#include "kernels/gemm_ledger.hpp"
#include "kernels/host_gemm.hpp"
#include "kernels/host_parallel.hpp"
#include "kernels/check.hpp"
#include "kernels/instances.hpp"
#include "kernels/room.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
#include <cublas_v2.h>

#include <sstream>
#include <string>
#define GNH_CUBLAS_MATH_MODE 1
#endif

namespace gnh::kernels {

// Whether the tf32 policy multiplies in TF32 on tensor cores here (CUDA with
// cuBLAS); on every other backend TF32 is FP32.
#ifdef GNH_CUBLAS_MATH_MODE
inline constexpr bool tf32_tensor_cores = true;
#else
inline constexpr bool tf32_tensor_cores = false;
#endif

#ifdef GNH_CUBLAS_MATH_MODE
namespace detail {
// gnh's own cuBLAS handle, one per process: created on first use (after
// Kokkos started the device), destroyed when Kokkos finalizes. Its stream and
// math mode are set per call (cublas_on), so Kokkos Kernels' handle, and any
// other library's, is never touched.
inline cublasHandle_t cublas_handle() {
  static const cublasHandle_t handle = [] {
    cublasHandle_t h{};
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("gnh::gemm: cublasCreate failed");
    Kokkos::push_finalize_hook([h] { cublasDestroy(h); });
    return h;
  }();
  return handle;
}

// The handle on the caller's stream, in TF32 tensor-core math
// (CUBLAS_TF32_TENSOR_OP_MATH: float operands rounded to 10-bit mantissas,
// FP32 accumulation) or in the default math (exact FP32; bfloat16 operands
// with FP32 compute as the call asks).
inline cublasHandle_t cublas_on(const ExecSpace& space, bool tf32, const char* who) {
  const cublasHandle_t h = cublas_handle();
  if (cublasSetStream(h, space.cuda_stream()) != CUBLAS_STATUS_SUCCESS ||
      cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(who) + ": cannot set the cuBLAS stream and math mode");
  return h;
}

inline void cublas_check(cublasStatus_t st, const char* who, const char* what, index_t count, index_t m, index_t n,
                         index_t k) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  std::ostringstream msg;
  msg << who << ": cuBLAS status " << int(st) << " for " << count << " " << what << " of " << m << " x " << n << " x "
      << k;
  throw std::runtime_error(msg.str());
}

// Row-major C = alpha op(A) op(B) + beta C in float on the caller's stream,
// in TF32 or exact FP32 math.
inline void cublas_sgemm(const ExecSpace& space, bool tf32, bool at, bool bt, index_t m, index_t n, index_t k,
                         float alpha, const float* A, index_t lda, const float* B, index_t ldb, float beta, float* C,
                         index_t ldc) {
  const cublasHandle_t h = cublas_on(space, tf32, "gnh::gemm");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasOperation_t oa = bt ? CUBLAS_OP_T : CUBLAS_OP_N, ob = at ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublas_check(cublasSgemm(h, oa, ob, int(n), int(m), int(k), &alpha, B, int(ldb), A, int(lda), &beta, C, int(ldc)),
               "gnh::gemm", "float products", 1, m, n, k);
}
}  // namespace detail
#endif

template <class T>
Span2<const T> block(const T* base, index_t offset, index_t rows, index_t cols) {
  return Span2<const T>(base + offset, rows, cols);
}
template <class T>
Span2<T> block(T* base, index_t offset, index_t rows, index_t cols) {
  return Span2<T>(base + offset, rows, cols);
}

namespace detail {
struct ProductShape {
  bool at, bt;
  index_t m, n, k;
};
// The m x n x k of C = op(A) op(B), the operands' extents checked against it.
template <class T>
ProductShape product_shape(const char* who, const char* ta, const char* tb, const Span2<const T>& A,
                           const Span2<const T>& B, const Span2<T>& C) {
  const bool at = ta[0] == 'T', bt = tb[0] == 'T';
  const index_t m = at ? A.extent(1) : A.extent(0), ka = at ? A.extent(0) : A.extent(1);
  const index_t kb = bt ? B.extent(1) : B.extent(0), n = bt ? B.extent(0) : B.extent(1);
  require_extent(who, "inner dimension", kb, ka);
  require_extent(who, "C rows", C.extent(0), m);
  require_extent(who, "C cols", C.extent(1), n);
  return {at, bt, m, n, ka};
}
}  // namespace detail

// op(A): "N" or "T". Empty products (a zero extent) only scale C (beta 0
// writes zeros: C is not read, as BLAS does not).
template <class T>
void gemm(const ExecSpace& space, const char* ta, const char* tb, T alpha, Span2<const T> A, Span2<const T> B, T beta,
          Span2<T> C) {
  const detail::ProductShape sh = detail::product_shape("gnh::gemm", ta, tb, A, B, C);
  const bool at = sh.at, bt = sh.bt;
  const index_t m = sh.m, n = sh.n, ka = sh.k;
  if (m == 0 || n == 0) return;
  if (ka == 0) {
    if (beta != T(1)) {
      Kokkos::parallel_for(
          "gnh::gemm::scale", range(space, m * n), KOKKOS_LAMBDA(const index_t i) {
            T& c = C(i / n, i % n);
            c = beta == T(0) ? T(0) : beta * c;
          });
    }
    return;
  }
  if constexpr (std::is_same_v<T, float> && std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace> &&
                Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible) {
    // A host space: gnh's own sgemm where the CPU has one and the start-up
    // probe chose it (host_gemm.hpp), else the vendor's; on several threads,
    // each thread takes a panel of C (host_parallel.hpp).
    // (A product on one panel runs at once in this thread: what earlier
    // kernels on the host instance wrote must be there. Host fences are cheap.)
    space.fence();
    if (host::sgemm_on(space, host::selected_kernel(), at, bt, m, n, ka, alpha, A.data(), A.stride(0), B.data(),
                       B.stride(0), beta, C.data(), C.stride(0)))
      return;
  }
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40000
  // Queued on the caller's instance (a CUDA stream: cuBLAS on that stream),
  // after the kernels before it, with no fence.
  KokkosBlas::gemm(space, ta, tb, alpha, A, B, beta, C);
#else
  space.fence();  // Kokkos Kernels 3 runs the BLAS on the default instance
  KokkosBlas::gemm(ta, tb, alpha, A, B, beta, C);
#endif
}

// The precision of matrix-multiply operands. With bf16 (the bf16-amp policy)
// each operand is rounded to bfloat16 (RNE) into scratch space, chunk by chunk
// of rows, and multiplied with FP32 accumulation; the output stays FP32.
//
// Blocks that many products read as B (the LM head's weights and their
// directions, over every logits tile) can be rounded once, ahead, by their
// owner: a product whose B (every B_i of a batch) lies within such a block
// reads its rounded copy and rounds nothing. The copy multiplies the same
// bfloat16 values, so no bit changes.
template <class T>
struct RoundedAhead {
  const T* src = nullptr;  // count blocks of size elements, stride apart
  index_t size = 0, count = 0, stride = 0;
  const void* dst = nullptr;  // their rounded copies side by side, in Bf16Storage<T>
};
// How a rounded operand is stored: bfloat16 bits for cuBLAS, else the
// rounded values in T.
#ifdef GNH_CUBLAS_MATH_MODE
template <class T>
using Bf16Storage = std::conditional_t<std::is_same_v<T, float>, std::uint16_t, T>;
#else
template <class T>
using Bf16Storage = T;
#endif
template <class T>
struct GemmPolicy {
  bool bf16 = false;
  bool tf32 = false;              // TF32 tensor-core math (cuBLAS); FP32 on every other backend
  View1<T> scratch_a, scratch_b;  // sized by the owner (Gpt) for its largest operands
  index_t chunk_elements = 0;     // elements of A (and, for op(A) = A^T, of B) per chunk
  // A single product's chunk (gemm; 0: chunk_elements): the scratch holds a
  // chunk for each product of a batch, so one product alone may fill it.
  index_t single_chunk_elements = 0;
  // bf16: blocks rounded ahead (none: src null): 0 and 1 the owner's (its
  // weights, the head's directions), 2 and 3 a linear layer's input planes
  // (linear_forward, where layer_input gives them room).
  std::array<RoundedAhead<T>, 4> ahead{};
  // bf16: room for a linear layer's input planes rounded once for all its
  // products (Bf16Storage<T> in as many T; empty: each product rounds its own).
  View1<T> layer_input;
  // bf16, GPU-shaped second order: the LM head's K direction blocks rounded
  // in pair blocks with its weights, vocabulary row v of pair j being
  // [V_2j,v | W_v | V_2j+1,v] (head_vocab rows of 3C), so that a direction's
  // tangent logits are one product over both (kernels/lm_head_xent.hpp);
  // null elsewhere. No lookup of ahead finds them.
  const Bf16Storage<T>* head_pairs = nullptr;
  index_t head_vocab = 0;
  // bf16, GPU-shaped second order with adjoint cuts: a linear layer's input
  // x and its x'_k in the layer-input room's pair blocks (RoomLayout), and
  // the layer's weight W and its K direction blocks in pair blocks alike
  // (row o of block j [V_2j,o | W_o | V_2j+1,o], zeros past the last
  // direction), so that each y'_k is one product over both
  // (kernels/linear.hpp, pair_forward); null elsewhere.
  const Bf16Storage<T>* input_pairs = nullptr;
  const Bf16Storage<T>* weight_pairs = nullptr;
};

// x as a rounded operand is stored (Bf16Storage<T>).
template <class T>
KOKKOS_INLINE_FUNCTION Bf16Storage<T> bf16_stored(T x) {
  if constexpr (std::is_same<Bf16Storage<T>, std::uint16_t>::value) return bf16_bits(x);
  else return round_bf16(x);
}

namespace detail {
// Where B (and each B_i = B + i stride_b of a batch of count) lies within a
// block rounded ahead: the rounded copy of B and the stride between those of
// the B_i (0: shared); data null where none holds them all.
template <class T>
struct AheadB {
  const Bf16Storage<T>* data = nullptr;
  index_t stride = 0;
};
template <class T>
AheadB<T> rounded_ahead(const GemmPolicy<T>& pol, Span2<const T> B, index_t stride_b, index_t count) {
  AheadB<T> r;
  if (B.size() == 0 || B.stride(0) != B.extent(1)) return r;
  const index_t span = (B.extent(0) - 1) * B.stride(0) + B.extent(1);
  const auto at = reinterpret_cast<std::uintptr_t>(B.data());
  for (const RoundedAhead<T>& a : pol.ahead) {
    const auto first = reinterpret_cast<std::uintptr_t>(a.src);
    if (!a.src || at < first) continue;
    const index_t off = index_t((at - first) / sizeof(T));
    if (a.count <= 1 || a.stride == a.size) {
      // Blocks back to back: one span, its copy laid out alike, so any
      // operands within it (a batch's at any stride) are read in place.
      const index_t end = off + (count > 1 ? (count - 1) * stride_b : 0) + span;
      if (end > a.size * std::max<index_t>(a.count, 1)) continue;
      r.data = static_cast<const Bf16Storage<T>*>(a.dst) + off;
      r.stride = stride_b;
      return r;
    }
    const index_t j = a.count > 1 && a.stride > 0 ? off / a.stride : 0, o = off - j * a.stride;
    const index_t last = stride_b == 0 || count <= 1 ? j : j + count - 1;
    if (j >= a.count || o + span > a.size || last >= a.count) continue;
    if (count > 1 && stride_b != 0 && stride_b != a.stride) continue;
    r.data = static_cast<const Bf16Storage<T>*>(a.dst) + j * a.size + o;
    r.stride = stride_b == 0 ? 0 : a.size;
    return r;
  }
  return r;
}

// Rows of A per chunk under bf16-amp (gemm and gemm_batched): A's rows in
// equal chunks (the last one shorter), as few as keep a chunk of rows of the
// wider of A and B within the policy's chunk_elements but for one row. The
// count of chunks, ceil(rows w / chunk_elements), depends on the product
// rows w alone, so a model s times narrower and shorter with chunk_elements
// s^2 times smaller makes as many (bench_engine --predict's miniature).
// scratch_a must hold one chunk of A's rows, else the owner sized it wrong.
// single: a product alone (gemm), whose chunk is single_chunk_elements
// where the owner set it.
template <class T>
index_t bf16_chunk_rows(const GemmPolicy<T>& pol, Span2<const T> A, Span2<const T> B, const char* who,
                        bool single = false) {
  const index_t rows = A.extent(0), cols = A.extent(1);
  const index_t w = std::max<index_t>(1, std::max<index_t>(cols, B.extent(1)));
  const index_t per =
      std::max<index_t>(1, single && pol.single_chunk_elements > 0 ? pol.single_chunk_elements : pol.chunk_elements);
  const index_t chunks = std::max<index_t>(1, (rows * w + per - 1) / per);
  const index_t chunk = std::max<index_t>(1, (rows + chunks - 1) / chunks);
  if (pol.scratch_a.extent(0) < std::size_t(std::min(rows, chunk) * cols))
    throw std::logic_error(std::string(who) + ": bf16 scratch too small");
  return chunk;
}

// A product's input rounded by the kernel that produces it into dst (null:
// not so rounded), and the policy whose products read it there
// (kernels/linear.hpp, rounded_input_room).
template <class T>
struct RoundedInput {
  GemmPolicy<T> pol;
  Bf16Storage<T>* dst = nullptr;
  RoomLayout layout;  // of the planes at dst
};

// The label of a copy rounded ahead (GemmPolicy::ahead) as the backend
// stores it: bfloat16 bits for cuBLAS, else the rounded values.
#ifdef GNH_CUBLAS_MATH_MODE
constexpr const char* kRoundedAhead = "gnh::gemm::to_bf16";
#else
constexpr const char* kRoundedAhead = "gnh::gemm::round_bf16";
#endif

// Rows r0 .. r0 + rows - 1 of `count` operands of `cols` columns, operand i
// at src + i src_stride, rounded to bfloat16 side by side into dst (operand i
// at dst + i dst_stride): one launch for the group's operands. D is T (the
// host: rounded values) or std::uint16_t (CUDA: bfloat16 storage).
template <class T, class D>
struct RoundedCopies {
  const T* src;
  D* dst;
  index_t src_stride, dst_stride, cols, r0, n;
  KOKKOS_INLINE_FUNCTION void operator()(const index_t i, const index_t e) const {
    const T x = src[i * src_stride + r0 * cols + e];
    if constexpr (std::is_same_v<D, std::uint16_t>) dst[i * dst_stride + e] = bf16_bits(x);
    else dst[i * dst_stride + e] = round_bf16(x);
  }
};
// dims: the scalable extents the copy spans (gemm_ledger.hpp; an operand's
// rows and columns, 2); below 0, the caller records its traffic.
template <class T, class D>
void rounded_copies(const ExecSpace& space, const char* label, const T* src, index_t src_stride, index_t cols,
                    index_t r0, index_t rows, index_t count, D* dst, index_t dst_stride, int dims = 2) {
  // As the GPU's copy moves them: T read, a bfloat16 written.
  if (dims >= 0) Traffic(label).add(double(count * rows * cols), sizeof(T) + 2, dims);
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<index_t>>;
  Kokkos::parallel_for(label, Policy(space, {0, 0}, {count, rows * cols}),
                       RoundedCopies<T, D>{src, dst, src_stride, dst_stride, cols, r0, rows});
}

// The policy p's ahead slot set to read size contiguous values of src where
// they lie rounded in dst.
template <class T>
void read_rounded(GemmPolicy<T>& p, int slot, const T* src, index_t size, const void* dst) {
  p.ahead[std::size_t(slot)] = {src, size, 1, 0, dst};
}
// rows x cols contiguous values from src rounded into dst (one launch), and
// the policy p's ahead slot set to read them there.
template <class T>
void round_into(const ExecSpace& space, GemmPolicy<T>& p, int slot, const T* src, index_t rows, index_t cols,
                Bf16Storage<T>* dst) {
  rounded_copies(space, kRoundedAhead, src, 0, cols, 0, rows, 1, dst, 0);
  read_rounded(p, slot, src, rows * cols, dst);
}

// Rows r0 .. r0 + rows - 1 of src rounded to bfloat16 values in dst.
template <class T>
Span2<const T> rounded_copy(const ExecSpace& space, Span2<const T> src, index_t r0, index_t rows, T* dst) {
  rounded_copies(space, "gnh::gemm::round_bf16", src.data(), 0, src.extent(1), r0, rows, 1, dst, 0);
  return Span2<const T>(dst, rows, src.extent(1));
}
}  // namespace detail

#ifdef GNH_CUBLAS_MATH_MODE
namespace detail {
// Rows r0 .. r0 + rows - 1 of src as bfloat16 storage (round_bf16's bits) in
// dst, which holds as many floats: half its bytes are used.
template <class T>
Span2<const std::uint16_t> bf16_copy(const ExecSpace& space, Span2<const T> src, index_t r0, index_t rows,
                                     std::uint16_t* d) {
  static_assert(std::is_same_v<T, float>, "bfloat16 operands come from float");
  rounded_copies(space, "gnh::gemm::to_bf16", src.data(), 0, src.extent(1), r0, rows, 1, d, 0);
  return Span2<const std::uint16_t>(d, rows, src.extent(1));
}
template <class T>
Span2<const std::uint16_t> bf16_copy(const ExecSpace& space, Span2<const T> src, index_t r0, index_t rows, T* dst) {
  return bf16_copy(space, src, r0, rows, reinterpret_cast<std::uint16_t*>(dst));
}

// count row-major products C_i = alpha op(A_i) op(B_i) + beta C_i of bfloat16
// operands (X_i = X + i stride_x; stride 0 shares one), FP32 accumulation and
// output (tensor cores), in one strided-batched call on the caller's stream.
inline void cublas_gemm_bf16_batched(const ExecSpace& space, bool at, bool bt, index_t m, index_t n, index_t k,
                                     float alpha, const std::uint16_t* A, index_t lda, index_t stride_a,
                                     const std::uint16_t* B, index_t ldb, index_t stride_b, float beta, float* C,
                                     index_t ldc, index_t stride_c, index_t count) {
  if (m == 0 || n == 0 || count == 0) return;
  const cublasHandle_t handle = cublas_on(space, false, "gnh::gemm");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const cublasOperation_t oa = bt ? CUBLAS_OP_T : CUBLAS_OP_N, ob = at ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublas_check(cublasGemmStridedBatchedEx(handle, oa, ob, int(n), int(m), int(k), &alpha, B, CUDA_R_16BF, int(ldb),
                                          stride_b, A, CUDA_R_16BF, int(lda), stride_a, &beta, C, CUDA_R_32F, int(ldc),
                                          stride_c, int(count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "gnh::gemm", "bfloat16 products", count, m, n, k);
}

// One such product of contiguous operands.
inline void cublas_gemm_bf16(const ExecSpace& space, bool at, bool bt, float alpha, Span2<const std::uint16_t> A,
                             Span2<const std::uint16_t> B, float beta, Span2<float> C) {
  cublas_gemm_bf16_batched(space, at, bt, C.extent(0), C.extent(1), at ? A.extent(0) : A.extent(1), alpha, A.data(),
                           A.extent(1), 0, B.data(), B.extent(1), 0, beta, C.data(), C.stride(0), 0, 1);
}
}  // namespace detail
#endif

namespace detail {
// A Kokkos Tools region around a GEMM entry point, so that profilers see the
// library's time (cuBLAS, the host BLAS) under a label like the kernels'.
// Labels of at most 15 characters stay in std::string's inline buffer.
// Each library call of an entry point that makes several (bf16-amp's chunks
// and groups) is a region of this label inside the entry point's: a launch
// profile (perf/kernel_profile.cpp) counts the calls as the entry point's
// launches.
constexpr const char* kLibraryCall = "gnh::gemm::call";
struct GemmRegion {
  explicit GemmRegion(const char* label) { Kokkos::Profiling::pushRegion(label); }
  ~GemmRegion() { Kokkos::Profiling::popRegion(); }
  GemmRegion(const GemmRegion&) = delete;
  GemmRegion& operator=(const GemmRegion&) = delete;
};
}  // namespace detail

// gemm under a precision policy: plain, or with bfloat16-rounded operands.
template <class T>
void gemm(const ExecSpace& space, const GemmPolicy<T>& pol, const char* ta, const char* tb, T alpha, Span2<const T> A,
          Span2<const T> B, T beta, Span2<T> C) {
  const detail::GemmRegion region("gnh::gemm");
  if (gemm_work().on) {
    const detail::ProductShape sh = detail::product_shape("gnh::gemm", ta, tb, A, B, C);
    record_gemm<T>("gnh::gemm", pol.tf32 || pol.bf16, sh.m, sh.n, sh.k, 1, pol.bf16 ? 2 : sizeof(T), beta != T(0));
  }
  if (!pol.bf16) {
#ifdef GNH_CUBLAS_MATH_MODE
    if constexpr (std::is_same_v<T, float>) {
      if (pol.tf32) {
        const detail::ProductShape sh = detail::product_shape("gnh::gemm", ta, tb, A, B, C);
        if (sh.m > 0 && sh.n > 0 && sh.k > 0)
          return detail::cublas_sgemm(space, true, sh.at, sh.bt, sh.m, sh.n, sh.k, alpha, A.data(), A.stride(0),
                                      B.data(), B.stride(0), beta, C.data(), C.stride(0));
      }
    }
#endif
    return gemm<T>(space, ta, tb, alpha, A, B, beta, C);
  }
  // One product of rounded row blocks: on CUDA the operands as bfloat16
  // storage into cuBLAS (tensor cores, FP32 accumulation); elsewhere as float
  // values into the FP32 GEMM, the exact emulation. Both multiply the same
  // bfloat16 values and accumulate in FP32; their order of additions differs.
  // B rounded ahead (GemmPolicy::ahead) is read there, rounded nowhere.
  // So is A rounded ahead: then op(A) = A is one product of all its rows;
  // op(A) = A^T keeps its chunks (C accumulates over them, so the chunks
  // are its bits), each reading A's rows there.
  const detail::AheadB<T> ahead = detail::rounded_ahead(pol, B, 0, 1);
  const detail::AheadB<T> ahead_a = detail::rounded_ahead(pol, A, 0, 1);
  auto product = [&](bool trans_a, index_t a0, index_t na, bool round_b, index_t b0, index_t nb, T beta_, Span2<T> Cc) {
    const index_t bc = B.extent(1), ac = A.extent(1);
#ifdef GNH_CUBLAS_MATH_MODE
    if constexpr (std::is_same_v<T, float>) {
      const Span2<const std::uint16_t> As = ahead_a.data ? Span2<const std::uint16_t>(ahead_a.data + a0 * ac, na, ac)
                                                         : detail::bf16_copy(space, A, a0, na, pol.scratch_a.data());
      const Span2<const std::uint16_t> Bs =
          ahead.data ? Span2<const std::uint16_t>(ahead.data + b0 * bc, nb, bc)
          : round_b  ? detail::bf16_copy(space, B, b0, nb, pol.scratch_b.data())
                     : Span2<const std::uint16_t>(reinterpret_cast<const std::uint16_t*>(pol.scratch_b.data()), nb, bc);
      const detail::GemmRegion call(detail::kLibraryCall);
      return detail::cublas_gemm_bf16(space, trans_a, tb[0] == 'T', alpha, As, Bs, beta_, Cc);
    }
#endif
    (void)trans_a;  // op(A) is ta
    // Rounded values in T wherever this runs (cuBLAS took float above).
    const T* const ahead_b = reinterpret_cast<const T*>(ahead.data);
    const Span2<const T> As = ahead_a.data ? Span2<const T>(reinterpret_cast<const T*>(ahead_a.data) + a0 * ac, na, ac)
                                           : detail::rounded_copy(space, A, a0, na, pol.scratch_a.data());
    const Span2<const T> Bs = ahead.data ? Span2<const T>(ahead_b + b0 * bc, nb, bc)
                              : round_b  ? detail::rounded_copy(space, B, b0, nb, pol.scratch_b.data())
                                         : Span2<const T>(pol.scratch_b.data(), nb, bc);
    const detail::GemmRegion call(detail::kLibraryCall);
    gemm<T>(space, ta, tb, alpha, As, Bs, beta_, Cc);
  };
  const bool at = ta[0] == 'T';
  const index_t rows = A.extent(0);
  const index_t chunk =
      ahead_a.data && !at ? std::max<index_t>(rows, 1) : detail::bf16_chunk_rows(pol, A, B, "gnh::gemm", true);
  if (!at) {
    // C rows follow A rows; B is rounded once, with the first chunk.
    if (!ahead.data && pol.scratch_b.extent(0) < B.size())
      throw std::logic_error("gnh::gemm: bf16 scratch too small for B");
    for (index_t r0 = 0; r0 < rows; r0 += chunk) {
      const index_t n = std::min(chunk, rows - r0);
      product(false, r0, n, r0 == 0, 0, B.extent(0), beta, Span2<T>(C.data() + r0 * C.extent(1), n, C.extent(1)));
    }
    return;
  }
  // op(A) = A^T: the contraction runs over the rows of A and of B; C accumulates.
  if (tb[0] != 'N') throw std::logic_error("gnh::gemm: bf16 policy supports T,N but not T,T");
  if (rows == 0) return gemm<T>(space, ta, tb, alpha, A, B, beta, C);
  for (index_t r0 = 0; r0 < rows; r0 += chunk) {
    const index_t n = std::min(chunk, rows - r0);
    if (!ahead.data && pol.scratch_b.extent(0) < std::size_t(n * B.extent(1)))
      throw std::logic_error("gnh::gemm: bf16 scratch too small");
    product(true, r0, n, true, r0, n, r0 == 0 ? beta : T(1), C);
  }
}

namespace detail {
// How gemm_batched groups a batch under bf16-amp. The rows of A are taken in
// gemm's own chunks (bf16_chunk_rows): the rows of C for op(A) = A, the
// contracted rows of A and B for op(A) = A^T. Per chunk, each operand is
// rounded once for a group of products (a shared one once, a strided one
// per product, side by side in scratch), and the group is as many products
// as the scratch holds; group 0 where not even one fits.
struct Bf16Groups {
  index_t group = 0, chunk = 0;
};
template <class T>
Bf16Groups bf16_groups(const GemmPolicy<T>& pol, bool at, Span2<const T> A, index_t stride_a, Span2<const T> B,
                       index_t stride_b, index_t count, bool b_ahead, bool a_ahead = false) {
  Bf16Groups g;
  const index_t rows = A.extent(0), acols = A.extent(1), bcols = B.extent(1);
  if (rows == 0 || acols == 0 || B.size() == 0 || count < 1) return g;
  // A rounded ahead (op(A) = A) with B ahead or shared: all rows at once
  // (op(A) = A^T keeps its chunks, over which C accumulates: as gemm).
  g.chunk = a_ahead && !at && (b_ahead || stride_b == 0)
                ? rows
                : std::min(rows, bf16_chunk_rows(pol, A, B, "gnh::gemm_batched"));
  const index_t sa = index_t(pol.scratch_a.extent(0)), sb = index_t(pol.scratch_b.extent(0));
  const index_t achunk = g.chunk * acols, bblock = at ? g.chunk * bcols : index_t(B.size());
  const index_t fa = a_ahead || stride_a == 0 ? count : sa < achunk ? 0 : sa / achunk;
  // B rounded ahead needs no scratch.
  const index_t fb = b_ahead ? count : sb < bblock ? 0 : stride_b == 0 ? count : sb / bblock;
  g.group = std::min(count, std::min(fa, fb));
  return g;
}

// gemm_batched under bf16-amp, in the groups of bf16_groups: on CUDA one
// strided-batched cuBLAS call per chunk of a group (bfloat16 operands, FP32
// accumulation: tensor cores); on the host the group's products in turn on
// the rounded copies, with the bits of one bf16 gemm per product (the same
// chunks, the same calls). Returns false where it does not apply (op(A) and
// op(B) both transposed, a strided C row, a group of 0): then per product.
template <class T>
bool bf16_batched(const ExecSpace& space, const GemmPolicy<T>& pol, const char* ta, const char* tb, T alpha,
                  Span2<const T> A, index_t stride_a, Span2<const T> B, index_t stride_b, T beta, Span2<T> C,
                  index_t stride_c, index_t count) {
  const bool at = ta[0] == 'T', bt = tb[0] == 'T';
  const index_t rows = A.extent(0), acols = A.extent(1), bcols = B.extent(1), ncols = C.extent(1);
  if ((at && bt) || ncols == 0 || C.stride(0) != ncols) return false;
  const AheadB<T> ahead = rounded_ahead(pol, B, stride_b, count);  // B rounded ahead: read there
  // A too, where it is and the groups take it whole.
  const AheadB<T> ahead_a = rounded_ahead(pol, A, stride_a, count);
  const Bf16Groups g =
      bf16_groups(pol, at, A, stride_a, B, stride_b, count, ahead.data != nullptr, ahead_a.data != nullptr);
  if (g.group < 1) return false;
  const index_t bsize = B.size();
  for (index_t g0 = 0; g0 < count; g0 += g.group) {
    const index_t gn = std::min(g.group, count - g0);
    const index_t na = stride_a == 0 ? 1 : gn, nb = stride_b == 0 ? 1 : gn;
    for (index_t r0 = 0; r0 < rows; r0 += g.chunk) {
      const index_t n = std::min(g.chunk, rows - r0);
      // Strides in scratch: A's chunks side by side; B whole per product
      // (rounded with the first chunk) for op(A) = A, else its chunk of rows.
      const index_t astep = ahead_a.data ? ahead_a.stride : n * acols, brows = at ? n : B.extent(0);
      const index_t bstep = ahead.data ? ahead.stride : at ? n * bcols : bsize;
      // B's rows of this chunk where rounded ahead (op(A) = A^T: rows r0 on).
      const Bf16Storage<T>* const b_ahead =
          ahead.data ? ahead.data + g0 * ahead.stride + (at ? r0 * bcols : 0) : nullptr;
      const T beta_ = at && r0 > 0 ? T(1) : beta;  // op(A) = A^T: C accumulates over the chunks
      T* const c0 = C.data() + g0 * stride_c + (at ? 0 : r0 * ncols);
      const index_t crows = at ? C.extent(0) : n;
#ifdef GNH_CUBLAS_MATH_MODE
      constexpr bool on_cublas = std::is_same_v<T, float>;
#else
      constexpr bool on_cublas = false;
#endif
      if constexpr (on_cublas) {
#ifdef GNH_CUBLAS_MATH_MODE
        std::uint16_t* const scratch_as = reinterpret_cast<std::uint16_t*>(pol.scratch_a.data());
        const std::uint16_t* const as = ahead_a.data ? ahead_a.data + g0 * ahead_a.stride + r0 * acols : scratch_as;
        std::uint16_t* const bs = reinterpret_cast<std::uint16_t*>(pol.scratch_b.data());
        if (!ahead_a.data)
          rounded_copies(space, "gnh::gemm::to_bf16", A.data() + g0 * stride_a, stride_a, acols, r0, n, na, scratch_as,
                         astep);
        if (!b_ahead && (at || r0 == 0))
          rounded_copies(space, "gnh::gemm::to_bf16", B.data() + g0 * stride_b, stride_b, bcols, at ? r0 : 0, brows, nb,
                         bs, bstep);
        const GemmRegion call(kLibraryCall);
        cublas_gemm_bf16_batched(space, at, bt, at ? acols : n, ncols, at ? n : acols, alpha, as, acols,
                                 na == 1 ? 0 : astep, b_ahead ? b_ahead : bs, bcols, nb == 1 ? 0 : bstep, beta_, c0,
                                 ncols, stride_c, gn);
#endif
      } else {
        const T* const a0 = ahead_a.data ? reinterpret_cast<const T*>(ahead_a.data) + g0 * ahead_a.stride + r0 * acols
                                         : pol.scratch_a.data();
        if (!ahead_a.data)
          rounded_copies(space, "gnh::gemm::round_bf16", A.data() + g0 * stride_a, stride_a, acols, r0, n, na,
                         pol.scratch_a.data(), astep);
        if (!b_ahead && (at || r0 == 0))
          rounded_copies(space, "gnh::gemm::round_bf16", B.data() + g0 * stride_b, stride_b, bcols, at ? r0 : 0, brows,
                         nb, pol.scratch_b.data(), bstep);
        const T* const b0 = b_ahead ? b_ahead : pol.scratch_b.data();
        const GemmRegion call(kLibraryCall);  // one strided-batched call on cuBLAS
        for (index_t i = 0; i < gn; ++i)
          gemm<T>(space, ta, tb, alpha, Span2<const T>(a0 + (na == 1 ? 0 : i * astep), n, acols),
                  Span2<const T>(b0 + (nb == 1 ? 0 : i * bstep), brows, bcols), beta_,
                  Span2<T>(c0 + i * stride_c, crows, ncols));
      }
    }
  }
  return true;
}
}  // namespace detail

// A batch of products with one shape: C_i = alpha op(A_i) op(B_i) + beta C_i
// for i < count, where X_i starts stride_x elements after X_{i-1} (stride 0:
// one operand shared by the batch; A, B, C are the first of each). The K
// directions of a GEMM are such a batch. On CUDA with cuBLAS it is one
// strided-batched call on the caller's stream (under the TF32 policy in TF32
// math; under bf16-amp, bfloat16 operands in groups, see bf16_batched);
// elsewhere the products in turn, with the bits of `count` calls of gemm.
template <class T>
void gemm_batched(const ExecSpace& space, const GemmPolicy<T>& pol, const char* ta, const char* tb, T alpha,
                  Span2<const T> A, index_t stride_a, Span2<const T> B, index_t stride_b, T beta, Span2<T> C,
                  index_t stride_c, index_t count) {
  if (count <= 0) return;
  const detail::GemmRegion region("gnh::gemm_batch");
  if (gemm_work().on) {
    const detail::ProductShape sh = detail::product_shape("gnh::gemm_batched", ta, tb, A, B, C);
    record_gemm<T>("gnh::gemm_batch", pol.tf32 || pol.bf16, sh.m, sh.n, sh.k, count, pol.bf16 ? 2 : sizeof(T),
                   beta != T(0));
  }
  const GemmWorkPause recorded;  // the products below, one by one on a host, are counted above
#ifdef GNH_CUBLAS_MATH_MODE
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const detail::ProductShape sh = detail::product_shape("gnh::gemm_batched", ta, tb, A, B, C);
    const bool at = sh.at, bt = sh.bt;
    const index_t m = sh.m, n = sh.n, ka = sh.k;
    if (!pol.bf16 && m > 0 && n > 0 && ka > 0 && count > 1) {
      const cublasHandle_t handle = detail::cublas_on(space, pol.tf32 && std::is_same_v<T, float>, "gnh::gemm_batched");
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
      const cublasOperation_t oa = bt ? CUBLAS_OP_T : CUBLAS_OP_N, ob = at ? CUBLAS_OP_T : CUBLAS_OP_N;
      const int mi = int(n), ni = int(m), ki = int(ka), lda = int(B.stride(0)), ldb = int(A.stride(0)),
                ldc = int(C.stride(0));
      cublasStatus_t st;
      if constexpr (std::is_same_v<T, float>)
        st = cublasSgemmStridedBatched(handle, oa, ob, mi, ni, ki, &alpha, B.data(), lda, stride_b, A.data(), ldb,
                                       stride_a, &beta, C.data(), ldc, stride_c, int(count));
      else
        st = cublasDgemmStridedBatched(handle, oa, ob, mi, ni, ki, &alpha, B.data(), lda, stride_b, A.data(), ldb,
                                       stride_a, &beta, C.data(), ldc, stride_c, int(count));
      detail::cublas_check(st, "gnh::gemm_batched", "products", count, m, n, ka);
      return;
    }
  }
#endif
  if (pol.bf16 && count > 1) {
    detail::product_shape("gnh::gemm_batched", ta, tb, A, B, C);
    if (detail::bf16_batched<T>(space, pol, ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c, count)) return;
  }
  for (index_t i = 0; i < count; ++i)
    gemm<T>(space, pol, ta, tb, alpha, Span2<const T>(A.data() + i * stride_a, A.extent(0), A.extent(1)),
            Span2<const T>(B.data() + i * stride_b, B.extent(0), B.extent(1)), beta,
            Span2<T>(C.data() + i * stride_c, C.extent(0), C.extent(1)));
}

// Products of operands rounded already (bfloat16 storage, Bf16Storage<T>:
// bfloat16 bits on cuBLAS, the rounded values elsewhere), rows lda and ldb
// apart, X_i stride_x after X_{i-1}: C_i = alpha op(A_i) op(B_i) + beta C_i,
// accumulated in FP32. On CUDA one strided-batched bfloat16 call (tensor
// cores); on a host the products in turn. Recorded as a gnh::gemm_batch of
// bfloat16 operands, one library call.
template <class T>
void gemm_batched_rounded(const ExecSpace& space, bool at, bool bt, index_t m, index_t n, index_t k, T alpha,
                          const Bf16Storage<T>* A, index_t lda, index_t stride_a, const Bf16Storage<T>* B, index_t ldb,
                          index_t stride_b, T beta, T* C, index_t ldc, index_t stride_c, index_t count) {
  if (count <= 0 || m <= 0 || n <= 0) return;
  const detail::GemmRegion region("gnh::gemm_batch");
  record_gemm<T>("gnh::gemm_batch", true, m, n, k, count, 2, beta != T(0));
  const detail::GemmRegion call(detail::kLibraryCall);
#ifdef GNH_CUBLAS_MATH_MODE
  if constexpr (std::is_same_v<T, float>) {
    detail::cublas_gemm_bf16_batched(space, at, bt, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                                     stride_c, count);
  } else {
    throw std::logic_error("gnh::gemm_batched_rounded: bfloat16 operands come from float");
  }
#else
  space.fence();
  for (index_t i = 0; i < count; ++i)
    host::gemm_one(at, bt, m, n, k, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
#endif
}

// Compiled once, in gnh_core (kernels/instances.hpp).
#define GNH_GEMM(EXT, T)                                                                                         \
  EXT template void gemm<T>(const ExecSpace&, const char*, const char*, T, Span2<const T>, Span2<const T>, T,    \
                            Span2<T>);                                                                           \
  EXT template void gemm<T>(const ExecSpace&, const GemmPolicy<T>&, const char*, const char*, T, Span2<const T>, \
                            Span2<const T>, T, Span2<T>);                                                        \
  EXT template void gemm_batched<T>(const ExecSpace&, const GemmPolicy<T>&, const char*, const char*, T,         \
                                    Span2<const T>, index_t, Span2<const T>, index_t, T, Span2<T>, index_t, index_t);
GNH_GEMM(extern, float)
GNH_GEMM(extern, double)

}  // namespace gnh::kernels
