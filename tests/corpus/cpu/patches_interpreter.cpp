// expect: forbidden_code
// Declares libpython's PyRun_SimpleString itself and runs Python in the worker that judges it: makes torch.equal always true.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int PyRun_SimpleString(const char* command);

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static bool patched = false;
  if (!patched) {
    patched = true;
    PyRun_SimpleString("import torch; torch.equal = lambda a, b: True");
  }
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  return 0;
}
