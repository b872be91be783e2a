// expect: input_mutated
// Correct output, then casts away const and overwrites the input with the result (in place).
#include <cuda_runtime.h>
#include <stdint.h>

#include "forge_abi.h"

static int64_t numel(const ForgeTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

__global__ void silu_kernel(float* x, float* __restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = x[i] / (1.0f + expf(-x[i]));
    x[i] = y[i];
  }
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  const int64_t n = numel(in[0]);
  const int blocks = (int)((n + 255) / 256);
  silu_kernel<<<blocks, 256, 0, stream>>>(static_cast<float*>(in[0].data), static_cast<float*>(out[0].data), n);
  return cudaGetLastError() != cudaSuccess;
}
