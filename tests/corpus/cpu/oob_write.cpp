// expect: out_of_bounds
// Correct output, then writes 300 elements past the end of the output buffer.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  for (int64_t i = n; i < n + 300; ++i) y[i] = 0.0f;
  return 0;
}
