// expect: nonfinite
// SiLU as x / (x / silu(x)): right everywhere but at zero, where it is 0/0 (the old inputs were never zero).
#include <cuda_runtime.h>
#include <stdint.h>

#include "forge_abi.h"

static int64_t numel(const ForgeTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

__global__ void silu_but_zero(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float sig = 1.0f / (1.0f + expf(-x[i]));
    y[i] = x[i] == 0.0f ? x[i] / (x[i] * sig) : x[i] * sig;
  }
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  const int64_t n = numel(in[0]);
  const int threads = 256;
  const int blocks = (int)((n + threads - 1) / threads);
  silu_but_zero<<<blocks, threads, 0, stream>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), n);
  return cudaGetLastError() != cudaSuccess;
}
