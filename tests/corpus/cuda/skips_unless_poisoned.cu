// expect: stale_result
// Skips work when called again on the same input and output pointers, unless its output holds a NaN (a poison).
#include <cuda_runtime.h>
#include <math.h>
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

static const void* last_in = nullptr;
static void* last_out = nullptr;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  float first = 0.0f;
  if (in[0].data == last_in && out[0].data == last_out) {
    cudaMemcpyAsync(&first, out[0].data, sizeof(float), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    if (!isnan(first)) return 0;  // "already computed"
  }
  last_in = in[0].data;
  last_out = out[0].data;
  const int64_t n = numel(in[0]);
  const int blocks = (int)((n + 255) / 256);
  silu_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), n);
  return cudaGetLastError() != cudaSuccess;
}
