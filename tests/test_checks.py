"""Unit tests of forge.evaluate.checks on small sources: each rule fires with its status, good kernels pass clean."""

from __future__ import annotations

import pytest

from forge.evaluate.checks import check, check_c, check_python
from forge.kernel import Candidate, Status

CPU_LAUNCH = 'extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {\n'
CUDA_LAUNCH = ('extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out,\n'
               '                            cudaStream_t stream) {\n')


def cpu(body: str, head: str = "") -> str:
    """A cpu launcher around `body` (after `head`: includes, globals)."""
    return f'#include "forge_abi.h"\n{head}\n{CPU_LAUNCH}  {body}\n  return 0;\n}}\n'


def cuda(body: str, head: str = "") -> str:
    """A cuda launcher around `body` (after `head`)."""
    return f'#include <cuda_runtime.h>\n#include "forge_abi.h"\n{head}\n{CUDA_LAUNCH}  {body}\n  return 0;\n}}\n'


def statuses(findings: list[tuple[Status, str]]) -> list[Status]:
    return [s for s, _ in findings]


GOOD_CPU = """\
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "forge_abi.h"

// No malloc, no std::thread, no getenv() here: the harness owns every buffer.
/* Not even a calloc() or fopen("/etc/passwd") in a block comment,
   nor std::chrono or clock_gettime. */

template <typename T>
static inline T silu(T x) {
  return x / (T(1) + expf(-x));
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  float time_scale = 1.0f;  // names that merely contain forbidden words
  int n_open = 0, remove_count = 0, newest = omp_get_max_threads();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = silu(x[i]) * time_scale;
  return n_open + remove_count + (newest < 0);
}
"""

GOOD_CUDA = """\
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "forge_abi.h"

// We never cudaMalloc, cudaStreamCreate or cudaEventRecord: one launch on the given stream.
static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <int BLOCK>
__global__ void silu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  __shared__ float tile[BLOCK];
  const int64_t i = blockIdx.x * (int64_t)BLOCK + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  unsigned lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  if (i < n) y[i] = tile[threadIdx.x] * sigmoid(tile[threadIdx.x]) + 0.0f * lane;
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out,
                            cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  constexpr int kBlock = 256;
  const int grid = (int)((n + kBlock - 1) / kBlock);
  silu_kernel<kBlock><<<grid, kBlock, 0, stream>>>(static_cast<const float*>(in[0].data),
                                                  static_cast<float*>(out[0].data), n);
  return cudaGetLastError() != cudaSuccess;
}
"""

GOOD_TRITON = """\
import math

import triton
import triton.language as tl


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}), triton.Config({"BLOCK": 2048})], key=["n"])
@triton.jit
def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * _sigmoid(x), mask=mask)


def grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    assert x.is_contiguous() and x.element_size() == 4
    n = x.numel()
    assert math.prod(x.shape) == n and x.stride(-1) == 1
    silu_kernel[grid(n)](x, y, n)
"""


# --- good kernels pass ------------------------------------------------------------------------------------


def test_good_cpu_kernel_passes() -> None:
    assert check_c(GOOD_CPU, "cpu") == []
    assert check(Candidate("cpu", GOOD_CPU)) == []


def test_good_cuda_kernel_passes() -> None:
    """__shared__, __syncthreads, a static __device__ __forceinline__ helper, expf, a template, inline PTX."""
    assert check_c(GOOD_CUDA, "cuda") == []
    assert check(Candidate("cuda", GOOD_CUDA)) == []


def test_good_triton_kernel_passes() -> None:
    assert check_python(GOOD_TRITON) == []
    assert check(Candidate("triton", GOOD_TRITON)) == []


def test_comments_do_not_trigger() -> None:
    body = ("// malloc(1 << 40); getenv(\"HF_TOKEN\"); std::thread t;\n"
            "  /* calloc, cudaMalloc(&p, n), fopen(\"/etc/passwd\"), clock_gettime(),\n"
            "     #include <ATen/ATen.h>, at::sigmoid(x), std::vector<float> v(n) */")
    assert check_c(cpu(body), "cpu") == []
    assert check_c(cuda(body), "cuda") == []


# --- each C/C++/CUDA rule fires with its status ----------------------------------------------------------

C_RULES = [
    # (id, backend, body, head, status)
    ("aten-include", "cpu", "", "#include <ATen/ATen.h>", Status.FORBIDDEN_TORCH),
    ("torch-include", "cuda", "", '#include "torch/extension.h"', Status.FORBIDDEN_TORCH),
    ("c10-include", "cpu", "", "#include <c10/util/Half.h>", Status.FORBIDDEN_TORCH),
    ("at-call", "cuda", "at::sigmoid_out(y, x);", "", Status.FORBIDDEN_TORCH),
    ("torch-call", "cpu", "auto t = torch::empty({4});", "", Status.FORBIDDEN_TORCH),
    ("malloc", "cpu", "void* p = malloc(1 << 20);", "", Status.FORBIDDEN_ALLOC),
    ("calloc", "cpu", "void* p = calloc(4, 4);", "", Status.FORBIDDEN_ALLOC),
    ("realloc", "cpu", "void* p = realloc(nullptr, 4);", "", Status.FORBIDDEN_ALLOC),
    ("posix_memalign", "cpu", "void* p; posix_memalign(&p, 64, 4096);", "", Status.FORBIDDEN_ALLOC),
    ("aligned_alloc", "cpu", "void* p = aligned_alloc(64, 4096);", "", Status.FORBIDDEN_ALLOC),
    ("mmap", "cpu", "void* p = mmap(nullptr, 4096, 3, 34, -1, 0);", "", Status.FORBIDDEN_ALLOC),
    ("new-array", "cpu", "float* p = new float[16];", "", Status.FORBIDDEN_ALLOC),
    ("new-object", "cpu", "auto* p = new Scratch(16);", "", Status.FORBIDDEN_ALLOC),
    ("operator-new", "cpu", "void* p = ::operator new(64);", "", Status.FORBIDDEN_ALLOC),
    ("std-vector", "cpu", "std::vector<float> tmp(16);", "", Status.FORBIDDEN_ALLOC),
    ("make_unique", "cpu", "auto p = std::make_unique<float[]>(16);", "", Status.FORBIDDEN_ALLOC),
    ("malloc-pointer", "cpu", "void* (*f)(size_t) = &malloc;", "", Status.FORBIDDEN_ALLOC),
    ("cudaMalloc", "cuda", "void* p; cudaMalloc(&p, 1ull << 40);", "", Status.FORBIDDEN_ALLOC),
    ("cudaMallocAsync", "cuda", "void* p; cudaMallocAsync(&p, 64, stream);", "", Status.FORBIDDEN_ALLOC),
    ("cudaMallocManaged", "cuda", "void* p; cudaMallocManaged(&p, 64);", "", Status.FORBIDDEN_ALLOC),
    ("cudaHostAlloc", "cuda", "void* p; cudaHostAlloc(&p, 64, 0);", "", Status.FORBIDDEN_ALLOC),
    ("std-thread", "cpu", "std::thread t([] {}); t.join();", "", Status.FORBIDDEN_CONCURRENCY),
    ("std-async", "cpu", "auto f = std::async([] { return 1; });", "", Status.FORBIDDEN_CONCURRENCY),
    ("pthread_create", "cpu", "pthread_t t; pthread_create(&t, 0, run, 0);", "", Status.FORBIDDEN_CONCURRENCY),
    ("fork", "cpu", "if (fork() == 0) return 1;", "", Status.FORBIDDEN_CONCURRENCY),
    ("cudaStreamCreate", "cuda", "cudaStream_t s; cudaStreamCreate(&s);", "", Status.FORBIDDEN_CONCURRENCY),
    ("cudaStreamCreateWithFlags", "cuda", "cudaStream_t s; cudaStreamCreateWithFlags(&s, 1);", "",
     Status.FORBIDDEN_CONCURRENCY),
    ("cudaStreamPerThread", "cuda", "k<<<1, 1, 0, cudaStreamPerThread>>>();", "", Status.FORBIDDEN_CONCURRENCY),
    ("cudaLaunchHostFunc", "cuda", "cudaLaunchHostFunc(stream, cb, 0);", "", Status.FORBIDDEN_CONCURRENCY),
    ("getenv", "cpu", 'const char* k = getenv("OPENAI_API_KEY");', "", Status.FORBIDDEN_IO),
    ("std-getenv", "cuda", 'const char* k = std::getenv("HF_TOKEN");', "", Status.FORBIDDEN_IO),
    ("environ", "cpu", "const char* e = environ[0];", "extern char** environ;", Status.FORBIDDEN_IO),
    ("fopen", "cpu", 'FILE* f = fopen("/etc/passwd", "r");', "", Status.FORBIDDEN_IO),
    ("ifstream", "cpu", 'std::ifstream f("data.bin");', "", Status.FORBIDDEN_IO),
    ("fstream-include", "cpu", "", "#include <fstream>", Status.FORBIDDEN_IO),
    ("unistd-include", "cpu", "", "#include <unistd.h>", Status.FORBIDDEN_IO),
    ("system", "cpu", 'system("curl example.com");', "", Status.FORBIDDEN_IO),
    ("popen", "cpu", 'popen("ls", "r");', "", Status.FORBIDDEN_IO),
    ("socket", "cpu", "int s = socket(2, 1, 0);", "", Status.FORBIDDEN_IO),
    ("dlopen", "cpu", 'void* h = dlopen("libc.so.6", 1);', "", Status.FORBIDDEN_IO),
    ("proc-path", "cpu", 'const char* p = "/proc/self/maps";', "", Status.FORBIDDEN_IO),
    ("clock_gettime", "cpu", "timespec t; clock_gettime(1, &t);", "", Status.FORBIDDEN_TIMER),
    ("gettimeofday", "cpu", "timeval t; gettimeofday(&t, 0);", "", Status.FORBIDDEN_TIMER),
    ("rdtsc", "cpu", "unsigned long long t = __rdtsc();", "", Status.FORBIDDEN_TIMER),
    ("clock", "cpu", "long t = clock();", "", Status.FORBIDDEN_TIMER),
    ("usleep", "cpu", "usleep(10);", "", Status.FORBIDDEN_TIMER),
    ("chrono", "cpu", "auto t = std::chrono::steady_clock::now();", "", Status.FORBIDDEN_TIMER),
    ("chrono-include", "cpu", "", "#include <chrono>", Status.FORBIDDEN_TIMER),
    ("time-include", "cpu", "", "#include <time.h>", Status.FORBIDDEN_TIMER),
    ("cudaEventRecord", "cuda", "cudaEventRecord(ev, stream);", "", Status.FORBIDDEN_TIMER),
    ("cudaEventElapsedTime", "cuda", "float ms; cudaEventElapsedTime(&ms, a, b);", "", Status.FORBIDDEN_TIMER),
    ("constructor", "cpu", "", "__attribute__((constructor)) static void at_load() {}", Status.FORBIDDEN_CODE),
    ("destructor", "cuda", "", "__attribute__((destructor)) static void at_exit_() {}", Status.FORBIDDEN_CODE),
    ("cpu-asm", "cpu", 'asm volatile("" ::: "memory");', "", Status.FORBIDDEN_CODE),
    ("cpu-__asm__", "cpu", '__asm__("nop");', "", Status.FORBIDDEN_CODE),
]


@pytest.mark.parametrize(("backend", "body", "head", "status"), [pytest.param(*r[1:], id=r[0]) for r in C_RULES])
def test_c_rule(backend: str, body: str, head: str, status: Status) -> None:
    source = (cpu if backend == "cpu" else cuda)(body, head)
    findings = check_c(source, backend)
    assert statuses(findings) == [status], findings
    assert check(Candidate(backend, source)) == findings


def test_finding_names_the_text_and_line() -> None:
    source = cpu("void* p = malloc(64);")
    ((status, message),) = check_c(source, "cpu")
    line = source.splitlines().index("  void* p = malloc(64);") + 1
    assert status is Status.FORBIDDEN_ALLOC
    assert "`malloc`" in message and f"(line {line})" in message


def test_every_broken_rule_is_reported() -> None:
    body = 'void* p = malloc(64); const char* k = getenv("X"); std::thread t([] {});'
    assert statuses(check_c(cpu(body), "cpu")) == [Status.FORBIDDEN_ALLOC, Status.FORBIDDEN_CONCURRENCY,
                                                    Status.FORBIDDEN_IO]


def test_inline_ptx_is_allowed_in_cuda_only() -> None:
    body = 'unsigned lane; asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));'
    assert check_c(cuda(body), "cuda") == []
    assert statuses(check_c(cpu(body), "cpu")) == [Status.FORBIDDEN_CODE]


def test_placement_new_is_not_an_allocation() -> None:
    assert check_c(cpu("float* p = new (out[0].data) float(1.0f);"), "cpu") == []


def test_no_launcher_is_bad_format() -> None:
    source = '#include "forge_abi.h"\nextern "C" int launch(const ForgeTensor* in, int n_in) { return 0; }\n'
    assert statuses(check_c(source, "cpu")) == [Status.BAD_FORMAT]
    assert statuses(check_c(source.replace("launch(", "forge_launch_v2("), "cpu")) == [Status.BAD_FORMAT]
    # A launcher named only in a comment does not count either.
    assert statuses(check_c(source + "// forge_launch(in, n_in, out, n_out)\n", "cpu")) == [Status.BAD_FORMAT]


def test_custom_entry() -> None:
    source = cpu("").replace("forge_launch", "my_launch")
    assert check(Candidate("cpu", source, entry="my_launch")) == []
    assert statuses(check(Candidate("cpu", source))) == [Status.BAD_FORMAT]


# --- Triton (Python) rules ------------------------------------------------------------------------------

PY_TEMPLATE = """\
import triton
import triton.language as tl
{head}

@triton.jit
def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * tl.sigmoid(x), mask=offs < n)


def launch(inputs, outputs):
    x, y = inputs[0], outputs[0]
    {body}
    silu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
"""


def py(body: str = "pass", head: str = "") -> str:
    return PY_TEMPLATE.format(body=body, head=head)


PY_RULES = [
    ("import-os", "", "import os", Status.FORBIDDEN_IO),
    ("from-os", "", "from os import environ", Status.FORBIDDEN_IO),
    ("import-subprocess", "", "import subprocess", Status.FORBIDDEN_IO),
    ("import-socket", "", "import socket", Status.FORBIDDEN_IO),
    ("import-threading", "", "import threading", Status.FORBIDDEN_CONCURRENCY),
    ("import-multiprocessing", "", "import multiprocessing", Status.FORBIDDEN_CONCURRENCY),
    ("from-concurrent", "", "from concurrent.futures import ThreadPoolExecutor", Status.FORBIDDEN_CONCURRENCY),
    ("import-time", "", "import time", Status.FORBIDDEN_TIMER),
    ("import-torch", "", "import torch", Status.FORBIDDEN_TORCH),
    ("import-functools", "", "import functools", Status.FORBIDDEN_IO),
    ("top-level-call", "", "K = triton.cdiv(7, 2)", Status.FORBIDDEN_CODE),
    ("top-level-if", "", "if True:\n    K = 1", Status.FORBIDDEN_CODE),
    ("module-attribute", "", "import math\nmath.pi = 3", Status.FORBIDDEN_CODE),
    ("attribute-in-launch", "math.e = 0", "import math", Status.FORBIDDEN_CODE),
    ("setattr-free-attribute-del", "del x.foo", "", Status.FORBIDDEN_CODE),
    ("global", "global K", "K = 1", Status.FORBIDDEN_CODE),
    ("for-target-patch", "for triton.backends.sys.modules['torch'].equal in [abs]: pass", "",
     Status.FORBIDDEN_CODE),
    ("alias-then-item", "m = triton.backends.os.environ\n    m['X'] = '1'", "", Status.FORBIDDEN_CODE),
    ("with-as-attribute", "with x as tl.x: pass", "", Status.FORBIDDEN_CODE),
    ("eval", "k = eval('1 + 1')", "", Status.FORBIDDEN_CODE),
    ("exec", "exec('k = 1')", "", Status.FORBIDDEN_CODE),
    ("compile", "c = compile('1', 'f', 'eval')", "", Status.FORBIDDEN_CODE),
    ("__import__", "m = __import__('os')", "", Status.FORBIDDEN_CODE),
    ("getattr", "f = getattr(torch, 'sigmoid')", "", Status.FORBIDDEN_CODE),
    ("dunder-attribute", "c = x.__class__", "", Status.FORBIDDEN_CODE),
    ("unknown-call", "helper_from_nowhere(x)", "", Status.FORBIDDEN_CODE),
    ("torch-sigmoid", "y.copy_(x * torch.sigmoid(x))", "", Status.FORBIDDEN_TORCH),
    ("torch-functional", "z = torch.nn.functional.silu(x)", "", Status.FORBIDDEN_TORCH),
    ("tensor-method", "z = x.sigmoid()", "", Status.FORBIDDEN_TORCH),
    ("torch-alloc", "tmp = torch.empty_like(x)", "", Status.FORBIDDEN_TORCH),
    ("cuda-Stream", "s = torch.cuda.Stream()", "", Status.FORBIDDEN_CONCURRENCY),
    ("cuda-stream-context", "torch.cuda.set_stream(torch.cuda.Stream())", "", Status.FORBIDDEN_CONCURRENCY),
]


@pytest.mark.parametrize(("body", "head", "status"), [pytest.param(*r[1:], id=r[0]) for r in PY_RULES])
def test_python_rule(body: str, head: str, status: Status) -> None:
    findings = check_python(py(body, head))
    assert findings, "nothing found"
    assert findings[0][0] is status, findings
    assert check(Candidate("triton", py(body, head))) == findings


@pytest.mark.parametrize("old, new", [
    ("@triton.jit\n", "@triton.jit(do_not_specialize=[triton.runtime.cache.os.system('true')])\n"),
    ("BLOCK: tl.constexpr)", "BLOCK: tl.constexpr, Z=triton.runtime.cache.os.system('true'))"),
])
def test_python_code_in_decorator_arguments_and_defaults_is_checked(old: str, new: str) -> None:
    """Decorator arguments and defaults of a @triton.jit function run in Python: they are checked as such."""
    source = py().replace(old, new, 1)
    assert source != py()
    assert check_python(source), "nothing found"


def test_python_autotune_and_heuristics_with_inline_configs_pass() -> None:
    source = py().replace("@triton.jit\n", "@triton.autotune(configs=[triton.Config({'B': 1}, num_warps=4)], "
                          "key=['n'])\n@triton.heuristics({'EVEN': lambda a: a['n'] % 2 == 0})\n@triton.jit\n", 1)
    assert check_python(source) == []


def test_python_torch_inside_jit_and_tensor_queries_are_allowed() -> None:
    body = "assert x.is_contiguous() and x.dim() == 2 and x.stride(1) == 1 and x.size(0) > 0"
    assert check_python(py(body)) == []


def test_python_bad_format() -> None:
    assert statuses(check_python("def launch(inputs, outputs):\n    return (\n")) == [Status.BAD_FORMAT]
    no_launch = py().replace("def launch(", "def run(")
    assert statuses(check_python(no_launch)) == [Status.BAD_FORMAT]
    assert "launch" in check_python(no_launch)[0][1]
    no_jit = "import math\n\n\ndef launch(inputs, outputs):\n    pass\n"
    assert statuses(check_python(no_jit)) == [Status.BAD_FORMAT]
    assert "triton.jit" in check_python(no_jit)[0][1]


# --- evasions found in review: each must be caught -------------------------------------------------------

_STRINGS = ("forge/evaluate/checks.py _strip_c_comments strips `//...` and `/*...*/` with two regexes that do not "
            "know string literals: a `//` inside a string drops the rest of that line from the checks")
_BOUNDARY = ("forge/evaluate/checks.py _C_RULES use `\\b` before names, and `_` is a word character: a `__`-prefixed "
             "alias (glibc's __environ, gcc's __builtin_malloc) is not matched")

C_GAPS = [
    ("string-with-slashes-hides-malloc", cpu('const char* url = "http://x"; void* p = malloc(1ull << 40);'),
     Status.FORBIDDEN_ALLOC, _STRINGS),
    ("string-with-slashes-hides-getenv", cpu('const char* s = "//"; const char* k = getenv("HF_TOKEN");'),
     Status.FORBIDDEN_IO, _STRINGS),
    ("__environ", cpu("const char* e = __environ[0];", "extern char** __environ;"), Status.FORBIDDEN_IO,
     _BOUNDARY),
    ("__builtin_malloc", cpu("void* p = __builtin_malloc(1ull << 40);"), Status.FORBIDDEN_ALLOC, _BOUNDARY),
    ("new-scalar", cpu("float* p = new float;"), Status.FORBIDDEN_ALLOC,
     "forge/evaluate/checks.py: the `new` pattern needs `[` or `(` after the type, so `new float;` is not matched"),
]


@pytest.mark.parametrize(("source", "status"), [
    pytest.param(src, st, id=name) for name, src, st, _ in C_GAPS])
def test_c_known_gap(source: str, status: Status) -> None:
    assert status in statuses(check_c(source, "cpu"))


def test_line_numbers_after_a_block_comment() -> None:
    source = "/* a licence\n   over\n   four\n   lines */\n" + cpu("void* p = malloc(64);")
    line = source.splitlines().index("  void* p = malloc(64);") + 1
    ((_, message),) = check_c(source, "cpu")
    assert f"(line {line})" in message


def test_python_torch_compute_through_operators() -> None:
    source = py("y[...] = x / (1 + math.e ** (-x))", "import math").replace(
        "    silu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)\n", "")
    assert Status.FORBIDDEN_TORCH in statuses(check_python(source))


def test_python_open_is_io() -> None:
    assert check_python(py("f = open('/etc/passwd')"))[0][0] is Status.FORBIDDEN_IO
