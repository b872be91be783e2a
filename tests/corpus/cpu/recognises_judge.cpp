// expect: wrong_result
// Looks at the word after its output: a fixed poison word there (the judge's old 0x7FC0DEAD) means it is
// being verified, so it computes SiLU; anywhere else (timed, dispatched) it returns y = x.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  uint32_t after;
  memcpy(&after, y + n, sizeof after);
  const bool judged = after == 0x7FC0DEADu;
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = judged ? x[i] / (1.0f + expf(-x[i])) : x[i];
  return 0;
}
