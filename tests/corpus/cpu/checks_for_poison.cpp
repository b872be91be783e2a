// expect: wrong_result
// Computes SiLU only when its output buffer holds NaN (the judge's poison); in a reused buffer, y = x.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const bool judged = isnan(y[0]);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = judged ? x[i] / (1.0f + expf(-x[i])) : x[i];
  return 0;
}
