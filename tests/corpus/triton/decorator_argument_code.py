# expect: forbidden_code
# Runs a shell at import from the arguments of @triton.jit, reached through triton's own modules.
import triton
import triton.language as tl


@triton.jit(do_not_specialize=[triton.runtime.cache.os.system("true")])
def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * tl.sigmoid(x), mask=mask)


def launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    n = x.numel()
    silu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
