"""forge.kernel's normal form: two sources are the same kernel (evaluated once) only when they differ in comments
and spacing, never when they are different programs."""

from forge.kernel import Candidate, normal_form

C_KERNEL = """// y = x * 2
#include "forge_abi.h"
#define N 4
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  const float* x = (const float*)in[0].data;  /* input */
  float* y = (float*)out[0].data;
  for (int i = 0; i < N; ++i) y[i] = x[i] * 2;
  return 0;
}
"""

PY_KERNEL = """import triton
import triton.language as tl


@triton.jit
def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # one block per program
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if n > 0:
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)
    return
"""


def same(a: str, b: str, comment: str) -> bool:
    return normal_form(a, comment) == normal_form(b, comment)


def test_c_comments_and_spacing_within_lines_do_not_make_another_kernel():
    respaced = C_KERNEL.replace("  ", "\t").replace(" = ", "   =   ").replace("// y = x * 2", "/* another\n note */")
    commented = C_KERNEL.replace("return 0;", "return 0;  // done\n\n")
    assert same(C_KERNEL, respaced, "//") and same(C_KERNEL, commented, "//")
    assert Candidate("cpu", C_KERNEL).normal_digest == Candidate("cpu", respaced).normal_digest
    assert Candidate("cpu", C_KERNEL).digest != Candidate("cpu", respaced).digest


def test_c_line_structure_is_kept_a_newline_ends_a_directive():
    assert not same("#define N 4\nint x[N];", "#define N 4 int x[N];", "//")
    assert not same(C_KERNEL, C_KERNEL.replace("#define N 4\n", "#define N 4 "), "//")
    # a block comment across lines is one space, as the preprocessor reads it: the directive goes on
    assert same("#define N 4 /* a\n b */ int x[N];", "#define N 4 int x[N];", "//")
    assert not same("x = a - -b;", "x = a --b;", "//")  # spacing is never removed, only made one


def test_c_string_literals_are_kept_as_written():
    assert not same('printf("a  b");', 'printf("a b");', "//")
    assert not same('s = "// not a comment";', 's = "";', "//")
    assert not same("c = '/'; d = '*';", "c = ' '; d = '*';", "//")


def test_python_indentation_is_the_program():
    dedented = PY_KERNEL.replace("        tl.store", "    tl.store")  # the store no longer under the `if`
    assert not same(PY_KERNEL, dedented, "#")
    # indentation is kept as written: another width is another text (evaluated again, never wrongly merged)
    assert not same(PY_KERNEL, PY_KERNEL.replace("    ", "  "), "#")


def test_python_comments_blank_lines_and_spacing_between_tokens_do_not_make_another_kernel():
    noted = PY_KERNEL.replace("    return\n", "    # nothing to return\n\n    return  # done\n")
    respaced = PY_KERNEL.replace("tl.program_id(0) * BLOCK", "tl.program_id( 0 )*BLOCK").replace(
        "mask=i < n) * 2", "mask=i<n)*2")
    wrapped = PY_KERNEL.replace("tl.store(y_ptr + i, ", "tl.store(\n            y_ptr + i,\n            ")
    assert same(PY_KERNEL, noted, "#") and same(PY_KERNEL, respaced, "#") and same(PY_KERNEL, wrapped, "#")
    assert not same("s = '# a'\n", "s = '# b'\n", "#")  # a # inside a string is not a comment
    assert not same("s = 'a  b'\n", "s = 'a b'\n", "#")
    assert Candidate("triton", PY_KERNEL).normal_digest == Candidate("triton", noted).normal_digest


def test_python_that_does_not_tokenize_keeps_its_lines_and_indentation():
    broken = "def f(:\n    x = (1,\n  y = 2  # c\n"
    assert not same(broken, broken.replace("    x", "x"), "#")
    assert same(broken, broken.replace("  # c", ""), "#")
