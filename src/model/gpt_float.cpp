// SPDX-License-Identifier: BSD-3-Clause
#include "model/gpt_impl.hpp"

namespace gnh {
template class Gpt<float>;
}  // namespace gnh
