"""CUDA recipe for a GroupNorm region over channels-last (NHWC) activations: three passes, all coalesced.

In NHWC a group's elements are `C/G` channels at every position, `C` apart: the row recipe's block per
group would read them strided. Here a block takes a tile of positions of one sample and all its channels
(each thread `V` adjacent channels of one group, one vector load), as the memory lies:
1. statistics: per tile and group, the sums of `x - pivot` and of its square (the pivot is x at the group's
   first element, so a large mean cannot cancel the variance away), reduced in the block with shuffles and
   shared-memory atomics, written to a workspace (a `__device__` array, no allocation);
2. per group: the tiles' sums combined in double, mean and 1/sqrt(var + eps);
3. the prologue again, the normalization and the epilogue at every element, stored NHWC as vectors.
x is read twice and each output written once: what a two-pass GroupNorm over memory costs. The workspaces
are the library's own `__device__` arrays: calls on one stream (forge's) run in turn; two concurrent calls of
one kernel (two streams, parallel graph branches) would share them.
The prologue and epilogue are the task's own ops (forge.policy.recipes.emit), as in the row recipe.
"""

from __future__ import annotations

import math
from typing import Any

import torch.fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from forge.kernel import TaskSpec
from forge.policy.recipes import rowreduce
from forge.policy.recipes.cuda_common import CudaRowKnobs, Vectors, alignment_check, args, header, params, vec_for
from forge.policy.recipes.emit import FLOAT_TYPES, Emitter, NotMine, from_float, guard_checks, lit, trace_task
from forge.policy.recipes.index import Expr, Simplifier, cexpr, unit_stride_in, var

RESIDENT = 1 << 18  # threads a large GPU holds at once (an H200: 132 x 2048): the grid aims at one wave


def applies(spec: TaskSpec) -> bool:
    """True when the task is a GroupNorm region whose full-size outputs are channels-last."""
    return any(m.written().channels_last for m in spec.outputs)


def nhwc_norm_source(spec: TaskSpec, knobs: CudaRowKnobs, low: rowreduce.RowLowered | None = None) -> str:
    """The CUDA source of an NHWC GroupNorm task with these knobs (threads, vec, fast_math); NotMine if the
    task is not one this schedule takes."""
    low = low if low is not None else rowreduce.lower(spec)
    if low.op != "native_group_norm":
        raise NotMine(f"channels-last outputs of aten.{low.op}: no NHWC schedule")
    gm = trace_task(spec)
    red = next(n for n in gm.graph.nodes if n.op == "call_function" and rowreduce.op_name(n.target) == low.op)
    shape = _schedule(red, low, knobs)
    n_, c_, hw, g_, cg, vec = shape.n, shape.c, shape.hw, shape.g, shape.cg, shape.vec
    tiles, pt = shape.tiles, shape.pt
    n, p, c, c0, g = var("n"), var("p"), var("c"), var("c0"), var("g")
    simplify = Simplifier({n: n_, p: hw, c: c_, c0: c_, g: g_})
    i = n * c_ * hw + c * hw + p  # the logical (row-major) index of channel c at position p of sample n
    placeholders = [x for x in gm.graph.nodes if x.op == "placeholder"]
    inputs = {ph: k for k, ph in enumerate(placeholders)}
    x = red.args[0]

    def emitter(prefix: str, vectors: bool, special: dict[torch.fx.Node, object] | None = None
                ) -> tuple[Emitter, Vectors | None]:
        em = Emitter(inputs, spec.inputs, simplify, prefix=prefix, special=special)
        hook = Vectors(spec, c, c0, vec, simplify) if vectors else None
        em.load_hook = hook
        return em, hook

    pro, pro_vec = emitter("p", True)
    x_expr = pro.value(x, i)
    if any(not unit_stride_in(off, c) for off in pro.loads if off.has(c)):
        raise NotMine("the normalized input is not read at unit stride across channels (not channels-last)")
    piv, _ = emitter("z", False)
    piv_expr = piv.value(x, n * c_ * hw + g * cg * hw)
    epi, epi_vec = emitter("e", True)
    def normalized(idx: Expr) -> str:  # from the statistics of this thread's group: only at its own channel
        if not (rowreduce.same_everywhere(ModularIndexing(idx, hw, c_), c, simplify.ranges)
                and rowreduce.same_everywhere(FloorDiv(idx, c_ * hw), n, simplify.ranges)):
            raise NotMine("the epilogue reads the normalization at another channel or sample (a permuted result)")
        return rowreduce._reduced_value(red, low.op, idx, epi, low.length)

    epi.special = {red: normalized}
    (out_node,) = [o for o in gm.graph.nodes if o.op == "output"]
    packs, stores, writes = _stores(spec, out_node.args[0], shape, i, simplify, epi)
    assert pro_vec is not None and epi_vec is not None
    aligned = pro_vec.aligned | epi_vec.aligned
    vector_outputs = {j for j, m in enumerate(spec.outputs) if m.written().channels_last}
    body_a = _element_loop(shape, pro_vec.lines, [*pro.lines, f"const float x = {x_expr};",
                                                  "const float d = x - piv; t1 += d; t2 += d * d;"])
    body_c = _element_loop(shape, epi_vec.lines + packs, [*epi.lines, *stores], writes)
    idx = "int" if n_ * c_ * hw * 2 < 2**31 else "long long"
    piv_code = "".join(f"  {line}\n" for line in piv.lines) + f"  const float piv = {piv_expr};\n"
    return (f"{header(knobs.fast_math)}\n// forge recipe: GroupNorm over NHWC on CUDA, {n_} x {hw} positions x {c_}"
            f" channels in {g_} groups, {tiles} tiles of {pt}, {knobs}\ntypedef {idx} idx_t;\n"
            f"__device__ float forge_ws[{n_ * tiles * g_ * 2}];\n__device__ float forge_stats[{n_ * g_ * 2}];\n"
            + _kernels(spec, shape, piv_code, body_a, body_c, lit(low.eps))
            + _launch(spec, shape, aligned, vector_outputs, vec))


class _Shape:
    """The sizes of the schedule."""

    def __init__(self, n: int, c: int, hw: int, g: int, cg: int, vec: int, ct: int, rp: int, pt: int, tiles: int,
                 length: int, threads: int) -> None:
        self.n, self.c, self.hw, self.g, self.cg, self.vec, self.ct, self.rp = n, c, hw, g, cg, vec, ct, rp
        self.pt, self.tiles, self.length, self.threads = pt, tiles, length, threads


def _schedule(red: torch.fx.Node, low: rowreduce.RowLowered, knobs: CudaRowKnobs) -> _Shape:
    """The schedule's sizes for this GroupNorm and knobs; NotMine where a group's channels are not a power of
    two of vectors up to a warp, or a position's threads do not tile the block."""
    n_, c_, hw, g_ = (int(a) for a in red.args[3:7])
    cg = c_ // g_
    vec = vec_for(cg, knobs.vec)
    if (cg // vec) & (cg // vec - 1) or cg // vec > 32:
        raise NotMine(f"{cg // vec} vectors a group: not a power of two up to a warp")
    ct = c_ // vec  # threads across the channels of a position
    if ct > knobs.threads or knobs.threads % ct or knobs.threads % 32:  # whole warps: the shuffles need them
        raise NotMine(f"{ct} threads a position do not tile a block of {knobs.threads}")
    rp = knobs.threads // ct  # positions a block works on at once
    tiles = max(1, min(max(1, RESIDENT // knobs.threads // n_), -(-hw // rp)))
    pt = -(-hw // tiles)  # positions a tile
    tiles = -(-hw // pt)
    return _Shape(n_, c_, hw, g_, cg, vec, ct, rp, pt, tiles, low.length, knobs.threads)


def _stores(spec: TaskSpec, outs: list[Any], s: _Shape, i: Expr, simplify: Simplifier,
            epi: Emitter) -> tuple[list[str], list[str], list[str]]:
    """The norm kernel's output code: for each channels-last output a vector pack, its element stores and its
    write; a row-major one element by element, strided. NotMine for an output that is not full-size."""
    n_, c_, hw = s.n, s.c, s.hw
    packs, stores, writes = [], [], []
    for j, (o, m) in enumerate(zip(outs, spec.outputs, strict=True)):
        if m.numel != n_ * c_ * hw:
            raise NotMine("an output that is not full-size (the statistics)")
        if m.written().channels_last and m.shape[:2] != (n_, c_):
            raise NotMine(f"a channels-last output of shape {m.shape}, not ({n_}, {c_}, H, W)")
        value = from_float(epi.value(o, i), m.torch_dtype)
        if not m.written().channels_last:  # row-major (a (b, c, h*w) view, say): element by element, strided
            stores.append(f"out{j}_p[{cexpr(simplify(i))}] = {value};")
            continue
        ctype = FLOAT_TYPES[m.torch_dtype]
        packs.append(f"Pack<{ctype}, V> st{j};")
        stores.append(f"st{j}.v[v] = {value};")
        writes.append(f"*reinterpret_cast<Pack<{ctype}, V>*>(out{j}_p + ((idx_t)n * {hw} + p) * {c_} + c0) = st{j};")
    return packs, stores, writes


def _element_loop(s: _Shape, vec_lines: list[str], lines: list[str], after: list[str] | None = None) -> str:
    """Over this thread's positions of the block's tile: its `vec` channels at each, as VEC / V vectors of V
    (V = vec, one vector load; V = 1 where a pointer is not aligned to the vector)."""
    body = "".join(f"        {line}\n" for line in lines)
    return (f"  #pragma unroll 4\n  for (idx_t p = p_lo + tr; p < p_hi; p += {s.rp}) {{\n"
            f"   #pragma unroll\n   for (int sub = 0; sub < {s.vec} / V; ++sub) {{\n"
            f"    const idx_t c0 = cbase + sub * V;\n"
            + "".join(f"    {line}\n" for line in vec_lines)
            + "    #pragma unroll\n    for (int v = 0; v < V; ++v) {\n      const idx_t c = c0 + v; (void)c;\n"
            + body + "    }\n" + "".join(f"    {line}\n" for line in after or []) + "   }\n  }\n")


def _kernels(spec: TaskSpec, s: _Shape, piv: str, body_a: str, body_c: str, eps: str) -> str:
    lanes = s.cg // s.vec  # adjacent threads of one group (a power of two, at most a warp)
    head = (f"  const idx_t n = blockIdx.y; const unsigned tid = threadIdx.x;\n"
            f"  const unsigned tc = tid % {s.ct}, tr = tid / {s.ct};\n"
            f"  const idx_t cbase = (idx_t)tc * {s.vec}; const idx_t g = cbase / {s.cg};\n"
            f"  const idx_t p_lo = (idx_t)blockIdx.x * {s.pt};\n"
            f"  const idx_t p_hi = p_lo + {s.pt} < {s.hw} ? p_lo + {s.pt} : {s.hw};\n")
    shuffle = "".join(f"  t1 += __shfl_xor_sync(0xffffffffu, t1, {o}); t2 += __shfl_xor_sync(0xffffffffu, t2, {o});\n"
                      for o in (1 << k for k in range(int(math.log2(lanes)))))
    stats = (f"template <int V>\n__global__ void __launch_bounds__({s.threads}) forge_nhwc_stats({params(spec)}) {{\n"
             f"  __shared__ float sm[{2 * s.g}];\n"
             f"  for (unsigned k = threadIdx.x; k < {2 * s.g}; k += {s.threads}) sm[k] = 0.0f;\n"
             f"  __syncthreads();\n{head}{piv}  float t1 = 0.0f, t2 = 0.0f;\n{body_a}{shuffle}"
             f"  if (tc % {lanes} == 0) {{ atomicAdd(&sm[2 * g], t1); atomicAdd(&sm[2 * g + 1], t2); }}\n"
             f"  __syncthreads();\n"
             f"  for (unsigned k = threadIdx.x; k < {2 * s.g}; k += {s.threads})\n"
             f"    forge_ws[((idx_t)n * {s.tiles} + blockIdx.x) * {2 * s.g} + k] = sm[k];\n}}\n\n")
    final = (f"__global__ void __launch_bounds__(32) forge_nhwc_final({params(spec)}) {{\n"
             f"  const idx_t n = blockIdx.x / {s.g}, g = blockIdx.x % {s.g};\n"
             f"  double a = 0.0, b = 0.0;\n"
             f"  for (idx_t t = threadIdx.x; t < {s.tiles}; t += 32) {{\n"
             f"    a += forge_ws[(n * {s.tiles} + t) * {2 * s.g} + 2 * g];"
             f" b += forge_ws[(n * {s.tiles} + t) * {2 * s.g} + 2 * g + 1]; }}\n"
             f"  for (int o = 16; o > 0; o >>= 1) {{ a += __shfl_xor_sync(0xffffffffu, a, o);"
             f" b += __shfl_xor_sync(0xffffffffu, b, o); }}\n"
             f"  if (threadIdx.x != 0) return;\n{piv}"
             f"  const double m1 = a / {s.length}, var_d = b / {s.length} - m1 * m1;\n"
             f"  forge_stats[2 * blockIdx.x] = (float)(piv + m1);\n"
             f"  forge_stats[2 * blockIdx.x + 1] = (float)(1.0 / sqrt((var_d > 0.0 ? var_d : 0.0) + {eps}));\n}}\n\n")
    norm = (f"template <int V>\n__global__ void __launch_bounds__({s.threads}) forge_nhwc_norm({params(spec)}) {{\n"
            f"{head}  const float mean = forge_stats[2 * (n * {s.g} + g)];"
            f" const float rstd = forge_stats[2 * (n * {s.g} + g) + 1];\n{body_c}}}\n\n")
    return stats + final + norm


def _launch(spec: TaskSpec, s: _Shape, aligned: set[int], outputs: set[int], vec: int) -> str:
    grid = f"dim3({s.tiles}, {s.n})"
    return (f"extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, "
            f"cudaStream_t stream) {{\n"
            f"  if (n_in != {len(spec.inputs)} || n_out != {len(spec.outputs)}) return 1;\n"
            f"  if ({guard_checks(spec.inputs)}) return 2;\n"
            f"  const bool aligned = !({alignment_check(spec, aligned, vec, outputs)});\n"
            f"  if (aligned) forge_nhwc_stats<{vec}><<<{grid}, {s.threads}, 0, stream>>>({args(spec)});\n"
            f"  else forge_nhwc_stats<1><<<{grid}, {s.threads}, 0, stream>>>({args(spec)});\n"
            f"  forge_nhwc_final<<<{s.n * s.g}, 32, 0, stream>>>({args(spec)});\n"
            f"  if (aligned) forge_nhwc_norm<{vec}><<<{grid}, {s.threads}, 0, stream>>>({args(spec)});\n"
            f"  else forge_nhwc_norm<1><<<{grid}, {s.threads}, 0, stream>>>({args(spec)});\n"
            f"  return cudaGetLastError() == cudaSuccess ? 0 : 3;\n}}\n")


__all__ = ["applies", "nhwc_norm_source"]
