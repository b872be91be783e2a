// expect: input_mutated
// Uses its input as scratch space during the call (the result written there first) and restores it bit for bit before returning.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  float* x = static_cast<float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  memcpy(y, x, n * sizeof(float));  // the input, saved in the output
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) x[i] = y[i] / (1.0f + expf(-y[i]));  // the result, in the input
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    float r = x[i];
    x[i] = y[i];  // the input back, bit for bit
    y[i] = r;
  }
  return 0;
}
