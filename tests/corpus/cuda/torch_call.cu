// expect: forbidden_torch
// Lets ATen do the work: wraps the device buffers in tensors and calls at::silu_out.
#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, cudaStream_t stream) {
  at::IntArrayRef shape(in[0].shape, in[0].ndim);
  auto opts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor x = at::from_blob(in[0].data, shape, opts);
  at::Tensor y = at::from_blob(out[0].data, shape, opts);
  at::silu_out(y, x);
  return 0;
}
