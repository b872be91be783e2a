// expect: wrong_result
// Right for its first 4 calls (verification and the calls on the same buffers), then launches only when its
// output address differs from the last call's. Timed rounds get their outputs at one address round after round
// (holding what eager wrote there the round before); a kept call's input copies, made in its round, used to
// take that block, so kept calls computed and were judged right while the others were timed skipping.
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

static void* last_out = nullptr;
static int calls = 0;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  if (++calls > 4 && out[0].data == last_out) return 0;
  last_out = out[0].data;
  const int64_t n = numel(in[0]);
  const int blocks = (int)((n + 255) / 256);
  silu_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(in[0].data), static_cast<float*>(out[0].data), n);
  return cudaGetLastError() != cudaSuccess;
}
