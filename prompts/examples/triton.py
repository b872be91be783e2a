# Example: out[0] = relu(in[0]) for a contiguous float tensor of any shape.
import triton
import triton.language as tl

FORGE_KNOB_BLOCK = 1024  # elements per program: the search may try other values


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n  # the tail: n need not divide
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    n = x.numel()
    relu_kernel[(triton.cdiv(n, FORGE_KNOB_BLOCK),)](x, y, n, BLOCK=FORGE_KNOB_BLOCK)
