"""Recipes for NVIDIA GPUs: the pointwise and row-reduction lowerings emitted as CUDA C++.

The graph is lowered exactly as for the CPU (forge.recipes.pointwise / rowreduce: symbolic indices,
the same C expressions); only the loop structure differs.

- Pointwise: each thread takes `vec` consecutive elements of the unit-stride inner block; inputs read
  at unit stride are loaded as one vector (16 bytes for bf16 x 8), the rest element by element; the
  outputs are stored as vectors. A grid-stride loop covers the tensor (`blocks` caps the grid). A
  launch with a pointer that is not aligned to the vector falls back to the same kernel with vec = 1.
- Rows: a thread block (or a cluster of `cluster` blocks, Hopper's distributed shared memory) per row.
  Each thread keeps its elements of the reduced input in registers, so the row is read from memory
  once; statistics are reduced with warp shuffles, shared memory and, across a cluster, DSMEM. The
  variance is the exact two-pass one over the registers. Rows longer than the registers can hold are
  re-read in pass 2 (`cache=False`), which a cluster keeps in L2.

Builds include only forge_abi.h and this file's prelude: no cuda_bf16.h (it costs ~0.4 s a build).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch
import torch.fx

from forge.kernel import Candidate, TaskSpec
from forge.recipes import pointwise, rowreduce
from forge.recipes.index import Expr, Simplifier, cexpr, unit_stride_in, var
from forge.recipes.pointwise import _FLOAT_TYPES, _VIEWS, NotMine, _Emitter, _lit, from_float, to_float, trace_task

PRELUDE = r"""#include "forge_abi.h"
typedef unsigned short forge_half;
__device__ __forceinline__ float bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
  unsigned short r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
__device__ __forceinline__ float round_bf16(float f) { return bf2f(f2bf(f)); }
__device__ __forceinline__ float h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) {
  unsigned short r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
__device__ __forceinline__ float round_f16(float f) { return h2f(f2h(f)); }
#ifdef FORGE_FAST_MATH  // hardware approximations: about 2^-11 relative error for tanh, fine for 16-bit outputs
__device__ __forceinline__ float forge_expf(float x) { return __expf(x); }
__device__ __forceinline__ float forge_tanhf(float x) {
  float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float forge_sigmoidf(float x) { return fmaf(0.5f, forge_tanhf(0.5f * x), 0.5f); }
#else
__device__ __forceinline__ float forge_expf(float x) { return expf(x); }
__device__ __forceinline__ float forge_tanhf(float x) { return tanhf(x); }
__device__ __forceinline__ float forge_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
#endif
__device__ __forceinline__ float forge_max(float a, float b) { return a > b ? a : b; }
__device__ __forceinline__ float forge_min(float a, float b) { return a < b ? a : b; }
template <typename T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v; }
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v; }
__device__ __forceinline__ float warp_min(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v; }
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ float cluster_load(const float* p, unsigned rank) {  // DSMEM read
  unsigned a = (unsigned)__cvta_generic_to_shared(p), remote; float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v; }
"""


@dataclass(frozen=True)
class CudaKnobs:
    """Pointwise schedule."""

    threads: int = 256
    vec: int = 8  # elements per thread (vector width); capped by what divides the inner block
    blocks: int = 0  # grid cap (0: one vector per thread)
    fast_math: bool = False


@dataclass(frozen=True)
class CudaRowKnobs:
    """Row schedule."""

    threads: int = 256
    cluster: int = 1  # blocks per row (a Hopper thread-block cluster)
    vec: int = 8
    cache: bool = True  # keep the reduced input in registers (else re-read it in pass 2)
    fast_math: bool = False
    warp_rows: bool = False  # one warp per row (shuffles only, threads / 32 rows per block)
    smem: bool = False  # keep the block's part of the row in shared memory (as the input's dtype)


def _guard(spec: TaskSpec) -> str:
    checks = [f"in[{i}].ndim != {len(m.shape)}" for i, m in enumerate(spec.inputs)]
    checks += [f"in[{i}].shape[{d}] != {s}" for i, m in enumerate(spec.inputs) for d, s in enumerate(m.shape)]
    checks += [f"in[{i}].stride[{d}] != {s}" for i, m in enumerate(spec.inputs) for d, s in enumerate(m.stride)
               if m.shape[d] > 1]
    return " || ".join(checks) or "0"


def _params(spec: TaskSpec) -> str:
    ins = [f"const {_FLOAT_TYPES[m.torch_dtype]}* __restrict__ in{i}_p" for i, m in enumerate(spec.inputs)]
    outs = [f"{_FLOAT_TYPES[m.torch_dtype]}* __restrict__ out{j}_p" for j, m in enumerate(spec.outputs)]
    return ", ".join(ins + outs)


def _args(spec: TaskSpec) -> str:
    ins = [f"(const {_FLOAT_TYPES[m.torch_dtype]}*)in[{i}].data" for i, m in enumerate(spec.inputs)]
    outs = [f"({_FLOAT_TYPES[m.torch_dtype]}*)out[{j}].data" for j, m in enumerate(spec.outputs)]
    return ", ".join(ins + outs)


class _Vectors:
    """Load hook: inputs read at unit stride in `k` become one vector load per thread (`vec` elements)."""

    def __init__(self, spec: TaskSpec, k: sympy.Symbol, k0: sympy.Symbol, vec: int, simplify: Simplifier) -> None:
        self.spec, self.k, self.k0, self.vec, self.simplify = spec, k, k0, vec, simplify
        self.lines: list[str] = []
        self.names: dict[tuple[int, Expr], str] = {}
        self.aligned: set[int] = set()

    def __call__(self, i: int, off: Expr) -> str | None:
        if self.vec == 1 or not off.has(self.k) or not unit_stride_in(off, self.k):
            return None
        rest = off.subs(self.k, 0)
        if any(int(t.as_coeff_Mul()[0]) % self.vec for t in sympy.Add.make_args(rest) if t != 0):
            return None
        if (i, off) not in self.names:
            name = f"ld{len(self.names)}"
            ctype = _FLOAT_TYPES[self.spec.inputs[i].torch_dtype]
            at = cexpr(self.simplify(off.subs(self.k, self.k0)))
            self.lines.append(f"const Pack<{ctype}, V> {name} = *reinterpret_cast<const Pack<{ctype}, V>*>"
                              f"(in{i}_p + {at});")
            self.names[(i, off)] = name
            self.aligned.add(i)
        return f"{self.names[(i, off)]}.v[v]"


def _vec_for(n: int, want: int) -> int:
    v = want
    while v > 1 and n % v:
        v //= 2
    return v


def _alignment_check(spec: TaskSpec, inputs: set[int], vec: int) -> str:
    """True (non-zero) when a pointer read or written as vectors is not aligned to them."""
    parts = [f"((uintptr_t)in[{i}].data % {vec * spec.inputs[i].torch_dtype.itemsize})" for i in sorted(inputs)]
    parts += [f"((uintptr_t)out[{j}].data % {vec * m.torch_dtype.itemsize})" for j, m in enumerate(spec.outputs)]
    return " || ".join(parts) or "0"


def _header(fast_math: bool) -> str:
    return ("#define FORGE_FAST_MATH\n" if fast_math else "") + PRELUDE


# -- pointwise ---------------------------------------------------------------------------------------------

def pointwise_source(spec: TaskSpec, knobs: CudaKnobs) -> str:
    """The CUDA source of a pointwise task with these knobs; NotMine if it is not pointwise."""
    low = pointwise.lower(spec)
    gm = trace_task(spec)
    inner = low.inner
    vec = _vec_for(inner, knobs.vec)
    o, k, k0 = var("o"), var("k"), var("k0")
    simplify = Simplifier({o: low.outer, k: inner, k0: inner})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    em = _Emitter({p: i for i, p in enumerate(placeholders)}, spec.inputs, simplify)
    vectors = _Vectors(spec, k, k0, vec, simplify)
    em.load_hook = vectors
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    stores, packs, writes = [], [], []
    for j, (node, m) in enumerate(zip(out_node.args[0], spec.outputs, strict=True)):
        v = em.value(node, o * inner + k)
        ctype = _FLOAT_TYPES[m.torch_dtype]
        packs.append(f"Pack<{ctype}, V> st{j};")
        stores.append(f"st{j}.v[v] = {from_float(v, m.torch_dtype)};")
        writes.append(f"*reinterpret_cast<Pack<{ctype}, V>*>(out{j}_p + (idx_t)o * {inner} + k0) = st{j};")
    body = "\n".join(f"      {line}" for line in em.lines + stores)
    per_row = inner // vec if vec > 1 else inner
    total = low.outer * inner
    idx = "int" if total * 2 < 2**31 else "long long"
    grid_cap = knobs.blocks or 2**31 - 1
    return (f"{_header(knobs.fast_math)}\n// forge recipe: pointwise on CUDA, {low.outer} x {inner}, {knobs}\n"
            f"typedef {idx} idx_t;\n"
            f"template <int V>\n__global__ void __launch_bounds__({knobs.threads})\n"
            f"forge_pointwise({_params(spec)}) {{\n"
            f"  const idx_t per_row = {inner} / V, total = {low.outer} * per_row;\n"
            f"  for (idx_t t = (idx_t)blockIdx.x * {knobs.threads} + threadIdx.x; t < total;"
            f" t += (idx_t)gridDim.x * {knobs.threads}) {{\n"
            f"    const idx_t o = t / per_row, k0 = (t - o * per_row) * V;\n"
            + "".join(f"    {line}\n" for line in vectors.lines + packs)
            + f"    #pragma unroll\n    for (int v = 0; v < V; ++v) {{\n      const idx_t k = k0 + v;\n{body}\n    }}\n"
            + "".join(f"    {line}\n" for line in writes)
            + "  }\n}\n\n"
            f"extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, "
            f"cudaStream_t stream) {{\n"
            f"  if (n_in != {len(spec.inputs)} || n_out != {len(spec.outputs)}) return 1;\n"
            f"  if ({_guard(spec)}) return 2;\n"
            f"  const bool aligned = !({_alignment_check(spec, vectors.aligned, vec)});\n"
            f"  const long long work = aligned ? {low.outer * per_row} : {total};\n"
            f"  long long blocks = (work + {knobs.threads - 1}) / {knobs.threads};\n"
            f"  if (blocks > {grid_cap}) blocks = {grid_cap};\n"
            f"  if (aligned) forge_pointwise<{vec}><<<(unsigned)blocks, {knobs.threads}, 0, stream>>>({_args(spec)});\n"
            f"  else forge_pointwise<1><<<(unsigned)blocks, {knobs.threads}, 0, stream>>>({_args(spec)});\n"
            f"  return cudaGetLastError() == cudaSuccess ? 0 : 3;\n}}\n")


# -- rows --------------------------------------------------------------------------------------------------

def row_source(spec: TaskSpec, knobs: CudaRowKnobs) -> str:
    """The CUDA source of a row-reduction task with these knobs; NotMine if it is not one."""
    low = rowreduce.lower(spec)  # validates the task and gives rows and length
    rows, length = low.rows, low.length
    gm = trace_task(spec)
    red = next(n for n in gm.graph.nodes if n.op == "call_function" and rowreduce.op_name(n.target) == low.op)
    cl = knobs.cluster
    if length % cl:
        raise NotMine(f"row of {length} does not split into {cl} blocks")
    if knobs.warp_rows and (cl > 1 or knobs.smem):
        raise NotMine("a warp per row neither splits the row over a cluster nor keeps it in shared memory")
    chunk = length // cl
    vec = _vec_for(chunk, knobs.vec)
    tpr = 32 if knobs.warp_rows else knobs.threads  # threads per row
    slots = math.ceil(chunk / (tpr * vec))
    cache = knobs.cache and slots * vec <= 128 and not knobs.smem
    smem_type = _exact_input_dtype(red.args[0]) if knobs.smem else None
    if knobs.smem and (smem_type is None or chunk * smem_type.itemsize > 200 * 1024):
        raise NotMine("no shared-memory cache: the reduced value is not an input's exact copy, or too big")
    r, jj, j0 = var("r"), var("jj"), var("j0")
    simplify = Simplifier({r: rows, jj: length, j0: length})
    i = r * length + jj
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = {p: n for n, p in enumerate(placeholders)}
    x = red.args[0]
    pro = _Emitter(inputs, spec.inputs, simplify, prefix="p")
    vec_pro = _Vectors(spec, jj, j0, vec, simplify)
    pro.load_hook = vec_pro
    x_expr = pro.value(x, i)
    i_simple = simplify(i)

    def cached_x(idx: Expr) -> str:
        if (cache or knobs.smem) and simplify(idx) == i_simple:
            return "xc"
        return epi_plain.value(x, idx)

    epi_plain = _Emitter(inputs, spec.inputs, simplify, prefix="f")
    epi = _Emitter(inputs, spec.inputs, simplify, prefix="e",
                   special={red: lambda idx: rowreduce._reduced_value(red, low.op, idx, epi, length), x: cached_x})
    vec_epi = _Vectors(spec, jj, j0, vec, simplify)
    epi.load_hook = vec_epi
    epi_plain.load_hook = vec_epi
    per_row = _Emitter(inputs, spec.inputs, simplify, prefix="q",
                       special={red: lambda idx: rowreduce._reduced_value(red, low.op, idx, per_row, length)})
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    y_stores, packs, writes, row_stores = [], [], [], []
    for j, (o, m) in enumerate(zip(out_node.args[0], spec.outputs, strict=True)):
        ctype = _FLOAT_TYPES[m.torch_dtype]
        if m.numel == rows * length:
            v = epi.value(o, i)
            packs.append(f"Pack<{ctype}, V> st{j};")
            y_stores.append(f"st{j}.v[v] = {from_float(v, m.torch_dtype)};")
            writes.append(f"*reinterpret_cast<Pack<{ctype}, V>*>(out{j}_p + (idx_t)r * {length} + j0) = st{j};")
        elif m.numel == rows:
            row_stores.append(f"out{j}_p[r] = {from_float(per_row.value(o, r), m.torch_dtype)};")
        else:
            raise NotMine("an output that is neither per element nor per row")
    aligned = vec_pro.aligned | vec_epi.aligned
    piv = _Emitter(inputs, spec.inputs, simplify, prefix="z")  # x at the row's first element (scalar loads)
    piv_value = piv.value(x, r * length)
    piv_lines = (*piv.lines, f"const float piv = {piv_value};")
    src = _row_kernel(low, knobs, cache, slots, chunk, pro.lines, x_expr, vec_pro.lines, epi_plain.lines
                      + epi.lines + y_stores, vec_epi.lines, packs, writes, per_row.lines + row_stores, smem_type,
                      piv_lines)
    smem_bytes = chunk * smem_type.itemsize if smem_type else 0
    attr = (f"  cudaFuncSetAttribute(forge_rows<{vec}>, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem_bytes});\n"
            f"  cudaFuncSetAttribute(forge_rows<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem_bytes});\n"
            if smem_bytes > 48 * 1024 else "")
    idx = "int" if rows * length * 2 < 2**31 else "long long"
    grid = -(-rows // (knobs.threads // 32)) if knobs.warp_rows else rows * cl
    attrs = f"__cluster_dims__({cl}, 1, 1) " if cl > 1 else ""
    if cl > 8:  # beyond the portable cluster size: Hopper allows 16 when asked
        attr_cl = "".join(f"  cudaFuncSetAttribute(forge_rows<{w}>, "
                          "cudaFuncAttributeNonPortableClusterSizeAllowed, 1);\n" for w in (vec, 1))
    else:
        attr_cl = ""
    return (f"{_header(knobs.fast_math)}\n// forge recipe: row reduction ({low.op}) on CUDA, {rows} rows of {length},"
            f" {knobs}\ntypedef {idx} idx_t;\n"
            f"template <int V>\n__global__ void {attrs}__launch_bounds__({knobs.threads}) forge_rows({_params(spec)}) "
            f"{{\n{src}}}\n\n"
            f"extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, "
            f"cudaStream_t stream) {{\n"
            f"  if (n_in != {len(spec.inputs)} || n_out != {len(spec.outputs)}) return 1;\n"
            f"  if ({_guard(spec)}) return 2;\n"
            f"  const bool aligned = !({_alignment_check(spec, aligned, vec)});\n"
            f"{attr}{attr_cl}"
            f"  if (aligned) forge_rows<{vec}><<<{grid}, {knobs.threads}, {smem_bytes}, stream>>>({_args(spec)});\n"
            f"  else forge_rows<1><<<{grid}, {knobs.threads}, {smem_bytes}, stream>>>({_args(spec)});\n"
            f"  return cudaGetLastError() == cudaSuccess ? 0 : 3;\n}}\n")


def _exact_input_dtype(node: object) -> torch.dtype | None:
    """The dtype of the input the value is an exact copy of (through views and widening casts), or None."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        name = rowreduce.op_name(node.target)
        if name == "_to_copy" and node.kwargs.get("dtype") in (torch.float32, torch.float64):
            node = node.args[0]
        elif name in _VIEWS and rowreduce._shape(node) == rowreduce._shape(node.args[0]):
            node = node.args[0]
        else:
            return None
    if isinstance(node, torch.fx.Node) and node.op == "placeholder":
        return node.meta["val"].dtype
    return None


def _row_kernel(low: rowreduce.RowLowered, knobs: CudaRowKnobs, cache: bool, slots: int, chunk: int,
                pro: list[str], x_expr: str, pro_vec: list[str], epi: list[str], epi_vec: list[str],
                packs: list[str], writes: list[str], row_lines: list[str], smem: torch.dtype | None = None,
                piv_lines: tuple[str, ...] = ()) -> str:
    """The body of the row kernel (template parameter V: the vector width of this launch)."""
    op, length, cl = low.op, low.length, knobs.cluster
    warp_rows = knobs.warp_rows
    threads = 32 if warp_rows else knobs.threads  # threads per row
    warps = threads // 32

    def loop(inner: list[str], vec_lines: list[str], pre: str = "", post: str = "") -> str:
        body = "\n".join(f"        {line}" for line in inner)
        unroll = "#pragma unroll" if cache else "#pragma unroll 8"  # registers need constant indices
        return (f"  {unroll}\n  for (int s = 0; s < S; ++s) {{\n"
                f"    const idx_t jc = ((idx_t)s * {threads} + tid) * V;\n"
                f"    if (jc < {chunk}) {{\n      const idx_t j0 = part * {chunk} + jc;\n"
                + "".join(f"      {line}\n" for line in vec_lines) + (f"      {pre}\n" if pre else "")
                + f"      #pragma unroll\n      for (int v = 0; v < V; ++v) {{\n        const idx_t jj = j0 + v;"
                f" (void)jj;\n{body}\n      }}\n" + (f"      {post}\n" if post else "") + "    }\n  }\n")

    def reduce(kind: str, value: str, out: str) -> str:
        """Block (and cluster) reduction of `value` into `out` (sum | max | min)."""
        fn = {"sum": "warp_sum", "max": "warp_max", "min": "warp_min"}[kind]
        init = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}[kind]
        if warp_rows:
            return f"  {out} = {fn}({value});\n"
        code = (f"  {{ float w = {fn}({value});\n    if ((threadIdx.x & 31) == 0) red_smem[threadIdx.x >> 5] = w;\n"
                f"    __syncthreads();\n    float a = threadIdx.x < {warps} ? red_smem[threadIdx.x] : {init};\n"
                f"    if (threadIdx.x < 32) {{ a = {fn}(a); if (threadIdx.x == 0) red_smem[32] = a; }}\n"
                f"    __syncthreads();\n    {out} = red_smem[32];\n    __syncthreads();\n")
        if cl > 1:  # lane q of warp 0 reads block q's value over DSMEM (one round trip), the warp combines
            code += (f"    if (threadIdx.x == 0) cl_smem = {out};\n    cluster_sync();\n"
                     f"    if (threadIdx.x < 32) {{\n"
                     f"      float b = threadIdx.x < {cl} ? cluster_load(&cl_smem, threadIdx.x) : {init};\n"
                     f"      b = {fn}(b); if (threadIdx.x == 0) red_smem[32] = b; }}\n"
                     f"    __syncthreads();\n    {out} = red_smem[32];\n    cluster_sync();\n")
        return code + "  }\n"

    head = f"  constexpr int S = ({chunk} + {threads} * V - 1) / ({threads} * V);\n"
    if warp_rows:
        head += (f"  const idx_t r = (idx_t)blockIdx.x * {knobs.threads // 32} + (threadIdx.x >> 5);\n"
                 f"  if (r >= {low.rows}) return;  // no block-wide barriers below: a warp may leave\n"
                 "  const unsigned part = 0, tid = threadIdx.x & 31;\n")
    else:
        head += ("  __shared__ float red_smem[33];\n" + ("  __shared__ float cl_smem;\n" if cl > 1 else "")
                 + f"  const idx_t r = blockIdx.x / {cl}; const unsigned part = "
                 + ("cluster_rank();\n" if cl > 1 else "0;\n") + "  const unsigned tid = threadIdx.x;\n")
    x_lines = [*pro, f"const float x = {x_expr};"] + (["xr[s * V + v] = x;"] if cache else [])
    if cache:
        head += "  float xr[S * V];  // this thread's elements of the row, in registers\n"
    if smem is not None:  # the block's part of the row, stored exactly as the input's dtype
        head += (f"  extern __shared__ __align__(16) unsigned char xs_raw[];\n"
                 f"  {_FLOAT_TYPES[smem]}* xs = reinterpret_cast<{_FLOAT_TYPES[smem]}*>(xs_raw);\n")
        x_lines.append(f"xsp.v[v] = {from_float('x', smem)};")
    st = _FLOAT_TYPES[smem] if smem is not None else ""
    pack_in = f"Pack<{st}, V> xsp;" if smem is not None else ""  # one vector store per thread and slot
    pack_out = f"*reinterpret_cast<Pack<{st}, V>*>(xs + jc) = xsp;" if smem is not None else ""
    reread_vec = [f"const Pack<{st}, V> xsr = *reinterpret_cast<const Pack<{st}, V>*>(xs + jc);"] \
        if smem is not None else []
    reread = (["const float x = xr[s * V + v];"] if cache else
              [f"const float x = {to_float('xsr.v[v]', smem)};"] if smem is not None else None)
    stats = ""
    if op in ("_softmax", "_log_softmax", "logsumexp"):
        stats += "  float tm = -INFINITY;\n" + loop([*x_lines, "tm = fmaxf(tm, x);"], pro_vec, pack_in, pack_out)
        stats += "  float mx;\n" + reduce("max", "tm", "mx")
        again = reread or [*pro, f"const float x = {x_expr};"]
        stats += "  float ts = 0.0f;\n" + loop([*again, "if (x != -INFINITY) ts += forge_expf(x - mx);"],
                                               reread_vec if reread else pro_vec)
        stats += "  float sm;\n" + reduce("sum", "ts", "sm") + "  const float inv_sm = 1.0f / sm; (void)inv_sm;\n"
    elif op in ("amax", "amin"):
        v, fn = ("mx", "fmaxf") if op == "amax" else ("mn", "fminf")
        init = "-INFINITY" if op == "amax" else "INFINITY"
        stats += f"  float t = {init};\n" + loop([*x_lines, f"t = {fn}(t, x);"], pro_vec, pack_in, pack_out)
        stats += f"  float {v};\n" + reduce("max" if op == "amax" else "min", "t", v)
    elif reread is None and op in ("native_layer_norm", "native_group_norm", "var"):
        # nothing kept on chip: one pass of sums shifted by the row's first value (a large mean cannot
        # cancel the variance), so the row is read twice in all, not three times
        stats += "".join(f"  {line}\n" for line in piv_lines)
        stats += "  float t1 = 0.0f, t2 = 0.0f;\n" + loop([*x_lines, "const float d = x - piv; t1 += d; t2 += d * d;"],
                                                       pro_vec)
        stats += "  float s1, s2;\n" + reduce("sum", "t1", "s1") + reduce("sum", "t2", "s2")
        stats += (f"  const float m1 = s1 / {length}; const float mean = piv + m1;\n"
                  f"  const float var_ = fmaxf(s2 / {length} - m1 * m1, 0.0f);"
                  f" const float rstd = rsqrtf(var_ + {_lit(low.eps)}); (void)rstd;\n")
    else:  # sums; the variance in a second pass over the registers (or shared memory)
        stats += "  float t1 = 0.0f;\n" + loop([*x_lines, "t1 += x;"], pro_vec, pack_in, pack_out)
        stats += "  float sm;\n" + reduce("sum", "t1", "sm") + f"  const float mean = sm / {length}; (void)mean;\n"
        if op in ("native_layer_norm", "native_group_norm", "var"):
            again = reread or [*pro, f"const float x = {x_expr};"]
            stats += "  float t2 = 0.0f;\n" + loop([*again, "const float d = x - mean; t2 += d * d;"],
                                                   reread_vec if reread else pro_vec)
            stats += ("  float ss;\n" + reduce("sum", "t2", "ss")
                      + f"  const float var_ = ss / {length}; const float rstd = rsqrtf(var_ + {_lit(low.eps)});"
                      " (void)rstd;\n")
    xc = [reread[0].replace("float x =", "float xc =")] if reread else []
    pass2 = loop([*xc, *epi], (reread_vec if smem is not None else []) + epi_vec, " ".join(packs),
                 " ".join(writes)) if epi else ""
    rows = ""
    if row_lines:
        rows = "  if (part == 0 && tid == 0) {\n" + "".join(f"    {ln}\n" for ln in row_lines) + "  }\n"
    return head + stats + pass2 + rows


def candidate(spec: TaskSpec, knobs: CudaKnobs | CudaRowKnobs) -> Candidate:
    """A cuda Candidate for these knobs (fast math: also nvcc's approximate division and square root)."""
    src = pointwise_source(spec, knobs) if isinstance(knobs, CudaKnobs) else row_source(spec, knobs)
    return Candidate("cuda", src, flags=("--use_fast_math",) if knobs.fast_math else ())


def supported(spec: TaskSpec) -> str:
    """"pointwise" or "rows" when a CUDA recipe takes the task; NotMine with the reasons otherwise."""
    reasons = []
    for kind, mod in (("pointwise", pointwise), ("rows", rowreduce)):
        try:
            mod.lower(spec)
            return kind
        except NotMine as e:
            reasons.append(f"{kind}: {e}")
    raise NotMine("; ".join(reasons))


_ = torch  # dtype sizes come from torch dtypes' itemsize
