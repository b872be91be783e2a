"""CUDA recipe for pointwise regions: vector loads and stores per thread, a grid-stride loop."""

from __future__ import annotations

from forge.kernel import TaskSpec
from forge.policy.recipes import pointwise
from forge.policy.recipes.cuda_common import CudaKnobs, Vectors, alignment_check, args, header, params, vec_for
from forge.policy.recipes.emit import FLOAT_TYPES, Emitter, NotMine, from_float, guard_checks, trace_task
from forge.policy.recipes.index import Simplifier, var


def pointwise_source(spec: TaskSpec, knobs: CudaKnobs, low: pointwise.Lowered | None = None) -> str:
    """The CUDA source of a pointwise task with these knobs; NotMine if it is not pointwise. `low`: the
    task's pointwise lowering, if the caller has it."""
    low = low if low is not None else pointwise.lower(spec)
    gm = trace_task(spec)
    inner = low.inner
    vec = vec_for(inner, knobs.vec)
    o, k, k0 = var("o"), var("k"), var("k0")
    simplify = Simplifier({o: low.outer, k: inner, k0: inner})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    em = Emitter({p: i for i, p in enumerate(placeholders)}, spec.inputs, simplify)
    vectors = Vectors(spec, k, k0, vec, simplify)
    em.load_hook = vectors
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    stores, packs, writes = [], [], []
    for j, (node, m) in enumerate(zip(out_node.args[0], spec.outputs, strict=True)):
        if m.written().stride != spec.outputs[0].written().stride:
            raise NotMine("outputs in different layouts (vector stores need one)")
        v = em.value(node, pointwise.logical(o * inner + k, m.shape, low.order))  # positions in memory order
        ctype = FLOAT_TYPES[m.torch_dtype]
        packs.append(f"Pack<{ctype}, V> st{j};")
        stores.append(f"st{j}.v[v] = {from_float(v, m.torch_dtype)};")
        writes.append(f"*reinterpret_cast<Pack<{ctype}, V>*>(out{j}_p + (idx_t)o * {inner} + k0) = st{j};")
    body = "\n".join(f"      {line}" for line in em.lines + stores)
    per_row = inner // vec if vec > 1 else inner
    total = low.outer * inner
    idx = "int" if total * 2 < 2**31 else "long long"
    grid_cap = knobs.blocks or 2**31 - 1
    return (f"{header(knobs.fast_math)}\n// forge recipe: pointwise on CUDA, {low.outer} x {inner}, {knobs}\n"
            f"typedef {idx} idx_t;\n"
            f"template <int V>\n__global__ void __launch_bounds__({knobs.threads})\n"
            f"forge_pointwise({params(spec)}) {{\n"
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
            f"  if ({guard_checks(spec.inputs)}) return 2;\n"
            f"  const bool aligned = !({alignment_check(spec, vectors.aligned, vec)});\n"
            f"  const long long work = aligned ? {low.outer * per_row} : {total};\n"
            f"  long long blocks = (work + {knobs.threads - 1}) / {knobs.threads};\n"
            f"  if (blocks > {grid_cap}) blocks = {grid_cap};\n"
            f"  if (aligned) forge_pointwise<{vec}><<<(unsigned)blocks, {knobs.threads}, 0, stream>>>({args(spec)});\n"
            f"  else forge_pointwise<1><<<(unsigned)blocks, {knobs.threads}, 0, stream>>>({args(spec)});\n"
            f"  return cudaGetLastError() == cudaSuccess ? 0 : 3;\n}}\n")


# -- rows --------------------------------------------------------------------------------------------------
