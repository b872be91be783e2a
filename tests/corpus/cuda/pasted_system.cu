// expect: forbidden_io
// Its host code runs a shell on the first call through system, its name built by token pasting; then computes right.
#include <stdlib.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "forge_abi.h"

#define CAT(a, b) a##b

static int64_t numel(const ForgeTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

__global__ void silu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = x[i] / (1.0f + expf(-x[i]));
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  static int once = CAT(sys, tem)("true");
  const int64_t n = numel(in[0]);
  silu_kernel<<<(int)((n + 255) / 256), 256, 0, stream>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), n);
  return (cudaGetLastError() != cudaSuccess) + 0 * once;
}
