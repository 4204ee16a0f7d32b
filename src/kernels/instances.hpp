// SPDX-License-Identifier: BSD-3-Clause
// Each kernel entry point is compiled once, in gnh_core, for the scalars the
// model runs; every other unit (the model, the tests, the benchmarks) sees an
// extern declaration and links to that copy. Without it nvcc compiled every
// kernel's device code again in each test and benchmark unit (test_kernels
// alone took 166 s of a CUDA build).
//
// A kernel header declares its instances at its end, for a real type T,
//   #define GNH_GELU_FORWARD(EXT, S) EXT template void gelu_forward<S>(...);
//   #define GNH_GELU(EXT, T) GNH_FORWARD_SCALARS(GNH_GELU_FORWARD, EXT, T) ...
//   GNH_GELU(extern, float)
//   GNH_GELU(extern, double)
// and the units of gnh_core that define them (kernels/instances_float.cpp,
// instances_double.cpp: one per real type, so a CUDA build compiles them side
// by side) apply the same macros with an empty EXT. A use with another scalar
// still compiles the template where it is used.
#pragma once
#include "core/jet.hpp"

// The scalars of a real type T: forward kernels run the primal, tangent (Dual)
// and second-order (Jet2) scalars, reverse kernels the first two.
#define GNH_REVERSE_SCALARS(X, EXT, T) X(EXT, T) X(EXT, Dual<T>)
#define GNH_FORWARD_SCALARS(X, EXT, T) GNH_REVERSE_SCALARS(X, EXT, T) X(EXT, Jet2<T>)
