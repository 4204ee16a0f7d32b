// SPDX-License-Identifier: BSD-3-Clause
// Every op of the engine seen the same way by the tests: y = F(x, theta) on
// (N, Cin) -> (N, Cout) activations and a flat parameter block, runnable in
// every mode (primal, Dual forward, Jet2 forward, primal and Dual reverse),
// with one direction (K = 1). Buffers are plain host views of double or float.
#pragma once
#include <memory>
#include <vector>

#include "core/planes.hpp"
#include "kernels/attention.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/linear.hpp"
#include "kernels/lm_head_xent.hpp"

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

template <class T>
struct LinearOp : OpOf<T, LinearOp<T>> {
  bool bias;
  LinearOp(index_t N, index_t in, index_t out, bool b) : bias(b) {
    this->N = N; this->Cin = in; this->Cout = out; this->P = out * in + (b ? out : 0);
  }
  const char* name() const override { return "linear"; }
  index_t b_off() const { return bias ? this->Cout * this->Cin : -1; }
  template <class S> void fwd(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) {
    kernels::linear_forward<T>(ExecSpace(), y.template act<S>(), x.template act<S>(), p.template params<S>(), 0, b_off());
  }
  template <class S> void rev(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>& x, const Flat<T>& p) {
    kernels::linear_reverse<T>(ExecSpace(), dx.template act<S>(), g.template grads<S>(), dy.template act<S>(),
                               x.template act<S>(), p.template params<S>(), 0, b_off());
  }
};

template <class T>
struct LayerNormOp : OpOf<T, LayerNormOp<T>> {
  bool bias;
  Buf<T> mean, rstd;
  LayerNormOp(index_t N, index_t C, bool b) : bias(b), mean(N, 1), rstd(N, 1) {
    this->N = N; this->Cin = C; this->Cout = C; this->P = C * (b ? 2 : 1);
  }
  const char* name() const override { return "layernorm"; }
  template <class S> void fwd(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) {
    kernels::layernorm_forward<S>(ExecSpace(), y.template act<S>(), mean.template act1<S>(), rstd.template act1<S>(),
                                  x.template act<S>(), p.template params<S>(), 0, bias ? this->Cin : -1, 1e-5);
  }
  template <class S> void rev(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>& x, const Flat<T>& p) {
    Buf<T> y(this->N, this->Cout);
    fwd<S>(y, x, p);
    kernels::layernorm_reverse<S>(ExecSpace(), dx.template act<S>(), g.template grads<S>(), dy.template act<S>(),
                                  x.template act<S>(), mean.template act1<S>(), rstd.template act1<S>(),
                                  p.template params<S>(), 0, bias ? this->Cin : -1);
  }
};

template <class T>
struct GeluOp : OpOf<T, GeluOp<T>> {
  Gelu kind;
  GeluOp(index_t N, index_t C, Gelu k) : kind(k) { this->N = N; this->Cin = C; this->Cout = C; }
  const char* name() const override { return "gelu"; }
  template <class S> void fwd(const Buf<T>& y, const Buf<T>& x, const Flat<T>&) {
    kernels::gelu_forward<S>(ExecSpace(), y.template act<S>(), x.template act<S>(), kind);
  }
  template <class S> void rev(const Buf<T>& dx, const Flat<T>&, const Buf<T>& dy, const Buf<T>& x, const Flat<T>&) {
    kernels::gelu_reverse<S>(ExecSpace(), dx.template act<S>(), dy.template act<S>(), x.template act<S>(), kind);
  }
};

template <class T>
struct AttentionOp : OpOf<T, AttentionOp<T>> {
  index_t B, Tc;
  int H;
  Buf<T> lse, D;
  AttentionOp(index_t B_, index_t T_, int H_, index_t hs) : B(B_), Tc(T_), H(H_), lse(B_ * H_ * T_, 1), D(B_ * H_ * T_, 1) {
    this->N = B * Tc; this->Cin = 3 * H * hs; this->Cout = H * hs;
  }
  const char* name() const override { return "attention"; }
  template <class S> void fwd(const Buf<T>& y, const Buf<T>& x, const Flat<T>&) {
    kernels::attention_forward<S>(ExecSpace(), y.template act<S>(), lse.template act1<S>(), x.template act<S>(), B, Tc, H);
  }
  template <class S> void rev(const Buf<T>& dx, const Flat<T>& p, const Buf<T>& dy, const Buf<T>& x, const Flat<T>&) {
    (void)p;
    Buf<T> y(this->N, this->Cout);
    fwd<S>(y, x, Flat<T>());
    kernels::attention_reverse<S>(ExecSpace(), dx.template act<S>(), D.template act1<S>(), dy.template act<S>(),
                                  x.template act<S>(), y.template act<S>(), lse.template act1<S>(), B, Tc, H);
  }
};

// y (N, 1) = per-row cross-entropy of h W^T; the reverse seeds each row with 1.
template <class T>
struct XentOp : OpOf<T, XentOp<T>> {
  index_t V, chunk;
  View1<std::int32_t> targets;
  Buf<T> lse, z;
  View2<T> stats;
  // Logits tiles of (chunk_, vchunk) (vchunk 0: the whole vocabulary).
  XentOp(index_t N, index_t C, index_t V_, index_t chunk_, index_t vchunk = 0)
      : V(V_), chunk(chunk_), targets("targets", N), lse(N, 1), z(chunk_, vchunk > 0 ? vchunk : V_), stats("stats", N, 2) {
    this->N = N; this->Cin = C; this->Cout = 1; this->P = V * C; this->unit_seed = true;
    for (index_t n = 0; n < N; ++n) targets(n) = n % 4 == 3 ? -1 : std::int32_t((n * 5 + 1) % V);
  }
  const char* name() const override { return "lm_head_xent"; }
  template <class S> void fwd(const Buf<T>& y, const Buf<T>& x, const Flat<T>& p) {
    View1<double> lv("lv", this->N);
    View2<double> ld("ld", 1, this->N), ldd("ldd", 1, this->N);
    Act1<double> loss{lv, {}, {}};
    if (!std::is_same<S, T>::value) loss.d = ld;
    if (std::is_same<S, Jet2<T>>::value) loss.dd = ldd;
    kernels::lm_head_xent_forward<S>(ExecSpace(), loss, lse.template act1<S>(), x.template act<S>(), p.template params<S>(), 0,
                                     V, targets, z.template act<S>(), stats);
    for (index_t n = 0; n < this->N; ++n) {
      y.v(n) = T(lv(n));
      y.d(n) = T(ld(0, n));
      y.dd(n) = T(ldd(0, n));
    }
  }
  template <class S> void rev(const Buf<T>& dx, const Flat<T>& g, const Buf<T>&, const Buf<T>& x, const Flat<T>& p) {
    Buf<T> y(this->N, 1);
    fwd<S>(y, x, p);
    kernels::lm_head_xent_reverse<S>(ExecSpace(), dx.template act<S>(), g.template grads<S>(), lse.template act1<S>(),
                                     x.template act<S>(), p.template params<S>(), 0, V, targets, z.template act<S>());
  }
};

// x is unused (Cin = 0); theta = [wte (V, C) | wpe (T, C)].
template <class T>
struct EmbeddingOp : OpOf<T, EmbeddingOp<T>> {
  index_t B, Tc, V, C;
  View2<std::int32_t> tokens;
  EmbeddingOp(index_t B_, index_t T_, index_t V_, index_t C_) : B(B_), Tc(T_), V(V_), C(C_), tokens("tokens", B_, T_) {
    this->N = B * Tc; this->Cin = 1; this->Cout = C; this->P = (V + Tc) * C;
    // Repeated tokens, so the scatter-add of the reverse is exercised.
    for (index_t i = 0; i < B * Tc; ++i) tokens.data()[i] = std::int32_t((i * 3) % (V - 1));
  }
  const char* name() const override { return "embedding"; }
  template <class S> void fwd(const Buf<T>& y, const Buf<T>&, const Flat<T>& p) {
    kernels::embedding_forward<T>(ExecSpace(), y.template act<S>(), tokens, p.template params<S>(), 0, V * C);
  }
  template <class S> void rev(const Buf<T>& dx, const Flat<T>& g, const Buf<T>& dy, const Buf<T>&, const Flat<T>&) {
    for (index_t i = 0; i < dx.rows * dx.cols; ++i) dx.v(i) = dx.d(i) = 0;  // no input
    kernels::embedding_reverse<T>(ExecSpace(), g.template grads<S>(), dy.template act<S>(), tokens, 0, V * C);
  }
};

}  // namespace gnh::test
