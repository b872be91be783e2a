// (x * 1.5 + 0.25) * (x - 0.75) + x * x in one pass: OpenMP over blocks, a vectorised inner loop.
#include "forge_abi.h"
#define FORGE_KNOB_BLOCK 16384
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* __restrict x = (const float*)in[0].data;
  float* __restrict y = (float*)out[0].data;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; b += FORGE_KNOB_BLOCK) {
    const int64_t e = b + FORGE_KNOB_BLOCK < n ? b + FORGE_KNOB_BLOCK : n;
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = (x[i] * 1.5f + 0.25f) * (x[i] - 0.75f) + x[i] * x[i];
  }
  return 0;
}
