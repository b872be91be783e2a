"""Recipe: pointwise regions (chains with broadcasting, views and casts) -> one C loop nest for the CPU.

The region is lowered to C expressions by forge.policy.recipes.emit; this module picks the loop nest (rows of
the longest unit-stride block, vectorised inside) and writes the C source with its schedule knobs. Tasks
it cannot express (reductions, gathers, integer math) get `NotMine` with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch
import torch.fx

from forge.backends import CPU
from forge.capture.export import TensorMeta
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes.emit import FLOAT_TYPES, Emitter, NotMine, from_float, guard_checks, trace_task
from forge.policy.recipes.index import Expr, Simplifier, cexpr, flatten, unflatten, unit_stride_in, var
from forge.tasks.ops import Kind, kind_of, op_name

__all__ = ["Knobs", "Lowered", "NotMine", "PRELUDE", "candidate", "emit_cpu", "index_type", "lower", "pointers"]


@dataclass(frozen=True)
class Knobs:
    """The schedule the search explores."""

    chunk: int = 0  # OpenMP static schedule chunk (0: even split); no OpenMP below PARALLEL_MIN elements
    simd: bool = True  # `omp parallel for simd`
    unroll: int = 1  # GCC unroll pragma
    fast_math: bool = False


# Below this many elements a loop runs on the calling thread: waking OpenMP's team costs more than the work.
# ATen's own loops use the same grain (at::internal::GRAIN_SIZE), so eager and forge split work alike. Measured
# on a loaded 2-core host: 512 sines took 7-8 ms under `omp parallel for` (the team waits for the other core),
# 7 us without; at 1M elements both took the same.
PARALLEL_MIN = 32768


def parallel_for(work: int, clause: str) -> str:
    """`#pragma omp parallel for<clause>` when `work` (elements) is worth threads (PARALLEL_MIN), else ""."""
    return f"#pragma omp parallel for{clause}" if work >= PARALLEL_MIN else ""


PRELUDE = r"""#include "forge_abi.h"
#include <math.h>
#include <string.h>
static inline float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);
}
static inline float round_bf16(float f) { return bf2f(f2bf(f)); }
typedef _Float16 forge_half;
static inline float h2f(forge_half h) { return (float)h; }
static inline forge_half f2h(float f) { return (forge_half)f; }
static inline float round_f16(float f) { return (float)(forge_half)f; }
// exp in plain arithmetic, so loops that use it vectorise (libm's expf does not: errno, no vector
// variant). Cephes' range reduction and polynomial, about 2 ulp; inputs clamped to the float range.
static inline float forge_expf(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.72f ? 88.72f : x);
#ifdef __FAST_MATH__  // reassociation would cancel the magic-number rounding below
  const float y = x * 1.44269504088896341f;
  const float n = (float)(int32_t)(y + (y >= 0.0f ? 0.5f : -0.5f));
#else  // round to nearest by adding and subtracting 1.5 * 2^23 (vectorises without fast math)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
#endif
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return 2.0f * p * __builtin_bit_cast(float, ((int32_t)n + 126) << 23);  // n = 128 stays finite
}
// Saturating forms: arguments kept where exp stays finite, since fast math's reciprocal (with a Newton
// step) turns 1/inf into NaN.
static inline float forge_tanhf(float x) {
  x = x < -9.0f ? -9.0f : (x > 9.0f ? 9.0f : x);  // tanh is +-1 in float beyond
  return 1.0f - 2.0f / (forge_expf(2.0f * x) + 1.0f);
}
static inline float forge_sigmoidf(float x) { return 1.0f / (1.0f + forge_expf(x < -88.0f ? 88.0f : -x)); }
static inline float forge_max(float a, float b) { return a > b || a != a ? a : b; }  /* NaN wins, as in torch */
static inline float forge_min(float a, float b) { return a < b || a != a ? a : b; }
"""


@dataclass(frozen=True)
class Lowered:
    """A task the pointwise recipe can express: its C loop body and output stores.

    The loop is split in two: `outer` iterations (variable `o`, parallel) of `inner` elements (variable
    `k`, the vector loop), flat index `o * inner + k` in the memory order of the first output (`order`, its
    dimensions outermost first: (0, 2, 3, 1) for a channels-last one, empty for row-major); `inner` is the
    longest trailing block of that order in which every input is read at unit stride or not at all (all of
    it, `outer` == 1, when no such block exists). Values are computed at the logical (row-major) index of
    that position (`logical`).
    """

    body: tuple[str, ...]
    numel: int
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    outer: int = 1
    inner: int = 0
    order: tuple[int, ...] = ()


def memory_order(m: TensorMeta) -> tuple[int, ...]:
    """The dimensions of an output in the order its layout (TensorMeta.written) lays them out, outermost
    first; empty for row-major."""
    return (0, 2, 3, 1) if m.written().channels_last else ()


def logical(pos: Expr, shape: tuple[int, ...], order: tuple[int, ...]) -> Expr:
    """The row-major index of the element at flat position `pos` of the layout `order` lays `shape` out in."""
    if not order:
        return pos
    coords = unflatten(pos, tuple(shape[d] for d in order))
    dims: list[Expr] = [sympy.Integer(0)] * len(shape)
    for t, d in enumerate(order):
        dims[d] = coords[t]
    return flatten(dims, shape)


def store_at(m: TensorMeta, pos: Expr, first: TensorMeta, name: str, simplify: Simplifier) -> str | None:
    """Where output `m` stores the element at flat position `pos` of the loop (the layout of output `first`):
    `name` (the position itself) when `m` is laid out as `first`, else its offset in m's own layout."""
    if m.written().stride == first.written().stride:
        return name
    idx = logical(pos, m.shape, memory_order(first))
    return cexpr(simplify(flatten(unflatten(idx, m.shape), m.shape, m.written().stride)))


def lower(spec: TaskSpec) -> Lowered:
    """Trace the task and express it as one loop nest; raises NotMine when it cannot."""
    for m in spec.inputs + spec.outputs:
        if m.torch_dtype not in FLOAT_TYPES:
            raise NotMine(f"integer tensors ({m.dtype})")
    if not spec.outputs:
        raise NotMine("no outputs")
    numel = spec.outputs[0].numel
    for m in spec.outputs:
        if m.numel != numel:
            raise NotMine("outputs of different sizes")
    gm = trace_task(spec)
    for n in gm.graph.nodes:
        if n.op == "call_function" and kind_of(n.target) in (Kind.REDUCE, Kind.HEAVY, Kind.SINGLE):
            what = "a reduction or normalization" if kind_of(n.target) is Kind.REDUCE else f"aten.{op_name(n.target)}"
            raise NotMine(f"has {what}: not a pointwise region")
    order = memory_order(spec.outputs[0])
    shape = tuple(spec.outputs[0].shape[d] for d in order) if order else spec.outputs[0].shape
    suffixes = sorted({math.prod(shape[d:]) for d in range(len(shape))} - {numel, 1}, reverse=True)
    flat = None
    for inner in [numel, *[s for s in suffixes if s >= 16]]:
        low = _lower_split(gm, spec, numel, inner)
        o, k = var("o"), var("k")
        if inner == numel and all(unit_stride_in(e.subs(o, 0), k) for e in low[1]):
            return low[0]
        if inner < numel and all(unit_stride_in(e, k) for e in low[1]):
            return low[0]
        flat = flat or low[0]
    assert flat is not None
    return flat


def _lower_split(gm: torch.fx.GraphModule, spec: TaskSpec, numel: int, inner: int) -> tuple[Lowered, list[Expr]]:
    o, k = var("o"), var("k")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    simplify = Simplifier({o: max(numel // inner, 1), k: inner})
    em = Emitter({p: i for i, p in enumerate(placeholders)}, spec.inputs, simplify)
    first = spec.outputs[0]
    order = memory_order(first)
    pos = o * inner + k
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    stores = []
    for j, (node, m) in enumerate(zip(out_node.args[0], spec.outputs, strict=True)):
        v = em.value(node, logical(pos, m.shape, order))
        stores.append(f"out{j}_p[{store_at(m, pos, first, 'i', simplify)}] = {from_float(v, m.torch_dtype)};")
    return (Lowered(tuple(em.lines + stores), numel, spec.inputs, spec.outputs, numel // inner, inner, order),
            em.loads)


def index_type(numel: int) -> str:
    """`idx_t`: 32-bit when the indices fit, so index arithmetic and gathers vectorise."""
    return f"  typedef {'int32_t' if numel < 2**31 else 'int64_t'} idx_t;\n"


def pointers(inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...]) -> str:
    """Declarations of restrict-qualified data pointers, so loops vectorise without alias checks."""
    lines = [f"  const {FLOAT_TYPES[m.torch_dtype]}* __restrict__ in{i}_p = "
             f"(const {FLOAT_TYPES[m.torch_dtype]}*)in[{i}].data;" for i, m in enumerate(inputs)]
    lines += [f"  {FLOAT_TYPES[m.torch_dtype]}* __restrict__ out{j}_p = ({FLOAT_TYPES[m.torch_dtype]}*)out[{j}].data;"
              for j, m in enumerate(outputs)]
    return "\n".join(lines) + "\n"


def emit_cpu(low: Lowered, knobs: Knobs) -> str:
    """The C++ source of the loop nest with these knobs."""
    guard = guard_checks(low.inputs)
    schedule = f" schedule(static, {knobs.chunk})" if knobs.chunk else " schedule(static)"
    simd = "#pragma omp simd" if knobs.simd else f"#pragma GCC unroll {max(knobs.unroll, 1)}"
    par = parallel_for(low.numel, schedule)
    if low.outer > 1:  # rows of unit-stride elements: parallel over rows, vector loop inside
        body = "\n".join(f"      {line}" for line in low.body)
        loop = (f"  {par}\n  for (idx_t o = 0; o < {low.outer}; ++o) {{\n"
                f"    {simd}\n    for (idx_t k = 0; k < {low.inner}; ++k) {{\n"
                f"      const idx_t i = o * {low.inner} + k;\n"
                f"{body}\n    }}\n  }}\n")
    elif knobs.unroll > 1:  # blocks of `unroll` elements per iteration of the parallel loop, the tail cut short
        body = "\n".join(f"      {line}" for line in low.body)
        loop = (f"  {par}\n"
                f"  for (idx_t i0 = 0; i0 < n; i0 += {knobs.unroll}) {{\n"
                f"    const idx_t end = i0 + {knobs.unroll} < n ? i0 + {knobs.unroll} : n;\n"
                f"    {simd}\n    for (idx_t k = i0; k < end; ++k) {{\n      const idx_t o = 0, i = k; (void)o;\n"
                f"{body}\n    }}\n  }}\n")
    else:
        body = "\n".join(f"    {line}" for line in low.body)
        flat = parallel_for(low.numel, f"{' simd' if knobs.simd else ''}{schedule}") or (simd if knobs.simd else "")
        loop = (f"  {flat}\n"
                f"  for (idx_t k = 0; k < n; ++k) {{\n    const idx_t o = 0, i = k; (void)o;\n{body}\n  }}\n")
    return (f"{PRELUDE}\n// forge recipe: pointwise, {low.outer} x {low.inner}, knobs {knobs}\n"
            f"extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {{\n"
            f"  if (n_in != {len(low.inputs)} || n_out != {len(low.outputs)}) return 1;\n"
            f"  if ({guard}) return 2;\n{pointers(low.inputs, low.outputs)}"
            f"{index_type(low.numel)}  const idx_t n = {low.numel}; (void)n;\n{loop}  return 0;\n}}\n")


def candidate(low: Lowered, knobs: Knobs) -> Candidate:
    """A cpu Candidate for these knobs (fast math is a compiler flag)."""
    flags = CPU.fast_math if knobs.fast_math else CPU.exact_math
    return Candidate(CPU.name, emit_cpu(low, knobs), flags=flags)
