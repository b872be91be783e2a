// expect: forbidden_timer
// Reads the clock with clock_gettime (to spot the benchmark loop and behave differently in it).
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return ts.tv_sec < 0;
}
