// SPDX-License-Identifier: BSD-3-Clause
#include "kernels/host_vec.hpp"

#include "core/isa.hpp"
#include "kernels/gelu.hpp"

namespace gnh::kernels::host {

GNH_HOST_CLONES void gelu_erf_value(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    float f, f1, f2;
    gelu_derivatives<true, 0>(x[i], f, f1, f2);
    y[i] = f;
  }
}

GNH_HOST_CLONES void gelu_erf_value_slope(const float* x, float* y, float* slope, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    float f, f1, f2;
    gelu_derivatives<true, 1>(x[i], f, f1, f2);
    y[i] = f;
    slope[i] = f1;
  }
}

}  // namespace gnh::kernels::host
