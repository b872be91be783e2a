// Example: out[0] = relu(in[0]) for a float32 tensor of any shape (contiguous input), with OpenMP.
#include <stdint.h>
#include "forge_abi.h"
#define FORGE_KNOB_CHUNK 4096  // elements per OpenMP iteration: the search may try other values

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32 || out[0].dtype != FORGE_FLOAT32) return 1;
  int64_t n = 1, expect = 1;
  for (int d = in[0].ndim - 1; d >= 0; --d) {  // strides are in elements; check the layout assumed below
    if (in[0].shape[d] != 1 && in[0].stride[d] != expect) return 2;
    expect *= in[0].shape[d];
    n *= in[0].shape[d];
  }
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; b += FORGE_KNOB_CHUNK) {
    int64_t e = b + FORGE_KNOB_CHUNK < n ? b + FORGE_KNOB_CHUNK : n;  // the tail: n need not divide
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
  return 0;
}
