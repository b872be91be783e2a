// Example: out[0] = relu(in[0]) for a float32 tensor of any shape (contiguous input), on the given stream.
#include <stdint.h>
#include "forge_abi.h"
#define FORGE_KNOB_THREADS 256  // threads per block: the search may try other values

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;  // grid-stride loop: any n, tails included
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32 || out[0].dtype != FORGE_FLOAT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  int64_t blocks = (n + FORGE_KNOB_THREADS - 1) / FORGE_KNOB_THREADS;
  if (blocks > 65535) blocks = 65535;
  if (blocks > 0)
    relu_kernel<<<(unsigned)blocks, FORGE_KNOB_THREADS, 0, stream>>>((const float*)in[0].data, (float*)out[0].data, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
