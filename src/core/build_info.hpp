// SPDX-License-Identifier: BSD-3-Clause
#pragma once
#include <string>

namespace gnh {
const char* version();
const char* git_commit();
// Build type, compiler, Kokkos version and enabled backends.
std::string build_configuration();
}  // namespace gnh
