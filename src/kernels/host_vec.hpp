// SPDX-License-Identifier: BSD-3-Clause
// Host loops of elementwise kernels, compiled for x86-64-v2, v3 and v4 in one
// binary and chosen at load time (core/isa.hpp): the kernels hand them whole
// chunks on host spaces, so that a portable build vectorises them as wide as
// the processor allows. Each computes exactly the kernel's per-element maths
// (the same inline functions), in the clone's instruction set.
#pragma once
#include <cstdint>

namespace gnh::kernels::host {

// Exact (erf) GELU over x[0, n): y = f(x) (kernels/gelu.hpp).
void gelu_erf_value(const float* x, float* y, std::int64_t n);
// y = f(x) and slope = f'(x); slope may be x itself (read before written).
void gelu_erf_value_slope(const float* x, float* y, float* slope, std::int64_t n);

}  // namespace gnh::kernels::host
