# expect: forbidden_code
# Builds its block size with eval() on a string: arbitrary code outside the rules.
import triton
import triton.language as tl


@triton.jit
def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * tl.sigmoid(x), mask=mask)


def launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    n = x.numel()
    block = eval("2 ** 10")
    silu_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block)
