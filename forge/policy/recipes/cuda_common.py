"""What the CUDA recipes share: the device prelude, the schedule knobs, the launcher's plumbing (kernel
parameters, alignment checks) and the vector-load hook of the emitter. See forge.policy.recipes.cuda."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from forge.kernel import TaskSpec
from forge.policy.recipes.emit import FLOAT_TYPES
from forge.policy.recipes.index import Expr, Simplifier, cexpr, unit_stride_in

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
__device__ __forceinline__ float forge_max(float a, float b) { return a > b || a != a ? a : b; }  // NaN wins
__device__ __forceinline__ float forge_min(float a, float b) { return a < b || a != a ? a : b; }
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


def params(spec: TaskSpec) -> str:
    ins = [f"const {FLOAT_TYPES[m.torch_dtype]}* __restrict__ in{i}_p" for i, m in enumerate(spec.inputs)]
    outs = [f"{FLOAT_TYPES[m.torch_dtype]}* __restrict__ out{j}_p" for j, m in enumerate(spec.outputs)]
    return ", ".join(ins + outs)


def args(spec: TaskSpec) -> str:
    ins = [f"(const {FLOAT_TYPES[m.torch_dtype]}*)in[{i}].data" for i, m in enumerate(spec.inputs)]
    outs = [f"({FLOAT_TYPES[m.torch_dtype]}*)out[{j}].data" for j, m in enumerate(spec.outputs)]
    return ", ".join(ins + outs)


class Vectors:
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
            ctype = FLOAT_TYPES[self.spec.inputs[i].torch_dtype]
            at = cexpr(self.simplify(off.subs(self.k, self.k0)))
            self.lines.append(f"const Pack<{ctype}, V> {name} = *reinterpret_cast<const Pack<{ctype}, V>*>"
                              f"(in{i}_p + {at});")
            self.names[(i, off)] = name
            self.aligned.add(i)
        return f"{self.names[(i, off)]}.v[v]"


def vec_for(n: int, want: int) -> int:
    v = want
    while v > 1 and n % v:
        v //= 2
    return v


def alignment_check(spec: TaskSpec, inputs: set[int], vec: int, outputs: set[int] | None = None) -> str:
    """True (non-zero) when a pointer read or written as vectors is not aligned to them; `outputs`: the outputs
    stored as vectors (default all of them)."""
    outs = range(len(spec.outputs)) if outputs is None else sorted(outputs)
    parts = [f"((uintptr_t)in[{i}].data % {vec * spec.inputs[i].torch_dtype.itemsize})" for i in sorted(inputs)]
    parts += [f"((uintptr_t)out[{j}].data % {vec * spec.outputs[j].torch_dtype.itemsize})" for j in outs]
    return " || ".join(parts) or "0"


def header(fast_math: bool) -> str:
    return ("#define FORGE_FAST_MATH\n" if fast_math else "") + PRELUDE


# -- pointwise ---------------------------------------------------------------------------------------------
