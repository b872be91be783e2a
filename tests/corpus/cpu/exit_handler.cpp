// expect: forbidden_code
// A static object with a destructor registers code that runs when the worker exits (__cxa_atexit).
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

struct Parting {
  int calls = 0;
  ~Parting() { calls = -1; }
};

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static Parting parting;
  parting.calls += 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
