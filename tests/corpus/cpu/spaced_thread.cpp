// expect: forbidden_concurrency
// Starts a std :: thread (spaces around the `::`) that finishes writing after the launch returned.
#include <math.h>
#include <stdint.h>

#include <thread>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  std :: thread worker([=] {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  });
  worker.detach();
  return 0;
}
