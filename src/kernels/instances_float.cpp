// SPDX-License-Identifier: BSD-3-Clause
// Every kernel entry point for T = float and its Dual and Jet2 scalars, compiled
// once for every unit that calls them (kernels/instances.hpp).
#include "kernels/attention.hpp"
#include "kernels/blas.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"
#include "kernels/residual.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rotary.hpp"
#include "kernels/swiglu.hpp"

namespace gnh::kernels {
GNH_GEMM(, float)
GNH_LINEAR(, float)
GNH_EMBEDDING(, float)
GNH_RESIDUAL(, float)
GNH_GELU(, float)
GNH_LAYERNORM(, float)
GNH_RMSNORM(, float)
GNH_ROTARY(, float)
GNH_SWIGLU(, float)
GNH_ATTENTION(, float)
GNH_LM_HEAD(, float)
}  // namespace gnh::kernels
