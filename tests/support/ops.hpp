// SPDX-License-Identifier: BSD-3-Clause
// Every op of the engine seen the same way by the tests: y = F(x, theta) on
// (N, Cin) -> (N, Cout) activations and a flat parameter block, runnable in
// every mode (primal, Dual forward, Jet2 forward, primal and Dual reverse),
// with one direction (K = 1). Buffers are plain host views of double or float.
#pragma once
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/planes.hpp"
#include "kernels/ops.hpp"

namespace gnh::test {

// Owned planes of an (rows, cols) activation with K = 1 direction.
template <class T>
struct Buf {
  View1<T> v, d, dd;
  index_t rows = 0, cols = 0;
  Buf() = default;
  Buf(index_t r, index_t c) : v("v", r * c), d("d", r * c), dd("dd", r * c), rows(r), cols(c) {}
  // Planes for scalar S: primal (v), Dual (v, d) or Jet2 (v, d, dd).
  template <class S>
  Act2<T> act() const {
    Act2<T> a;
    a.v = Span2<T>(v.data(), rows, cols);
    if (!std::is_same<S, T>::value) a.d = Span3<T>(d.data(), 1, rows, cols);
    if (std::is_same<S, Jet2<T>>::value) a.dd = Span3<T>(dd.data(), 1, rows, cols);
    return a;
  }
  template <class S>
  Act1<T> act1() const {
    const Act2<T> a = act<S>();
    Act1<T> r;
    r.v = Span1<T>(a.v.data(), rows * cols);
    if (a.d.extent(0) > 0) r.d = Span2<T>(a.d.data(), 1, rows * cols);
    if (a.dd.extent(0) > 0) r.dd = Span2<T>(a.dd.data(), 1, rows * cols);
    return r;
  }
};

template <class T>
struct Flat {  // parameters or gradients with one direction
  View1<T> v, d;
  explicit Flat(index_t P = 0) : v("p", P), d("pd", P) {}
  template <class S>
  Params<T> params() const {
    Params<T> p{Span1<const T>(v.data(), v.extent(0)), {}};
    if (!std::is_same<S, T>::value) p.d = Span2<const T>(d.data(), 1, d.extent(0));
    return p;
  }
  template <class S>
  Grads<T> grads() const {
    Grads<T> g{Span1<T>(v.data(), v.extent(0)), {}};
    if (!std::is_same<S, T>::value) g.d = Span2<T>(d.data(), 1, d.extent(0));
    return g;
  }
};

template <class T>
struct Op {
  index_t N = 0, Cin = 0, Cout = 0, P = 0;
  bool unit_seed = false;  // the reverse seeds dy = 1 itself (the loss)
  virtual ~Op() = default;
  virtual const char* name() const = 0;
  virtual void fwd_primal(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) = 0;
  virtual void fwd_dual(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) = 0;
  virtual void fwd_jet(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) = 0;
  // Reverse (runs its own forward first); dx overwritten, g accumulated.
  virtual void rev_primal(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>& x, const Flat<T>& p) = 0;
  virtual void rev_dual(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>& x, const Flat<T>& p) = 0;
};

// Implements the virtual mode dispatch from two templates fwd<S> and rev<S>.
template <class T, class Impl>
struct OpOf : Op<T> {
  void fwd_primal(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) override { self().template fwd<T>(y, x, p); }
  void fwd_dual(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) override { self().template fwd<Dual<T>>(y, x, p); }
  void fwd_jet(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) override { self().template fwd<Jet2<T>>(y, x, p); }
  void rev_primal(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>& x, const Flat<T>& p) override {
    self().template rev<T>(dx, g, dy, x, p);
  }
  void rev_dual(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>& x, const Flat<T>& p) override {
    self().template rev<Dual<T>>(dx, g, dy, x, p);
  }
  Impl& self() { return static_cast<Impl&>(*this); }
};

// Any op of the contract (kernels/op.hpp) seen through Op<T>: its saved
// buffers allocated with one direction, each reverse preceded by its forward.
// OpAdapter<kernels::GeluOp<double>> op(N, C, Gelu::erf) takes the op's own
// constructor arguments, so a new op needs nothing here.
template <class O>
struct OpAdapter;
template <template <class> class O, class T>
struct OpAdapter<O<T>> : OpOf<T, OpAdapter<O<T>>> {
  O<T> kernel;
  std::vector<Buf<T>> saved;  // in the order of O<T>::saved()
  template <class... A>
  explicit OpAdapter(A&&... args) : kernel(std::forward<A>(args)...) {
    const kernels::OpSizes s = kernel.sizes();
    this->N = s.rows;
    this->Cin = s.in;
    this->Cout = s.out;
    this->P = s.params;
    this->unit_seed = kernels::is_loss_op<O<T>>::value;
    for (const kernels::OpExtent& e : kernel.saved()) saved.emplace_back(e.rows, e.cols);
  }
  const char* name() const override { return O<T>::name; }
  template <class S>
  kernels::OpSaved<T> saved_planes() const {
    kernels::OpSaved<T> s;
    if (saved.size() > std::size_t(s.kMax)) throw std::logic_error("OpAdapter: too many saved buffers");
    for (const Buf<T>& b : saved) s.buf[s.count++] = b.template act<S>();
    return s;
  }
  template <class S>
  void fwd(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) {
    kernel.template forward<S>(ExecSpace(), y.template act<S>(), x.template act<S>(), p.template params<S>(),
                               saved_planes<S>());
    Kokkos::fence();
  }
  template <class S>
  void rev(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>& x, const Flat<T>& p) {
    Buf<T> y(this->N, this->Cout);
    fwd<S>(y, x, p);
    kernel.template reverse<S>(ExecSpace(), dx.template act<S>(), g.template grads<S>(), dy.template act<S>(),
                               x.template act<S>(), y.template act<S>(), p.template params<S>(), saved_planes<S>());
    Kokkos::fence();
  }
};

}  // namespace gnh::test
