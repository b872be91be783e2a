"""Recipes for NVIDIA GPUs: the pointwise and row-reduction lowerings emitted as CUDA C++.

The graph is lowered exactly as for the CPU (forge.policy.recipes.pointwise / rowreduce: symbolic indices,
the same C expressions); only the loop structure differs.

- Pointwise: each thread takes `vec` consecutive elements of the unit-stride inner block; inputs read
  at unit stride are loaded as one vector (16 bytes for bf16 x 8), the rest element by element; the
  outputs are stored as vectors. A grid-stride loop covers the tensor (`blocks` caps the grid). A
  launch with a pointer that is not aligned to the vector falls back to the same kernel with vec = 1.
- Channels-last GroupNorm (forge.policy.recipes.cuda_nhwc): tiles of positions with all their channels, three
  passes (statistics, their combination per group, the normalization), every access coalesced.
- Rows: a thread block (or a cluster of `cluster` blocks, Hopper's distributed shared memory) per row.
  Each thread keeps its elements of the reduced input in registers, so the row is read from memory
  once; statistics are reduced with warp shuffles, shared memory and, across a cluster, DSMEM. The
  variance is the exact two-pass one over the registers. Rows longer than the registers can hold are
  re-read in pass 2 (`cache=False`), which a cluster keeps in L2.

Builds include only forge_abi.h and this file's prelude: no cuda_bf16.h (it costs ~0.4 s a build).
"""

from __future__ import annotations

import logging
from typing import Any

from forge.backends import CUDA
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes import cuda_nhwc
from forge.policy.recipes.cuda_common import PRELUDE, CudaKnobs, CudaRowKnobs
from forge.policy.recipes.cuda_pointwise import pointwise_source
from forge.policy.recipes.cuda_rows import row_source
from forge.policy.recipes.emit import NotMine

log = logging.getLogger(__name__)

__all__ = ["PRELUDE", "CudaKnobs", "CudaRowKnobs", "candidate", "pointwise_source", "row_source"]


def candidate(spec: TaskSpec, knobs: CudaKnobs | CudaRowKnobs, low: Any = None) -> Candidate:
    """A cuda Candidate for these knobs (fast math: also nvcc's approximate division and square root);
    `low`: the task's pointwise or row lowering when the caller has it already."""
    if isinstance(knobs, CudaKnobs):
        src = pointwise_source(spec, knobs, low)
    else:
        src = None
        if cuda_nhwc.applies(spec):  # a GroupNorm over channels-last activations: its own schedule
            try:
                src = cuda_nhwc.nhwc_norm_source(spec, knobs, low)
            except NotMine as e:  # not one it takes (an input read across channels, say): the row schedule
                log.debug("no NHWC schedule for %s: %s", spec.key, e)
        src = src or row_source(spec, knobs, low)
    return Candidate(CUDA.name, src, flags=CUDA.fast_math if knobs.fast_math else CUDA.exact_math)
