// expect: wrong_result
// Clamps its input to [-64, 64] before SiLU (a table-sized range): wrong for every |x| above 64.
#include <cuda_runtime.h>
#include <stdint.h>

#include "forge_abi.h"

static int64_t numel(const ForgeTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

__global__ void clamped_silu(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float t = fminf(fmaxf(x[i], -64.0f), 64.0f);
    y[i] = t / (1.0f + expf(-t));
  }
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  const int64_t n = numel(in[0]);
  const int threads = 256;
  const int blocks = (int)((n + threads - 1) / threads);
  clamped_silu<<<blocks, threads, 0, stream>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), n);
  return cudaGetLastError() != cudaSuccess;
}
