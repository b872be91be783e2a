"""forge optimize: profile -> search every task -> bundle the winners -> apply -> measure end to end."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from forge import artifact
from forge.dispatch import KernelArtifact, apply
from forge.endtoend import compare, interleaved_ms
from forge.evaluate import Evaluator
from forge.model_input import LoadedModel
from forge.policy import RecipePolicy
from forge.profile import profile_model
from forge.search import Budget, Progress, TaskOutcome, search
from forge.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimizeReport:
    """The result of a run, as the documented JSON has it."""

    run_id: str
    device: str
    policy: str
    eager_ms: float
    forge_ms: float
    outputs_match: bool
    max_rel_err: float
    applied: bool  # False: the patched model was not faster (or had no kernel), so forge returns eager
    patched_ms: float  # the patched model's measured time, applied or not
    tasks: tuple[TaskOutcome, ...]
    artifact: str
    cost: dict[str, float]

    @property
    def speedup(self) -> float:
        """Eager over forge, end to end."""
        return self.eager_ms / self.forge_ms if self.forge_ms else 0.0

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (docs/optimize-format.md)."""
        return {
            "run_id": self.run_id, "device": self.device, "policy": self.policy, "eager_ms": self.eager_ms,
            "forge_ms": self.forge_ms, "speedup": self.speedup, "outputs_match": self.outputs_match,
            "max_rel_err": self.max_rel_err, "applied": self.applied, "patched_ms": self.patched_ms,
            "artifact": self.artifact,
            "tasks": [{"key": t.key, "family": t.family, "share": t.share, "eager_us": t.eager_us,
                       "best_us": t.best_us, "speedup": t.speedup, "candidates": t.candidates, "status": t.status,
                       "stop_reason": t.stop_reason} for t in self.tasks],
            "cost": self.cost,
        }


def make_policy(name: str, device: str) -> RecipePolicy:
    """The policy named on the command line."""
    if name != "recipes":
        raise ValueError(f"unknown policy {name!r}: only 'recipes' exists so far (LLM policies come later)")
    return RecipePolicy(device)


def optimize(loaded: LoadedModel, store: Store, *, policy: str = "recipes", budget: Budget | None = None,
             runs_dir: str | Path = "runs", progress: Progress | None = None) -> OptimizeReport:
    """The whole job; every candidate and evaluation is stored as it happens."""
    start = time.monotonic()
    budget = budget or Budget()
    pol = make_policy(policy, loaded.device)
    prof, _ = profile_model(loaded, budget_s=1.0)
    run = store.create_run(loaded.name, device=loaded.device, dtype=loaded.dtype, policy=pol.name,
                           config={"budget": vars(budget)})
    with Evaluator(loaded.device) as ev:
        outcomes = search(list(prof.tasks), pol, ev, store, run.id, budget, progress)
    by_key = {t.key: t for t in prof.tasks}
    kernels = [KernelArtifact(o.key, o.best.backend, o.library, o.best.entry, by_key[o.key].inputs,
                              by_key[o.key].outputs, by_key[o.key].source)
               for o in outcomes if o.best is not None and o.library]
    folder = Path(runs_dir) / run.id
    artifact.save(folder, kernels, {"run_id": run.id, "model": loaded.name, "device": loaded.device,
                                    "dtype": loaded.dtype})
    opt = apply(loaded.model, loaded.inputs, kernels)
    eager_ms, forge_ms = interleaved_ms(lambda: loaded.model(*loaded.inputs), lambda: opt(*loaded.inputs),
                                        loaded.device)
    fresh = [torch.randn_like(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
             for x in loaded.inputs]
    with torch.no_grad():
        match, err = compare(loaded.model(*fresh), opt(*fresh))
    patched_ms = forge_ms
    applied = bool(kernels) and match and forge_ms < eager_ms
    if not applied:  # never slower: the model you get is eager, and so is its time
        forge_ms = eager_ms
        artifact.save(folder, [], {"run_id": run.id, "model": loaded.name, "device": loaded.device,
                                   "dtype": loaded.dtype, "note": f"not applied: patched model took "
                                   f"{patched_ms:.3f} ms against eager {eager_ms:.3f} ms"})
    store.update_run(run.id, state="done", eager_ms=eager_ms, forge_ms=forge_ms)
    cost = store.run_cost(run.id)
    return OptimizeReport(run.id, loaded.device, pol.name, eager_ms, forge_ms, match, err, applied, patched_ms,
                          tuple(outcomes),
                          str(folder), {"usd": cost.usd, "tokens_in": cost.tokens_in, "tokens_out": cost.tokens_out,
                                        "device_seconds": cost.device_seconds,
                                        "wall_seconds": time.monotonic() - start})
