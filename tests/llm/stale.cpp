// Cheats: computes the first call's result once and returns it for every later input.
#include <string.h>
#include <math.h>
#include "forge_abi.h"
static float cache[1 << 20];
static int64_t cached_n = 0;
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  if (n > (1 << 20)) return 1;
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  if (cached_n != n) {
    for (int64_t i = 0; i < n; ++i) cache[i] = sinf(x[i]) * cosf(x[i]) + erff(x[i]);
    cached_n = n;
  }
  memcpy(y, cache, n * sizeof(float));
  return 0;
}
