"""Recipes for the `helion` backend: the pointwise and row-reduction lowerings emitted as Helion kernels.

The graph is lowered exactly as for C, CUDA and Triton (forge.policy.recipes.emit: symbolic indices, loads through
the real strides, float32 arithmetic, each output rounded once); forge.policy.recipes.helion_common writes the
same expressions as PyTorch ops on Helion tiles, reading flat views of the tensors at the lowering's offsets. Like
the other recipes a module is generated for the task's shapes and strides (`static_shapes=True`, the sizes
constants in the kernel), and its `launch` returns 2 for other tensors.

- Pointwise: a tile of `block` consecutive positions of the first output's memory order (flat index `i`).
- Rows (forge.policy.recipes.helion_rows): a tile of rows; each row held whole in one tile (`passes` 1) or walked
  in chunks, twice (`passes` 2: online softmax, shifted sums for the variance, then the epilogue).

What the search explores that Helion's autotuner does not: one or two passes, float64 statistics, and (by the
lowering) the fusion of the whole region into one kernel. The config (block sizes, warps, stages) is the
candidate's own, written in its source, and the search mutates it like any knob; Helion's autotuner never runs
while a candidate is judged (it would spawn compiles for minutes, and the config it found would not be in the
source). At a task's end the search may give the fastest Helion candidate to the autotuner on purpose
(forge.search.tune): the config it chose becomes a new candidate's source. So the config a candidate ran with is
the one stored with it and exported with it: an exported kernel runs tuned on its first call.

Helion compiles a module for the GPU it runs on (through Triton), so the kernels have no architecture. On a CPU
they run as eager PyTorch (HELION_INTERPRET=1) or as the Triton Helion generates, under Triton's interpreter
(TRITON_INTERPRET=1), which is how CI checks them against eager (tests/test_recipe_helion.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from forge.backends import HELION
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes import pointwise
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.helion_common import (
    PRELUDE,
    HelionEmitter,
    HelionKnobs,
    HelionRowKnobs,
    decorator,
    launcher,
    signature,
    store,
)
from forge.policy.recipes.helion_rows import row_source
from forge.policy.recipes.triton_common import wide_index
from forge.policy.recipes.triton_kernels import pointwise_lines

__all__ = ["HelionKnobs", "HelionRowKnobs", "candidate", "pointwise_source", "row_source"]


def candidate(spec: TaskSpec, knobs: HelionKnobs | HelionRowKnobs, low: Any = None) -> Candidate:
    """A helion Candidate for these knobs; `low`: the task's pointwise or row lowering when the caller has it."""
    if isinstance(knobs, HelionKnobs):
        return Candidate(HELION.name, pointwise_source(spec, knobs, low))
    return Candidate(HELION.name, row_source(spec, knobs, low))


def pointwise_source(spec: TaskSpec, knobs: HelionKnobs, low: pointwise.Lowered | None = None) -> str:
    """The Helion module of a pointwise task with these knobs; NotMine if it is not pointwise."""
    low = low if low is not None else pointwise.lower(spec)
    if knobs.block & (knobs.block - 1) or knobs.block < 16:
        raise NotMine(f"block {knobs.block} is not a power of two of at least 16")
    lines = pointwise_lines(spec, low, HelionEmitter, partial(store, spread="i"))
    body = "".join(f"        {line}\n" for line in lines)
    return (f"{PRELUDE}\n# forge recipe: pointwise in Helion, {low.numel} elements, {knobs}\n\n\n"
            + decorator([knobs.block], knobs, wide_index(spec))
            + f"def forge_pointwise({signature(spec)}) -> None:\n"
            f"    for tile in hl.tile({low.numel}):\n        i = tile.index\n{body}\n\n"
            + launcher(spec, "forge_pointwise"))
