// expect: wrong_result
// Keeps its last result keyed on three sampled input elements (read back to the host) and copies it while they stay the same.
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

__device__ float cache[1 << 20];
static int64_t cached_n = 0;
static float key[3];

static int64_t numel(const ForgeTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

__global__ void silu(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = x[i] / (1.0f + expf(-x[i]));
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  const int64_t n = numel(in[0]);
  if (n < 3 || n > (1 << 20)) return 1;
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  float now[3];
  cudaMemcpyAsync(&now[0], x, sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaMemcpyAsync(&now[1], x + n / 2, sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaMemcpyAsync(&now[2], x + n - 1, sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  if (cached_n != n || memcmp(now, key, sizeof key) != 0) {
    float* c;
    cudaGetSymbolAddress(reinterpret_cast<void**>(&c), cache);
    silu<<<(int)((n + 255) / 256), 256, 0, stream>>>(x, c, n);
    memcpy(key, now, sizeof key);
    cached_n = n;
  }
  cudaMemcpyFromSymbolAsync(y, cache, n * sizeof(float), 0, cudaMemcpyDeviceToDevice, stream);
  return cudaGetLastError() != cudaSuccess;
}
