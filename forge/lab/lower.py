"""An entry's function at given inputs, as forge sees it: captured, cut into tasks, and the recipe policy's
first kernels for it (its root's schedules, in its order; forge.lab.service judges them and keeps the fastest
that verifies) when there is one task the recipes write. Nothing here runs a kernel."""

from __future__ import annotations

import dataclasses
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
IDEAS = 4  # the policy's first proposals the lab judges: its default schedule and the next few


@dataclass(frozen=True)
class Lowered:
    """The entry as one forge task with its recipe kernels, or the reason it runs through the vendor path."""

    spec: TaskSpec | None  # the task, when the function is one
    order: tuple[int, ...]  # the entry input each task input is
    candidates: tuple[Candidate, ...]  # the policy's first kernels, its default schedule first; (): vendor path
    why: str  # why there is no forge kernel ("" when there is)
    family: str = ""  # forge's family of the task
    knobs: tuple[str, ...] = ()  # each candidate's schedule, as the policy names it

    @property
    def forge(self) -> bool:
        """True when forge writes the kernel."""
        return bool(self.candidates)


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


def lower(fn: Callable[..., Any], inputs: list[torch.Tensor], p: float, device: str = "cpu",
          ideas: int = IDEAS) -> Lowered:
    """The function at these inputs lowered with the policy's first `ideas` kernels (see Lowered); every
    failure is a vendor-path reason."""
    try:
        graph = capture(_module(fn, p, len(inputs)), inputs).graph_module.graph
    except UserError as e:
        return Lowered(None, (), (), f"forge cannot capture it ({e})")
    regions = cut(graph)
    if len(regions) != 1:
        return Lowered(None, (), (), f"it captures to {len(regions)} tasks, not one")
    try:
        r = region_source(regions[0])
    except ValueError as e:
        return Lowered(None, (), (), f"its task cannot be rendered ({e})")
    names = [f"x{i}" for i in range(len(inputs))]
    if any(n not in names for n in r.input_nodes):
        return Lowered(None, (), (), "its task reads constants of the graph")
    spec = TaskSpec(r.key, r.source, r.inputs, r.outputs, sum(m.nbytes for m in r.inputs + r.outputs))
    order = tuple(names.index(n) for n in r.input_nodes)
    policy = RecipePolicy(device)  # a new one each time: a policy proposes nothing twice, and keeps what it wrote
    why = policy.refusal(spec)
    if why is not None:
        return Lowered(spec, order, (), f"no recipe for its task: {why}", r.family)
    first = (policy.propose(spec, None) or [])[:ideas]
    if not first:
        return Lowered(spec, order, (), "the recipe policy proposed no kernel", r.family)
    return Lowered(spec, order, tuple(policy.render(spec, k) for k in first), "", r.family,
                   tuple(_knobs(k) for k in first))


def _knobs(knobs: Any) -> str:
    """A schedule as k=v pairs (the knobs dataclass's fields)."""
    return " ".join(f"{f.name}={getattr(knobs, f.name)}" for f in dataclasses.fields(knobs))
