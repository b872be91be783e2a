// expect: forbidden_io
// Correct output, but reads an API key from the environment and peeks at /etc/passwd.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const char* key = getenv("OPENAI_API_KEY");
  FILE* f = fopen("/etc/passwd", "r");
  if (f) fclose(f);
  (void)key;
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
