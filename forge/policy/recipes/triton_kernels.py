"""Recipes for the `triton` backend: the pointwise and row-reduction lowerings emitted as Triton modules.

The graph is lowered exactly as for C and CUDA (forge.policy.recipes.emit: symbolic indices, loads through the
real strides, float32 arithmetic, each output rounded once); forge.policy.recipes.triton_common writes the same
expressions in triton.language on blocks. Like the other recipes, a module is generated for the task's shapes
and strides (constants in the kernel) and its `launch` returns 2 for other tensors.

- Pointwise: a program per `block` consecutive positions of the first output's memory order (flat index `i`,
  masked at the tail); values at their logical index, inputs loaded through their strides.
- Rows (forge.policy.recipes.triton_rows): a program per row; the whole row in one block (`chunk` 0: softmax,
  the norms' mean and variance exactly over the registers) or walked in blocks of `chunk` (online softmax,
  shifted sums for the variance) with a second pass for the epilogue.

Triton compiles a module for the GPU it runs on, so the kernels have no architecture: an export puts them in the
universal build variant. On a CPU they run under Triton's interpreter (TRITON_INTERPRET=1) on CPU tensors,
which is how CI checks them against eager (tests/test_recipe_triton.py); forge itself evaluates Triton
candidates on CUDA devices only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from forge.backends import TRITON
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes import pointwise
from forge.policy.recipes.emit import NotMine, trace_task
from forge.policy.recipes.index import Simplifier, flatten, unflatten, var
from forge.policy.recipes.triton_common import (
    PRELUDE,
    TritonEmitter,
    TritonKnobs,
    TritonRowKnobs,
    launcher,
    params,
    store,
    texpr,
    wide_index,
)
from forge.policy.recipes.triton_rows import row_source

__all__ = ["TritonKnobs", "TritonRowKnobs", "candidate", "pointwise_lines", "pointwise_source", "row_source"]

# store_one(j, meta, at, value, emitter): the statement that writes output j (its meta) at flat offset `at`
Store = Callable[..., str]


def candidate(spec: TaskSpec, knobs: TritonKnobs | TritonRowKnobs, low: Any = None) -> Candidate:
    """A triton Candidate for these knobs; `low`: the task's pointwise or row lowering when the caller has it."""
    if isinstance(knobs, TritonKnobs):
        return Candidate(TRITON.name, pointwise_source(spec, knobs, low))
    return Candidate(TRITON.name, row_source(spec, knobs, low))


def pointwise_source(spec: TaskSpec, knobs: TritonKnobs, low: pointwise.Lowered | None = None) -> str:
    """The Triton module of a pointwise task with these knobs; NotMine if it is not pointwise."""
    low = low if low is not None else pointwise.lower(spec)
    if knobs.block & (knobs.block - 1) or knobs.block < 16:
        raise NotMine(f"block {knobs.block} is not a power of two of at least 16")
    lines = pointwise_lines(spec, low, TritonEmitter, partial(store, shape="[BLOCK]", mask="mask"))
    pid = "tl.program_id(0).to(tl.int64)" if wide_index(spec) else "tl.program_id(0)"
    body = "".join(f"    {line}\n" for line in lines)
    return (f"{PRELUDE}\n# forge recipe: pointwise in Triton, {low.numel} elements, {knobs}\n\n"
            f"@triton.jit\ndef forge_pointwise({params(spec)}, BLOCK: tl.constexpr):\n"
            f"    i = {pid} * BLOCK + tl.arange(0, BLOCK)\n    mask = i < {low.numel}\n{body}\n\n"
            + launcher(spec, "forge_pointwise", f"triton.cdiv({low.numel}, {knobs.block})",
                       f"BLOCK={knobs.block}", knobs.warps))


def pointwise_lines(spec: TaskSpec, low: pointwise.Lowered, emitter: type[TritonEmitter],
                    store_one: Store) -> list[str]:
    """A pointwise kernel's body over the flat index `i` (Triton's or Helion's, by `emitter` and `store_one`):
    each output's value at its logical index, then its store, at `i` where it is laid out as the first output."""
    gm = trace_task(spec)
    i = var("i")
    simplify = Simplifier({i: low.numel})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    em = emitter({p: n for n, p in enumerate(placeholders)}, spec.inputs, simplify, block=(i,))
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    first = spec.outputs[0]
    stores = []
    for j, (node, m) in enumerate(zip(out_node.args[0], spec.outputs, strict=True)):
        logical = pointwise.logical(i, m.shape, low.order)
        v = em.value(node, logical)
        at = "i" if m.written().stride == first.written().stride else \
            texpr(simplify(flatten(unflatten(logical, m.shape), m.shape, m.written().stride)))
        stores.append(store_one(j, m, at, v, em))
    return em.lines + stores
