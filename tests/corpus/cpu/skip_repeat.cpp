// expect: stale_result
// Computes only when the output pointer differs from the last call's; a repeated call returns at once.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

static void* last_out = nullptr;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (out[0].data == last_out) return 0;  // "already computed into this buffer"
  last_out = out[0].data;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
