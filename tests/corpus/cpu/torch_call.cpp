// expect: forbidden_torch
// Lets ATen do the work: wraps the buffers in tensors and calls at::silu_out.
#include <ATen/ATen.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  at::IntArrayRef shape(in[0].shape, in[0].ndim);
  at::Tensor x = at::from_blob(in[0].data, shape, at::kFloat);
  at::Tensor y = at::from_blob(out[0].data, shape, at::kFloat);
  at::silu_out(y, x);
  return 0;
}
