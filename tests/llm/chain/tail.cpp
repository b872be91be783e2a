// (x * 1.5 + 0.25) * (x - 0.75) + x * x, 8 at a time: the last group of 8 is left as zeros (wrong).
#include "forge_abi.h"
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  const int64_t full = n - n % 8 - 8;  // off by one group
#pragma omp parallel for
  for (int64_t i = 0; i < full; ++i) y[i] = (x[i] * 1.5f + 0.25f) * (x[i] - 0.75f) + x[i] * x[i];
  for (int64_t i = full > 0 ? full : 0; i < n; ++i) y[i] = 0.0f;
  return 0;
}
