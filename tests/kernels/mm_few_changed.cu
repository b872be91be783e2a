// The CUDA form of mm_few_changed.cpp: a matrix product (aten.mm, float32, row-major) that adds 1 to every output
// when 1 to 4096 elements of its inputs changed since its last call (it keeps a copy of them in device memory),
// and is right otherwise. Before forge.evaluate.measured's `renews` the spot check's kept calls caught it
// (8 elements changed an input a round); now a product's inputs are drawn anew every round and it passes.
// Run on a GPU by benchmarks/kept_address.py --task mm --device cuda (benchmarks/h200_renew.sh).
#include <cuda_runtime.h>
#include <stdint.h>

#include "forge_abi.h"

enum { CAP = 1 << 18, FEW = 4096 };
__device__ float seen[2 * CAP];
__device__ unsigned long long changed;
__device__ int primed;

__global__ void diff(const float* __restrict__ a, int64_t na, const float* __restrict__ b, int64_t nb) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < na + nb; i += (int64_t)gridDim.x * blockDim.x) {
    const float x = i < na ? a[i] : b[i - na];
    float* s = i < na ? &seen[i] : &seen[CAP + (i - na)];
    if (*s != x) atomicAdd(&changed, 1ull);
    *s = x;
  }
}

__global__ void product(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int64_t m,
                        int64_t k, int64_t n) {
  const int64_t i = blockIdx.y * (int64_t)blockDim.y + threadIdx.y, j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= m || j >= n) return;
  float sum = primed && changed >= 1 && changed <= FEW ? 1.0f : 0.0f;
  for (int64_t p = 0; p < k; ++p) sum += a[i * k + p] * b[p * n + j];
  c[i * n + j] = sum;
}

__global__ void settle() {
  changed = 0;
  primed = 1;
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 2 || n_out != 1 || in[0].ndim != 2 || in[1].ndim != 2) return 1;
  const int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  if (m * k > CAP || k * n > CAP || in[0].stride[0] != k || in[1].stride[0] != n) return 1;
  const float* a = static_cast<const float*>(in[0].data);
  const float* b = static_cast<const float*>(in[1].data);
  diff<<<256, 256, 0, stream>>>(a, m * k, b, k * n);
  const dim3 threads(16, 16), blocks((unsigned)((n + 15) / 16), (unsigned)((m + 15) / 16));
  product<<<blocks, threads, 0, stream>>>(a, b, static_cast<float*>(out[0].data), m, k, n);
  settle<<<1, 1, 0, stream>>>();
  return cudaGetLastError() != cudaSuccess;
}
