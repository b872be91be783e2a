// expect: stale_result
// A static __device__ array keeps the first call's result; every later call copies it whatever the input.
#include <cuda_runtime.h>
#include <stdint.h>

#include "forge_abi.h"

static int64_t numel(const ForgeTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

#define CAPACITY (1 << 20)
static __device__ float cache[CAPACITY];
static int64_t cached_n = 0;

__global__ void silu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, int fill) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (fill) cache[i] = x[i] / (1.0f + expf(-x[i]));
  y[i] = cache[i];
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  const int64_t n = numel(in[0]);
  if (n > CAPACITY) return 1;
  const int blocks = (int)((n + 255) / 256);
  silu_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), n,
                                          cached_n != n);
  cached_n = n;
  return cudaGetLastError() != cudaSuccess;
}
