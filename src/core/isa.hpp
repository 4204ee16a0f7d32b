// SPDX-License-Identifier: BSD-3-Clause
// One x86-64 binary for every node: the default build targets x86-64-v2
// (SSE4.2), and the host's vector loops that matter (attention's tiles around
// the GEMMs; the GEMM micro-kernels choose their own, kernels/host_gemm.cpp)
// are compiled again for x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512), the
// processor's best chosen once at load time (GCC's target_clones, an ifunc).
// Elsewhere (Arm, nvcc, other compilers) the macro is empty and the build's
// own -march decides.
#pragma once
#include <string>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__NVCOMPILER)
#define GNH_HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// The same, with everything the function calls inlined into each clone (a
// caller of generic row bodies, whose own code must be compiled per level).
#define GNH_HOST_CLONES_FLAT __attribute__((flatten, target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GNH_HOST_CLONES
#define GNH_HOST_CLONES_FLAT
#endif

namespace gnh {
// The x86-64 level whose clones this processor runs ("x86-64-v4",
// "x86-64-v3", "x86-64-v2" or "x86-64" below it), or the architecture's name
// elsewhere: printed and recorded with the host GEMM's choice.
const char* host_isa_level();
// The processor's class, for choices that must be made once per class of
// node (the host GEMM of a campaign): its model name as the CPU reports it,
// with the x86 family and model numbers and the ISA level, e.g. "AMD EPYC 9B14
// (family 25 model 17, x86-64-v4)"; the architecture's name where there is no
// model name to read.
std::string host_cpu_class();
}  // namespace gnh
