// SPDX-License-Identifier: BSD-3-Clause
// Every kernel entry point for T = double and its Dual and Jet2 scalars, compiled
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
GNH_GEMM(, double)
GNH_LINEAR(, double)
GNH_EMBEDDING(, double)
GNH_RESIDUAL(, double)
GNH_GELU(, double)
GNH_LAYERNORM(, double)
GNH_RMSNORM(, double)
GNH_ROTARY(, double)
GNH_SWIGLU(, double)
GNH_ATTENTION(, double)
GNH_LM_HEAD(, double)
}  // namespace gnh::kernels
