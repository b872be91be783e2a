// (x * 1.5 + 0.25) * (x - 0.75) + x * x, with a typo: does not compile.
#include "forge_abi.h"
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * 1.5f + 0.25f) * (x[i] - 0.75f) + x[i] * x[i];
  return 0;
}
