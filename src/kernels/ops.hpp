// SPDX-License-Identifier: BSD-3-Clause
// The registry of the engine's ops: every op of the contract (kernels/op.hpp).
// The benchmarks (perf/bench_kernels.cpp) time each one in every mode and the
// derivative tests check each one at a small model's sizes, both by walking
// this list, so a new op is one include and one entry here.
#pragma once
#include "kernels/attention.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rotary.hpp"
#include "kernels/swiglu.hpp"

namespace gnh::kernels {

template <template <class> class... Ops>
struct OpList {
  // f.template operator()<O<T>>() for each op, in order.
  template <class T, class F>
  static void for_each(F&& f) {
    (f.template operator()<Ops<T>>(), ...);
  }
  static constexpr std::size_t size = sizeof...(Ops);
};

using Ops = OpList<LinearOp, LayerNormOp, RmsNormOp, GeluOp, SwigluOp, RotaryOp, AttentionOp, GqaAttentionOp,
                   LmHeadXentOp, EmbeddingOp>;

}  // namespace gnh::kernels
