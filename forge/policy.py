"""Policies propose kernel candidates for a task. The offline recipe policy is the default.

Interface: `propose(spec, parent, feedback) -> list[payload]` gives new ideas below a tree node
(`parent` is None at the root: the eager baseline), and `render(spec, payload) -> Candidate` turns an
idea into source. The recipe policy's payloads are schedule knobs of a code generator
(forge.recipes): the root gets a few diverse schedules, a node gets its one-knob mutations. For
tasks no recipe can express (matmul, convolution, gathers) it says "not mine": no proposals.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from forge.kernel import Candidate, TaskSpec
from forge.recipes import pointwise, rowreduce
from forge.recipes.pointwise import NotMine

log = logging.getLogger(__name__)


class Policy(Protocol):
    """What the search needs of a policy."""

    name: str

    def mine(self, spec: TaskSpec) -> str | None:
        """None if the policy can write kernels for the task, else why not."""
        ...

    def propose(self, spec: TaskSpec, parent: Any, feedback: str) -> list[Any]:
        """New candidate payloads below `parent` (None: the baseline)."""
        ...

    def render(self, spec: TaskSpec, payload: Any) -> Candidate:
        """The candidate for a payload."""
        ...


# Values each knob may take; the first is the default.
_SPACES: dict[type, dict[str, tuple[Any, ...]]] = {
    pointwise.Knobs: {"chunk": (0, 4096, 65536), "simd": (True, False), "unroll": (1, 4, 16),
                      "fast_math": (False, True)},
    rowreduce.RowKnobs: {"online": (True, False), "welford": (False, True), "simd": (True, False),
                         "chunk": (0, 1, 8), "fast_math": (False, True)},
}


@dataclass
class _Lowered:
    kind: str  # "pointwise" | "rows"
    low: Any


class RecipePolicy:
    """Offline code generation from the task's graph, exploring the generator's schedule knobs."""

    name = "recipes"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._lowered: dict[str, _Lowered | NotMine] = {}
        self._proposed: dict[str, set[Any]] = {}

    def lowered(self, spec: TaskSpec) -> _Lowered:
        """The task lowered by the first recipe that takes it; raises NotMine with every reason."""
        if spec.key not in self._lowered:
            reasons = []
            for kind, mod in (("pointwise", pointwise), ("rows", rowreduce)):
                try:
                    self._lowered[spec.key] = _Lowered(kind, mod.lower(spec))
                    break
                except NotMine as e:
                    reasons.append(f"{kind}: {e}")
            else:
                self._lowered[spec.key] = NotMine("; ".join(reasons))
        got = self._lowered[spec.key]
        if isinstance(got, NotMine):
            raise got
        return got

    def mine(self, spec: TaskSpec) -> str | None:
        """None if a recipe can express the task, else why not."""
        if self.device != "cpu":
            return "the recipe policy writes C for the CPU; CUDA recipes come with the GPU issue"
        try:
            self.lowered(spec)
        except NotMine as e:
            return str(e)
        return None

    def propose(self, spec: TaskSpec, parent: Any, feedback: str = "") -> list[Any]:
        """Root: the default schedule and a few diverse ones; a node: its one-knob mutations."""
        if self.mine(spec) is not None:
            return []
        kind = self.lowered(spec).kind
        cls = pointwise.Knobs if kind == "pointwise" else rowreduce.RowKnobs
        space = _SPACES[cls]
        seen = self._proposed.setdefault(spec.key, set())
        if parent is None:
            combos = list(itertools.product(*space.values()))
            picks = [combos[0]] + combos[1::max(1, len(combos) // 5)]
            ideas = [cls(**dict(zip(space, c, strict=True))) for c in picks]
        else:
            ideas = [dataclasses.replace(parent, **{k: v}) for k, vals in space.items() for v in vals
                     if getattr(parent, k) != v]
        fresh = [i for i in dict.fromkeys(ideas) if i not in seen]
        seen.update(fresh)
        return fresh

    def render(self, spec: TaskSpec, payload: Any) -> Candidate:
        """The C source for these knobs."""
        low = self.lowered(spec)
        if low.kind == "pointwise":
            return pointwise.candidate(low.low, payload)
        return rowreduce.candidate(low.low, payload)
