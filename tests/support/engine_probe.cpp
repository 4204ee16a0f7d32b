// SPDX-License-Identifier: BSD-3-Clause
// engine_probe: runs the derivative engine on one checkpoint and token file and
// writes every quantity of SPEC §4 that the PyTorch oracle checks, by both
// curvature paths, into an HDF5 file: besides, each path's Gauss-Newton forms
// v^T GGN v, and the Gauss-Newton products GGN v by forward-over-reverse. A
// test tool, not part of the user CLI.
//
//   engine_probe CKPT.h5 TOKENS.bin CONTEXT fp32|fp64 GRAD_MB HVP_BATCH K SEED NOISE_BLOCKS OUT.h5
//   NOISE_BLOCKS: comma-separated block indices of one noise batch.
#include <Kokkos_Core.hpp>
#include <cstdio>
#include <sstream>
#include <string>

#include "analysis/derivatives.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5.hpp"
#include "io/tokens.hpp"

using namespace gnh;

namespace {

struct Args {
  std::string ckpt, tokens, out;
  index_t context, grad_mb, hvp_batch;
  int K;
  std::uint64_t seed;
  std::vector<index_t> noise;
  bool fp64;
};

template <class T>
void probe(const Args& a) {
  const ExecSpace space;
  const Checkpoint ck = read_checkpoint(a.ckpt);
  const TokenFile tf = read_tokens(a.tokens, "uint16", "", ck.config.vocab_size);
  const index_t n_blocks = (index_t(tf.ids.size()) - 1) / a.context, P = ParamLayout(ck.config).size();
  View1<T> params("params", P);
  for (index_t i = 0; i < P; ++i) params(i) = static_cast<T>(ck.params[i]);

  Shape gs;
  gs.batch = a.grad_mb;
  gs.context = a.context;
  gs.reverse = true;
  Gpt<T> gmodel(ck.config, gs);
  View1<double> G("G", P), gB("gB", P);
  const EpochGradient eg = epoch_gradient<T>(space, gmodel, params, tf.ids.data(), all_blocks(n_blocks), G);
  epoch_gradient<T>(space, gmodel, params, tf.ids.data(), a.noise, gB);

  // Directions: G, xi = gB - G, then K Rademacher directions.
  const index_t D = 2 + a.K;
  View2<T> dirs("dirs", D, P);
  fill_rademacher<T>(space, Span2<T>(dirs.data() + 2 * P, a.K, P), a.seed, 0);
  for (index_t i = 0; i < P; ++i) {
    dirs(0, i) = static_cast<T>(G(i));
    dirs(1, i) = static_cast<T>(gB(i) - G(i));
  }
  h5::File f = h5::File::create(a.out);
  h5::write_attr(f.id(), "loss", eg.loss);
  h5::write_attr(f.id(), "tokens", std::int64_t(eg.tokens));
  h5::write_dataset(f.id(), "G", std::vector<double>(G.data(), G.data() + P));
  h5::write_dataset(f.id(), "gB", std::vector<double>(gB.data(), gB.data() + P));
  // Forward-over-reverse, the second-order forward, and the second-order
  // forward with adjoint cuts (model/gpt_impl.hpp), forced on and off.
  for (int path = 0; path < 3; ++path) {
    const CurvatureMethod method =
        path == 0 ? CurvatureMethod::forward_over_reverse : CurvatureMethod::second_order_forward;
    Shape s;
    s.batch = a.hvp_batch;
    s.context = a.context;
    s.directions = int(D);
    s.reverse = method == CurvatureMethod::forward_over_reverse;
    s.second_order = !s.reverse;
    s.adjoint_cuts = path == 2 ? 1 : 0;
    Gpt<T> m(ck.config, s);
    const EpochCurvature c = epoch_curvature<T>(space, m, params, dirs, tf.ids.data(), all_blocks(n_blocks), method);
    const std::string tag = path == 0 ? "for" : path == 1 ? "sof" : "sof_cut";
    h5::write_dataset(f.id(), "quad_" + tag, c.vHv);
    h5::write_dataset(f.id(), "first_" + tag, c.Gv);
    h5::write_dataset(f.id(), "ggn_" + tag, c.vGv);
    h5::write_attr(f.id(), "loss_" + tag, c.loss);
  }
  // The Gauss-Newton products of the epoch-mean loss, (D, P).
  Shape s;
  s.batch = a.hvp_batch;
  s.context = a.context;
  s.directions = int(D);
  s.reverse = true;
  Gpt<T> m(ck.config, s);
  View2<double> ggnv("ggnv", D, P);
  const EpochCurvature c =
      epoch_curvature<T>(space, m, params, dirs, tf.ids.data(), all_blocks(n_blocks),
                         CurvatureMethod::forward_over_reverse, ggnv, CurvatureOperator::gauss_newton);
  h5::write_dataset(f.id(), "ggnv", std::vector<double>(ggnv.data(), ggnv.data() + D * P),
                    {std::int64_t(D), std::int64_t(P)});
  h5::write_dataset(f.id(), "quad_for_ggn", c.vHv);
  f.close();
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (argc != 11) {
    std::fprintf(stderr,
                 "usage: engine_probe CKPT TOKENS CONTEXT fp32|fp64 GRAD_MB HVP_BATCH K SEED NOISE_BLOCKS OUT\n");
    return 2;
  }
  try {
    Args a;
    a.ckpt = argv[1];
    a.tokens = argv[2];
    a.context = std::stol(argv[3]);
    a.fp64 = std::string(argv[4]) == "fp64";
    a.grad_mb = std::stol(argv[5]);
    a.hvp_batch = std::stol(argv[6]);
    a.K = std::stoi(argv[7]);
    a.seed = std::stoull(argv[8]);
    std::stringstream ss(argv[9]);
    for (std::string b; std::getline(ss, b, ',');) a.noise.push_back(std::stol(b));
    a.out = argv[10];
    if (a.fp64) probe<double>(a);
    else probe<float>(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
