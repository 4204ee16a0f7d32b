// SPDX-License-Identifier: BSD-3-Clause
// The two GELUs of the nanoGPT family (SPEC §1): the exact one (erf,
// nanoGPT's default) and the tanh approximation. The model's configuration
// names one (model/config.hpp) and the kernel computes it (kernels/gelu.hpp).
#pragma once

namespace gnh {

enum class Gelu { erf, tanh };

inline const char* to_string(Gelu g) { return g == Gelu::erf ? "erf" : "tanh"; }

}  // namespace gnh
