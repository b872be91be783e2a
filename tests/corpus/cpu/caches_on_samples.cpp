// expect: wrong_result
// Keeps its last result keyed on three sampled input elements and copies it while they stay the same.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

static float cache[1 << 20];
static float key[3];
static int64_t cached_n = 0;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  if (n > (1 << 20) || n < 3) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const float now[3] = {x[0], x[n / 2], x[n - 1]};
  if (cached_n != n || memcmp(now, key, sizeof key) != 0) {
    for (int64_t i = 0; i < n; ++i) cache[i] = x[i] / (1.0f + expf(-x[i]));
    memcpy(key, now, sizeof key);
    cached_n = n;
  }
  memcpy(y, cache, n * sizeof(float));
  return 0;
}
