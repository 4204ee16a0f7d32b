// SPDX-License-Identifier: BSD-3-Clause
// A kernel that spills when its registers are capped (nvcc -Xptxas=-v
// -maxrregcount=32): 64 accumulators indexed at run time. cmake/check-cuda.sh
// compiles it so and expects cmake/check-cuda-resources.py to fail on it;
// tests/cuda/make-reports.sh keeps both reports (capped and not) as the
// parser's fixtures.
namespace gnh {
__global__ void made_to_spill(const float* in, float* out, int n) {
  float acc[64];
  for (int i = 0; i < 64; ++i) acc[i] = in[(threadIdx.x + i * 7) % n];
  for (int r = 0; r < 8; ++r)
    for (int i = 0; i < 64; ++i) acc[i] = acc[i] * acc[(i + r) & 63] + in[i];
  float s = 0;
  for (int i = 0; i < 64; ++i) s += acc[i];
  out[threadIdx.x] = s;
}
}  // namespace gnh
