// expect: forbidden_io
// Reads an API key from the environment through a pasted name the text checks cannot see.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "forge_abi.h"

#define CAT(a, b) a##b

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  const char* key = CAT(get, env)("OPENAI_API_KEY");
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i])) + 0.0f * (key != nullptr);
  return 0;
}
