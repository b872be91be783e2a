// (x * 1.5 + 0.25) * (x - 0.75) + x * x over a 2-D float32 tensor, one column at a time: right, but every
// access strides a whole row (slower than eager).
#include "forge_abi.h"
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32 || in[0].ndim != 2) return 1;
  const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      const float v = x[i * cols + j];
      y[i * cols + j] = (v * 1.5f + 0.25f) * (v - 0.75f) + v * v;
    }
  }
  return 0;
}
