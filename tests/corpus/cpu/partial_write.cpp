// expect: partial_write
// Processes whole blocks of 64 only and skips the tail (the last n % 64 elements are never written).
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const int64_t blocks = n / 64;
#pragma omp parallel for
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = b * 64; i < b * 64 + 64; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
