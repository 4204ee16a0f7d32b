// SPDX-License-Identifier: BSD-3-Clause
// Test helpers: moving reference vectors to and from device views, NaN fill.
#pragma once
#include <limits>
#include <vector>

#include "core/types.hpp"

namespace gnh::test {

template <class T>
View2<T> to_view2(const std::vector<double>& v, index_t rows, index_t cols) {
  View2<T> d("test", rows, cols);
  auto h = Kokkos::create_mirror_view(d);
  for (index_t i = 0; i < rows * cols; ++i) h.data()[i] = static_cast<T>(v[static_cast<std::size_t>(i)]);
  Kokkos::deep_copy(d, h);
  return d;
}

template <class T>
View1<T> to_view1(const std::vector<double>& v) {
  View1<T> d("test", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = static_cast<T>(v[i]);
  Kokkos::deep_copy(d, h);
  return d;
}

// A view of the given shape filled with NaN, to prove every element is written.
template <class T>
View2<T> nan_view2(index_t rows, index_t cols) {
  View2<T> d("test", rows, cols);
  Kokkos::deep_copy(d, std::numeric_limits<T>::quiet_NaN());
  return d;
}
template <class T>
View1<T> nan_view1(index_t n) {
  View1<T> d("test", n);
  Kokkos::deep_copy(d, std::numeric_limits<T>::quiet_NaN());
  return d;
}

template <class V>
std::vector<double> to_host(const V& d) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), d);
  std::vector<double> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = static_cast<double>(h.data()[i]);
  return out;
}

// Rounding of the inputs themselves: what the kernel actually received.
template <class T>
std::vector<double> rounded(std::vector<double> v) {
  for (auto& x : v) x = static_cast<double>(static_cast<T>(x));
  return v;
}

}  // namespace gnh::test
