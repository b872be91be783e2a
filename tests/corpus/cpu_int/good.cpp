// expect: ok
// A correct kernel for the integer task y = abs(x) * 2 - 1 over int32, parallel with OpenMP.
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_INT32 || out[0].dtype != FORGE_INT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const int32_t* x = static_cast<const int32_t*>(in[0].data);
  int32_t* y = static_cast<int32_t*>(out[0].data);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] < 0 ? -x[i] : x[i]) * 2 - 1;
  return 0;
}
