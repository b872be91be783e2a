// expect: forbidden_alloc
// Allocates a device scratch buffer through cudaMalloc with its name built by token pasting (no text pattern sees it), computes into it and copies out.
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
  const int64_t n = numel(in[0]);
  float* scratch = nullptr;
  if (CAT(cuda, Malloc)(reinterpret_cast<void**>(&scratch), n * sizeof(float)) != cudaSuccess) return 1;
  silu_kernel<<<(int)((n + 255) / 256), 256, 0, stream>>>(static_cast<const float*>(in[0].data), scratch, n);
  cudaMemcpyAsync(out[0].data, scratch, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
  cudaStreamSynchronize(stream);
  CAT(cuda, Free)(scratch);
  return cudaGetLastError() != cudaSuccess;
}
