// SPDX-License-Identifier: BSD-3-Clause
// Kokkos 3.4 (Debian) and Kokkos >= 4 (clusters) differ in where the maths
// functions live; kernels call gnh::kmath::exp etc.
#pragma once
#include <Kokkos_Core.hpp>

namespace gnh {
#if KOKKOS_VERSION >= 40000
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif
}  // namespace gnh
