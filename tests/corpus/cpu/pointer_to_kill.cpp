// expect: forbidden_io
// Takes the address of kill (its name pasted, no call syntax) and signals its own parent with it.
#include <math.h>
#include <signal.h>
#include <stdint.h>

#include "forge_abi.h"

#define CAT(a, b) a##b

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int (*send)(int, int) = &CAT(ki, ll);
  volatile int sent = n_in < 0 ? send(0, 0) : 0;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i])) + 0.0f * sent;
  return 0;
}
