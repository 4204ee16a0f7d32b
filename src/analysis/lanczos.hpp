// SPDX-License-Identifier: BSD-3-Clause
// The host arithmetic of SPEC §10's spectrum, on the small matrices a Lanczos
// run leaves (no Kokkos, no vectors of n_params): the Ritz pairs of the
// tridiagonal, the residuals of the largest, and the stochastic Lanczos
// quadrature density. The chains themselves are analysis/spectrum.hpp's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/settings.hpp"
#include "core/index.hpp"

namespace gnh {

// The fixed chunk of the chains' dot products (analysis/spectrum.hpp): part
// of what a result is, so part of a saved state's key.
constexpr index_t kLanczosChunk = index_t(1) << 16;

// Bytes one member of a team of `members` keeps for the chains (the basis
// shard, the whole current vectors, the step's work vectors, and the Ritz
// vectors of curvature.eigenvectors).
std::size_t lanczos_bytes(index_t n_params, const CurvatureSettings& c, index_t directions_per_pass, int members);

// The eigen-decomposition T = S diag(theta) S^T of the symmetric tridiagonal
// with diagonal alpha (n) and off-diagonal beta (the first n - 1 values are
// used), as Lanczos needs it: the eigenvalues theta ascending, the Gauss
// weights S(0, i)^2 (they sum to 1) and the last row S(n - 1, i), whose size
// times the next beta is the residual of Ritz pair i. Implicit QL with
// Wilkinson shifts, carrying only the first and last rows of S: O(n^2).
// With vectors, the whole S as well (O(n^3)): row-major n x n, column i the
// eigenvector of values[i] (the Ritz vector's coefficients in the basis).
struct RitzPairs {
  std::vector<double> values, weights, last;
  std::vector<double> vectors;
};
RitzPairs ritz_pairs(const std::vector<double>& alpha, const std::vector<double>& beta, bool vectors = false);

// Why a chain stopped (recorded per chain in the output).
enum class ChainStop : int { running = 0, steps = 1, converged = 2, invariant_subspace = 3 };
const char* to_string(ChainStop s);

// The largest k Ritz values of a chain after j steps (descending) and their
// residual norms beta_j |S(j - 1, i)| = |H y_i - theta_i y_i|.
struct TopRitz {
  std::vector<double> values, residuals;
};
TopRitz top_ritz(const RitzPairs& r, double beta_next, index_t k);

// Whether a chain stops after this step: every one of the top k Ritz pairs
// has a residual at most tolerance x max |theta| (the operator's norm as the
// chain sees it), with tolerance > 0; or the next beta vanished against that
// norm (an invariant subspace: the Ritz values are exact).
ChainStop chain_stop(const RitzPairs& r, double beta_next, index_t k, double tolerance, index_t steps,
                     index_t max_steps);

// Stochastic Lanczos quadrature: the mean over chains of sum_i w_i N(x;
// theta_i, sigma^2) on `points` equally spaced x from min theta - 8 sigma to
// max theta + 8 sigma (the Gaussian beyond 8 sigma holds < 1e-15 of its
// mass), sigma = relative x (max theta - min theta) over all chains (or
// relative x max |theta| when every Ritz value is the same). It integrates
// to one; its mean is the chains' mean of sum w theta = v^T H v and its
// second moment that of sum w theta^2 = |H v|^2, plus sigma^2.
struct SpectralDensity {
  double broadening = 0;  // sigma
  std::vector<double> grid, density;
};
SpectralDensity slq_density(const std::vector<RitzPairs>& chains, index_t points, double relative);

}  // namespace gnh

namespace gnh {

// What a chain has done, as a run saves it after every Lanczos step so that a
// killed run resumes from the last completed step.
struct LanczosChainState {
  std::int64_t steps = 0;  // completed steps: alpha and beta have this many values
  ChainStop stop = ChainStop::running;
  double start_vHv = 0, start_Hv_sqnorm = 0;
  std::vector<double> alpha, beta;
};
struct LanczosState {
  std::string key;  // the computation's shape (operator, sizes, chunking); a saved state of another is ignored
  std::vector<LanczosChainState> chains;
};

// Where the chains' state and Lanczos basis live between steps (the driver
// keeps them in files beside the group files). The basis is one array of
// chains x (steps + 1) x n_params doubles; each team member writes and reads
// its own elements of it.
class LanczosStore {
 public:
  virtual ~LanczosStore() = default;
  // Team rank 0: the state saved under state.key; false if none.
  virtual bool load(LanczosState& state) = 0;
  // Team rank 0, once every member's basis rows of the step are synced.
  virtual void save(const LanczosState& state) = 0;
  virtual void write(std::int64_t offset, const double* x, std::int64_t count) = 0;
  virtual void read(std::int64_t offset, double* x, std::int64_t count) = 0;
  virtual void sync() = 0;  // this member's writes durable
};

}  // namespace gnh
