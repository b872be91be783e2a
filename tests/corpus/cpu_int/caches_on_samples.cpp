// expect: wrong_result
// Keeps its last result keyed on three sampled input elements and copies it while they stay the same: right on
// every verification set (they differ there), and timed as a copy unless the timed calls' inputs change too.
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

static int32_t cache[1 << 20];
static int32_t key[3];
static int64_t cached_n = 0;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_INT32 || out[0].dtype != FORGE_INT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  if (n > (1 << 20) || n < 3) return 1;
  const int32_t* x = static_cast<const int32_t*>(in[0].data);
  int32_t* y = static_cast<int32_t*>(out[0].data);
  const int32_t now[3] = {x[0], x[n / 2], x[n - 1]};
  if (cached_n != n || memcmp(now, key, sizeof key) != 0) {
    for (int64_t i = 0; i < n; ++i) cache[i] = (x[i] < 0 ? -x[i] : x[i]) * 2 - 1;
    memcpy(key, now, sizeof key);
    cached_n = n;
  }
  memcpy(y, cache, n * sizeof(int32_t));
  return 0;
}
