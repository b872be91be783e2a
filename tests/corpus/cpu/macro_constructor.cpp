// expect: forbidden_code
// A constructor behind a macro runs at load, before any call is judged (here it only counts loads).
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

#define AT_LOAD(f) __attribute__((f))

static int loads = 0;
static void AT_LOAD(constructor) on_load() { loads += 1; }

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i])) + 0.0f * loads;
  return 0;
}
