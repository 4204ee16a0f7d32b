// SPDX-License-Identifier: BSD-3-Clause
// gnh's index type, for headers that need it without Kokkos (core/types.hpp
// includes this and spells every view type).
#pragma once
#include <cstdint>

namespace gnh {
using index_t = std::int64_t;
}  // namespace gnh
