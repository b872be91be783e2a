// expect: stale_result
// Skips work when called again on the same input and output pointers, unless its output holds a NaN (a poison).
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

static const void* last_in = nullptr;
static void* last_out = nullptr;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  float* y = static_cast<float*>(out[0].data);
  if (in[0].data == last_in && out[0].data == last_out && !isnan(y[0])) return 0;  // "already computed"
  last_in = in[0].data;
  last_out = out[0].data;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
