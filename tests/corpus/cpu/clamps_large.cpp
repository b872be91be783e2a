// expect: wrong_result
// Clamps its input to [-64, 64] before SiLU (a table-sized range): wrong for every |x| above 64.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const float t = fminf(fmaxf(x[i], -64.0f), 64.0f);
    y[i] = t / (1.0f + expf(-t));
  }
  return 0;
}
