"""An entry's function at given inputs, as forge sees it: captured, cut into tasks, and the recipe policy's
kernel for it when there is one task the recipes write. Nothing here runs a kernel."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from forge.capture.export import capture
from forge.errors import UserError
from forge.kernel import Candidate, TaskSpec
from forge.policy.recipes.policy import RecipePolicy
from forge.tasks.cut import region_source
from forge.tasks.regions import cut

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lowered:
    """The entry as one forge task with its recipe kernel, or the reason it runs through the vendor path."""

    spec: TaskSpec | None  # the task, when the function is one
    order: tuple[int, ...]  # the entry input each task input is
    candidate: Candidate | None  # the recipe policy's first kernel (its default schedule); None: vendor path
    why: str  # why there is no forge kernel ("" when there is)
    family: str = ""  # forge's family of the task
    knobs: str = ""  # the schedule, as the policy names it

    @property
    def forge(self) -> bool:
        """True when forge writes the kernel."""
        return self.candidate is not None


def _module(fn: Callable[..., Any], p: float, arity: int) -> torch.nn.Module:
    """A module whose forward is the entry's function with its parameter as a literal (export names its
    inputs x0, x1, ...)."""

    class One(torch.nn.Module):
        def forward(self, x0: torch.Tensor) -> Any:
            return fn(x0, p=p)

    class Two(torch.nn.Module):
        def forward(self, x0: torch.Tensor, x1: torch.Tensor) -> Any:
            return fn(x0, x1, p=p)

    class Three(torch.nn.Module):
        def forward(self, x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor) -> Any:
            return fn(x0, x1, x2, p=p)

    return {1: One, 2: Two, 3: Three}[arity]()


def lower(fn: Callable[..., Any], inputs: list[torch.Tensor], p: float, policy: RecipePolicy) -> Lowered:
    """The function at these inputs lowered (see Lowered); every failure is a vendor-path reason."""
    try:
        graph = capture(_module(fn, p, len(inputs)), inputs).graph_module.graph
    except UserError as e:
        return Lowered(None, (), None, f"forge cannot capture it ({e})")
    regions = cut(graph)
    if len(regions) != 1:
        return Lowered(None, (), None, f"it captures to {len(regions)} tasks, not one")
    try:
        r = region_source(regions[0])
    except ValueError as e:
        return Lowered(None, (), None, f"its task cannot be rendered ({e})")
    names = [f"x{i}" for i in range(len(inputs))]
    if any(n not in names for n in r.input_nodes):
        return Lowered(None, (), None, "its task reads constants of the graph")
    spec = TaskSpec(r.key, r.source, r.inputs, r.outputs, sum(m.nbytes for m in r.inputs + r.outputs))
    order = tuple(names.index(n) for n in r.input_nodes)
    why = policy.refusal(spec)
    if why is not None:
        return Lowered(spec, order, None, f"no recipe for its task: {why}", r.family)
    ideas = policy.propose(spec, None) or []
    if not ideas:
        return Lowered(spec, order, None, "the recipe policy proposed no kernel", r.family)
    return Lowered(spec, order, policy.render(spec, ideas[0]), "", r.family, repr(ideas[0]))
