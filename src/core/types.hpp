// SPDX-License-Identifier: BSD-3-Clause
// The one place where gnh's view types are spelled. Everything is LayoutRight
// (row-major, as PyTorch), so that a (rows, cols) block of a flat buffer is a
// contiguous 2-D view and GEMMs reach the vendor BLAS.
#pragma once
#include <Kokkos_Core.hpp>

#include <cstdint>

#include "core/index.hpp"

namespace gnh {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostSpace = Kokkos::HostSpace;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

template <class T, class Space = MemSpace>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, Space>;
template <class T, class Space = MemSpace>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, Space>;
template <class T, class Space = MemSpace>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Space>;

// Non-owning views into a flat buffer (parameters, gradients, directions).
template <class T, class Space = MemSpace>
using Span1 = Kokkos::View<T*, Kokkos::LayoutRight, Space, Unmanaged>;
template <class T, class Space = MemSpace>
using Span2 = Kokkos::View<T**, Kokkos::LayoutRight, Space, Unmanaged>;
template <class T, class Space = MemSpace>
using Span3 = Kokkos::View<T***, Kokkos::LayoutRight, Space, Unmanaged>;

// Token ids and targets; a target < 0 is ignored.
using TokenView = View2<std::int32_t>;  // (B, T)

using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>;

inline Range range(const ExecSpace& space, index_t n) { return Range(space, 0, n); }

// Team kernels: the policy, and a team's scratch memory seen as values of T.
using TeamRange = Kokkos::TeamPolicy<ExecSpace, Kokkos::IndexType<index_t>>;
template <class T>
using TeamScratch = Kokkos::View<T*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

}  // namespace gnh
