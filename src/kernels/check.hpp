// SPDX-License-Identifier: BSD-3-Clause
// Extent checks for kernel entry points: a mismatch is a programming error, but
// it is reported with the kernel's label and the offending extents.
#pragma once
#include <stdexcept>
#include <string>

#include "core/error.hpp"

namespace gnh::kernels {

inline void require_extent(const char* kernel, const char* what, long long got, long long want) {
  if (got != want) throw std::logic_error(cat(kernel, ": ", what, " has extent ", got, ", expected ", want));
}

}  // namespace gnh::kernels
