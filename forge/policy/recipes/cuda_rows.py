"""CUDA recipe for row reductions: a block, a warp or a thread-block cluster per row, the row on chip."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.fx

from forge.kernel import TaskSpec
from forge.policy.recipes import rowreduce
from forge.policy.recipes.cuda_common import CudaRowKnobs, Vectors, alignment_check, args, header, params, vec_for
from forge.policy.recipes.emit import (
    FLOAT_TYPES,
    VIEWS,
    Emitter,
    NotMine,
    from_float,
    guard_checks,
    lit,
    to_float,
    trace_task,
)
from forge.policy.recipes.index import Expr, Simplifier, cexpr, flatten, unflatten, var


def row_source(spec: TaskSpec, knobs: CudaRowKnobs, low: rowreduce.RowLowered | None = None) -> str:
    """The CUDA source of a row-reduction task with these knobs; NotMine if it is not one. `low`: the
    task's row lowering, if the caller has it."""
    low = low if low is not None else rowreduce.lower(spec)  # validates the task; rows and length
    rows, length = low.rows, low.length
    gm = trace_task(spec)
    red = next(n for n in gm.graph.nodes if n.op == "call_function" and rowreduce.op_name(n.target) == low.op)
    cl = knobs.cluster
    if length % cl:
        raise NotMine(f"row of {length} does not split into {cl} blocks")
    if knobs.warp_rows and (cl > 1 or knobs.smem):
        raise NotMine("a warp per row neither splits the row over a cluster nor keeps it in shared memory")
    chunk = length // cl
    vec = vec_for(chunk, knobs.vec)
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
    pro = Emitter(inputs, spec.inputs, simplify, prefix="p")
    vec_pro = Vectors(spec, jj, j0, vec, simplify)
    pro.load_hook = vec_pro
    x_expr = pro.value(x, i)
    i_simple = simplify(i)

    def cached_x(idx: Expr) -> str:
        if (cache or knobs.smem) and simplify(idx) == i_simple:
            return "xc"
        return epi_plain.value(x, idx)

    epi_plain = Emitter(inputs, spec.inputs, simplify, prefix="f")
    epi = Emitter(inputs, spec.inputs, simplify, prefix="e",
                   special={red: rowreduce.at_row(red, low.op, length, simplify, r,
                                                  lambda idx: rowreduce._reduced_value(red, low.op, idx, epi, length)),
                            x: cached_x})
    vec_epi = Vectors(spec, jj, j0, vec, simplify)
    epi.load_hook = vec_epi
    epi_plain.load_hook = vec_epi
    per_row = Emitter(inputs, spec.inputs, simplify, prefix="q",
                       special={red: lambda idx: rowreduce._reduced_value(red, low.op, idx, per_row, length)})
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    y_stores, packs, writes, row_stores = _stores(spec, out_node.args[0], rows, length, i, r, simplify, epi, per_row)
    aligned = vec_pro.aligned | vec_epi.aligned
    piv = Emitter(inputs, spec.inputs, simplify, prefix="z")  # x at the row's first element (scalar loads)
    piv_value = piv.value(x, r * length)
    piv_lines = (*piv.lines, f"const float piv = {piv_value};")
    src = _row_kernel(low, knobs, cache, slots, chunk, pro.lines, x_expr, vec_pro.lines, epi_plain.lines
                      + epi.lines + y_stores, vec_epi.lines, packs, writes, per_row.lines + row_stores, smem_type,
                      piv_lines)
    smem_bytes = chunk * smem_type.itemsize if smem_type else 0
    return _source(spec, low, knobs, src, vec, smem_bytes, aligned)


def _stores(spec: TaskSpec, outs: list[Any], rows: int, length: int, i: Expr, r: Expr, simplify: Simplifier,
            epi: Emitter, per_row: Emitter) -> tuple[list[str], list[str], list[str], list[str]]:
    """The row kernel's output code: per element (vector packs and their writes, or element by element
    through the strides of an output that is not row-major) and per row."""
    y_stores, packs, writes, row_stores = [], [], [], []
    for j, (o, m) in enumerate(zip(outs, spec.outputs, strict=True)):
        ctype = FLOAT_TYPES[m.torch_dtype]
        if m.numel == rows * length:
            v = epi.value(o, i)
            if not m.written().contiguous:  # channels-last (an attention block's transposed output, say):
                # element by element through its strides; a GroupNorm over NHWC has a schedule of its own
                at = cexpr(simplify(flatten(unflatten(i, m.shape), m.shape, m.written().stride)))
                y_stores.append(f"out{j}_p[{at}] = {from_float(v, m.torch_dtype)};")
                continue
            packs.append(f"Pack<{ctype}, V> st{j};")
            y_stores.append(f"st{j}.v[v] = {from_float(v, m.torch_dtype)};")
            writes.append(f"*reinterpret_cast<Pack<{ctype}, V>*>(out{j}_p + (idx_t)r * {length} + j0) = st{j};")
        elif m.numel == rows:
            row_stores.append(f"out{j}_p[r] = {from_float(per_row.value(o, r), m.torch_dtype)};")
        else:
            raise NotMine("an output that is neither per element nor per row")
    return y_stores, packs, writes, row_stores


def _source(spec: TaskSpec, low: rowreduce.RowLowered, knobs: CudaRowKnobs, src: str, vec: int, smem_bytes: int,
            aligned: set[int]) -> str:
    """The kernel's translation unit: the kernel body `src` in its template, and forge_launch (guards, the
    alignment check that picks the vector or the scalar instance, the grid, shared memory and cluster
    attributes)."""
    rows, length, cl = low.rows, low.length, knobs.cluster
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
    return (f"{header(knobs.fast_math)}\n// forge recipe: row reduction ({low.op}) on CUDA, {rows} rows of {length},"
            f" {knobs}\ntypedef {idx} idx_t;\n"
            f"template <int V>\n__global__ void {attrs}__launch_bounds__({knobs.threads}) forge_rows({params(spec)}) "
            f"{{\n{src}}}\n\n"
            f"extern \"C\" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out, "
            f"cudaStream_t stream) {{\n"
            f"  if (n_in != {len(spec.inputs)} || n_out != {len(spec.outputs)}) return 1;\n"
            f"  if ({guard_checks(spec.inputs)}) return 2;\n"
            f"  const bool aligned = !({alignment_check(spec, aligned, vec)});\n"
            f"{attr}{attr_cl}"
            f"  if (aligned) forge_rows<{vec}><<<{grid}, {knobs.threads}, {smem_bytes}, stream>>>({args(spec)});\n"
            f"  else forge_rows<1><<<{grid}, {knobs.threads}, {smem_bytes}, stream>>>({args(spec)});\n"
            f"  return cudaGetLastError() == cudaSuccess ? 0 : 3;\n}}\n")


def _exact_input_dtype(node: object) -> torch.dtype | None:
    """The dtype of the input the value is an exact copy of (through views and widening casts), or None."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        name = rowreduce.op_name(node.target)
        if name == "_to_copy" and node.kwargs.get("dtype") in (torch.float32, torch.float64):
            node = node.args[0]
        elif name in VIEWS and rowreduce.shape_of(node) == rowreduce.shape_of(node.args[0]):
            node = node.args[0]
        else:
            return None
    if isinstance(node, torch.fx.Node) and node.op == "placeholder":
        return node.meta["val"].dtype
    return None


class _RowPasses:
    """The row kernel's loops over this thread's part of the row and its block (and cluster) reductions."""

    def __init__(self, knobs: CudaRowKnobs, cache: bool, chunk: int) -> None:
        self.warp_rows, self.cl, self.cache, self.chunk = knobs.warp_rows, knobs.cluster, cache, chunk
        self.threads = 32 if knobs.warp_rows else knobs.threads  # threads per row
        self.warps = self.threads // 32

    def loop(self, inner: list[str], vec_lines: list[str], pre: str = "", post: str = "") -> str:
        """Over this thread's slots of its part of the row: `vec_lines` and `pre` once a slot, `inner` at each of
        the slot's V elements, then `post`."""
        threads, chunk = self.threads, self.chunk
        body = "\n".join(f"        {line}" for line in inner)
        unroll = "#pragma unroll" if self.cache else "#pragma unroll 8"  # registers need constant indices
        return (f"  {unroll}\n  for (int s = 0; s < S; ++s) {{\n"
                f"    const idx_t jc = ((idx_t)s * {threads} + tid) * V;\n"
                f"    if (jc < {chunk}) {{\n      const idx_t j0 = part * {chunk} + jc;\n"
                + "".join(f"      {line}\n" for line in vec_lines) + (f"      {pre}\n" if pre else "")
                + f"      #pragma unroll\n      for (int v = 0; v < V; ++v) {{\n        const idx_t jj = j0 + v;"
                f" (void)jj;\n{body}\n      }}\n" + (f"      {post}\n" if post else "") + "    }\n  }\n")

    def reduce(self, kind: str, value: str, out: str) -> str:
        """Block (and cluster) reduction of `value` into `out` (sum | max | min)."""
        fn = {"sum": "warp_sum", "max": "warp_max", "min": "warp_min"}[kind]
        init = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}[kind]
        if self.warp_rows:
            return f"  {out} = {fn}({value});\n"
        warps, cl = self.warps, self.cl
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


class _RowReads(NamedTuple):
    """How the row kernel's loops read the reduced input x."""

    x_lines: list[str]  # x from memory (the prologue), and its copy on chip where one is kept
    pro_vec: list[str]  # the prologue's vector loads
    pack_in: str  # the shared-memory copy: its pack, declared once a slot, and the pack's one vector store
    pack_out: str
    reread: list[str] | None  # x again from registers or shared memory; None: nothing kept on chip
    reread_vec: list[str]  # the vector load from shared memory before `reread`
    reload: list[str]  # x again from memory: the prologue once more

    def again(self) -> tuple[list[str], list[str]]:
        """x read a second time and the vector lines before it: from chip where it is kept, else from memory."""
        return self.reread or self.reload, self.reread_vec if self.reread else self.pro_vec


def _row_reads(pro: list[str], x_expr: str, pro_vec: list[str], cache: bool, smem: torch.dtype | None) -> _RowReads:
    """The reads of x: kept in registers (`cache`), in shared memory as `smem` (its dtype), or in neither."""
    x_lines = [*pro, f"const float x = {x_expr};"] + (["xr[s * V + v] = x;"] if cache else [])
    if smem is not None:
        x_lines.append(f"xsp.v[v] = {from_float('x', smem)};")
    st = FLOAT_TYPES[smem] if smem is not None else ""
    pack_in = f"Pack<{st}, V> xsp;" if smem is not None else ""  # one vector store per thread and slot
    pack_out = f"*reinterpret_cast<Pack<{st}, V>*>(xs + jc) = xsp;" if smem is not None else ""
    reread_vec = [f"const Pack<{st}, V> xsr = *reinterpret_cast<const Pack<{st}, V>*>(xs + jc);"] \
        if smem is not None else []
    reread = (["const float x = xr[s * V + v];"] if cache else
              [f"const float x = {to_float('xsr.v[v]', smem)};"] if smem is not None else None)
    return _RowReads(x_lines, pro_vec, pack_in, pack_out, reread, reread_vec, [*pro, f"const float x = {x_expr};"])


def _row_head(low: rowreduce.RowLowered, knobs: CudaRowKnobs, passes: _RowPasses, smem: torch.dtype | None) -> str:
    """The row kernel's declarations: the slot count S, this thread's row, part of it and lane, the reductions'
    shared memory, and where the row is kept on chip (registers `xr`, shared memory `xs`)."""
    cl, threads = knobs.cluster, passes.threads
    head = f"  constexpr int S = ({passes.chunk} + {threads} * V - 1) / ({threads} * V);\n"
    if knobs.warp_rows:
        head += (f"  const idx_t r = (idx_t)blockIdx.x * {knobs.threads // 32} + (threadIdx.x >> 5);\n"
                 f"  if (r >= {low.rows}) return;  // no block-wide barriers below: a warp may leave\n"
                 "  const unsigned part = 0, tid = threadIdx.x & 31;\n")
    else:
        head += ("  __shared__ float red_smem[33];\n" + ("  __shared__ float cl_smem;\n" if cl > 1 else "")
                 + f"  const idx_t r = blockIdx.x / {cl}; const unsigned part = "
                 + ("cluster_rank();\n" if cl > 1 else "0;\n") + "  const unsigned tid = threadIdx.x;\n")
    if passes.cache:
        head += "  float xr[S * V];  // this thread's elements of the row, in registers\n"
    if smem is not None:  # the block's part of the row, stored exactly as the input's dtype
        head += (f"  extern __shared__ __align__(16) unsigned char xs_raw[];\n"
                 f"  {FLOAT_TYPES[smem]}* xs = reinterpret_cast<{FLOAT_TYPES[smem]}*>(xs_raw);\n")
    return head


def _row_stats(low: rowreduce.RowLowered, passes: _RowPasses, reads: _RowReads, piv_lines: tuple[str, ...]) -> str:
    """The first pass (or two) over the row: the statistics the op's epilogue reads, reduced over the row."""
    if low.op in ("_softmax", "_log_softmax", "logsumexp"):
        return _softmax_stats(passes, reads)
    if low.op in ("amax", "amin"):
        return _extremum_stats(low.op, passes, reads)
    if reads.reread is None and low.op in ("native_layer_norm", "native_group_norm", "var"):
        return _shifted_variance_stats(low, passes, reads, piv_lines)
    return _sum_stats(low, passes, reads)


def _softmax_stats(passes: _RowPasses, reads: _RowReads) -> str:
    """The row's maximum `mx`, then the sum `sm` of exp(x - mx) (and its inverse) over a second read of x."""
    stats = "  float tm = -INFINITY;\n" + passes.loop([*reads.x_lines, "tm = fmaxf(tm, x);"], reads.pro_vec,
                                                      reads.pack_in, reads.pack_out)
    stats += "  float mx;\n" + passes.reduce("max", "tm", "mx")
    again, again_vec = reads.again()
    stats += "  float ts = 0.0f;\n" + passes.loop([*again, "if (x != -INFINITY) ts += forge_expf(x - mx);"],
                                                  again_vec)
    stats += "  float sm;\n" + passes.reduce("sum", "ts", "sm")
    return stats + "  const float inv_sm = 1.0f / sm; (void)inv_sm;\n"


def _extremum_stats(op: str, passes: _RowPasses, reads: _RowReads) -> str:
    """The row's maximum `mx` (amax) or minimum `mn` (amin)."""
    v, fn = ("mx", "fmaxf") if op == "amax" else ("mn", "fminf")
    init = "-INFINITY" if op == "amax" else "INFINITY"
    stats = f"  float t = {init};\n" + passes.loop([*reads.x_lines, f"t = {fn}(t, x);"], reads.pro_vec, reads.pack_in,
                                                   reads.pack_out)
    return stats + f"  float {v};\n" + passes.reduce("max" if op == "amax" else "min", "t", v)


def _shifted_variance_stats(low: rowreduce.RowLowered, passes: _RowPasses, reads: _RowReads,
                            piv_lines: tuple[str, ...]) -> str:
    """`mean` and `rstd` with nothing kept on chip: one pass of sums shifted by the row's first value (a large
    mean cannot cancel the variance), so the row is read twice in all, not three times."""
    length = low.length
    stats = "".join(f"  {line}\n" for line in piv_lines)
    stats += "  float t1 = 0.0f, t2 = 0.0f;\n" + passes.loop(
        [*reads.x_lines, "const float d = x - piv; t1 += d; t2 += d * d;"], reads.pro_vec)
    stats += "  float s1, s2;\n" + passes.reduce("sum", "t1", "s1") + passes.reduce("sum", "t2", "s2")
    return stats + (f"  const float m1 = s1 / {length}; const float mean = piv + m1;\n"
                    f"  const float var_ = fmaxf(s2 / {length} - m1 * m1, 0.0f);"
                    f" const float rstd = rsqrtf(var_ + {lit(low.eps)}); (void)rstd;\n")


def _sum_stats(low: rowreduce.RowLowered, passes: _RowPasses, reads: _RowReads) -> str:
    """The row's `mean`; for a norm or variance also `rstd`, the variance in a second pass over the registers
    (or shared memory)."""
    length = low.length
    stats = "  float t1 = 0.0f;\n" + passes.loop([*reads.x_lines, "t1 += x;"], reads.pro_vec, reads.pack_in,
                                                 reads.pack_out)
    stats += "  float sm;\n" + passes.reduce("sum", "t1", "sm") + f"  const float mean = sm / {length}; (void)mean;\n"
    if low.op in ("native_layer_norm", "native_group_norm", "var"):
        again, again_vec = reads.again()
        stats += "  float t2 = 0.0f;\n" + passes.loop([*again, "const float d = x - mean; t2 += d * d;"], again_vec)
        stats += ("  float ss;\n" + passes.reduce("sum", "t2", "ss")
                  + f"  const float var_ = ss / {length}; const float rstd = rsqrtf(var_ + {lit(low.eps)});"
                  " (void)rstd;\n")
    return stats


def _row_kernel(low: rowreduce.RowLowered, knobs: CudaRowKnobs, cache: bool, slots: int, chunk: int,
                pro: list[str], x_expr: str, pro_vec: list[str], epi: list[str], epi_vec: list[str],
                packs: list[str], writes: list[str], row_lines: list[str], smem: torch.dtype | None = None,
                piv_lines: tuple[str, ...] = ()) -> str:
    """The body of the row kernel (template parameter V: the vector width of this launch)."""
    passes = _RowPasses(knobs, cache, chunk)
    reads = _row_reads(pro, x_expr, pro_vec, cache, smem)
    head = _row_head(low, knobs, passes, smem)
    stats = _row_stats(low, passes, reads, piv_lines)
    xc = [reads.reread[0].replace("float x =", "float xc =")] if reads.reread else []
    pass2 = passes.loop([*xc, *epi], (reads.reread_vec if smem is not None else []) + epi_vec, " ".join(packs),
                        " ".join(writes)) if epi else ""
    rows = ""
    if row_lines:
        rows = "  if (part == 0 && tid == 0) {\n" + "".join(f"    {ln}\n" for ln in row_lines) + "  }\n"
    return head + stats + pass2 + rows
