// expect: forbidden_alloc
// Asks malloc for 1 TiB (1 << 40 bytes) of scratch memory.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  float* scratch = static_cast<float*>(malloc(size_t(1) << 40));
  if (!scratch) return 1;
  for (int64_t i = 0; i < n; ++i) scratch[i] = x[i] / (1.0f + expf(-x[i]));
  for (int64_t i = 0; i < n; ++i) y[i] = scratch[i];
  free(scratch);
  return 0;
}
