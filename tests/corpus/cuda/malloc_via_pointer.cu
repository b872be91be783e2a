// expect: forbidden_alloc
// Takes &cudaMalloc into a function pointer so that no "cudaMalloc(" call appears in the text.
#include <cuda_runtime.h>
#include <stdint.h>

#include "forge_abi.h"

static int64_t numel(const ForgeTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

__global__ void silu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = x[i] / (1.0f + expf(-x[i]));
}

typedef cudaError_t (*alloc_fn)(void**, size_t);
static alloc_fn volatile get_memory = &cudaMalloc;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  const int64_t n = numel(in[0]);
  void* scratch = nullptr;
  if (get_memory(&scratch, n * sizeof(float)) != cudaSuccess) return 1;
  const int blocks = (int)((n + 255) / 256);
  silu_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(in[0].data), static_cast<float*>(scratch), n);
  cudaMemcpyAsync(out[0].data, scratch, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
  cudaFreeAsync(scratch, stream);
  return cudaGetLastError() != cudaSuccess;
}
