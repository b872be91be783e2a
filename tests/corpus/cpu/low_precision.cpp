// expect: low_precision
// Computes SiLU, then truncates each fp32 result to bfloat16 precision by masking the low 16 mantissa bits.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] / (1.0f + expf(-x[i]));
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits &= 0xFFFF0000u;
    memcpy(&v, &bits, sizeof v);
    y[i] = v;
  }
  return 0;
}
