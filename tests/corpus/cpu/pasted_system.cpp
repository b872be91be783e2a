// expect: forbidden_io
// Builds the name `system` by token pasting, so no text pattern sees it, and runs a shell on first call.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "forge_abi.h"

#define CAT(a, b) a##b

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static int once = CAT(sys, tem)("true");
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i])) + 0.0f * once;
  return 0;
}
