# expect: forbidden_torch
# launch() lets PyTorch do the work (torch.sigmoid) and copies the result into the output.
import torch
import triton
import triton.language as tl


@triton.jit
def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * tl.sigmoid(x), mask=mask)


def launch(inputs, outputs):
    x = inputs[0]
    outputs[0].copy_(x * torch.sigmoid(x))
