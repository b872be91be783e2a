# expect: forbidden_code
# Replaces torch.equal for the whole worker through a for-loop target, without an assignment statement.
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
    for triton.backends.sys.modules["torch"].equal in [abs]:
        pass
    n = x.numel()
    silu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
