"""The mixed policy `recipes+PROVIDER:MODEL`: recipes seed the tree and tune LLM kernels' knobs; the LLM
expands from the recipes' best. Important: an LLM request is only sent for an idea the search chose to
evaluate (`chosen`), so no answer is paid for and left unevaluated."""

from __future__ import annotations

import itertools
from typing import Any

from forge.kernel import Candidate, EvalResult, Feedback, TaskSpec
from forge.policy.base import CallStore, Policy
from forge.policy.llm.policy import Idea, LLMPolicy
from forge.policy.recipes.policy import RecipePolicy


class MixedPolicy(Policy):
    """Recipes seed the tree and tune LLM kernels' knobs; the LLM expands from the recipes' best."""

    def __init__(self, recipes: RecipePolicy, llm: LLMPolicy) -> None:
        self.recipes = recipes
        self.llm = llm
        self.name = f"recipes+{llm.name}"
        self.autotunes = recipes.autotunes
        self._seen: dict[tuple[str, Any], tuple[Candidate, EvalResult]] = {}
        self._seeded: set[tuple[str, Any]] = set()

    def bind(self, store: CallStore, run_id: str) -> None:
        """See LLMPolicy.bind."""
        self.llm.bind(store, run_id)

    def stop_reason(self) -> str | None:
        """See LLMPolicy.stop_reason."""
        return self.llm.stop_reason()

    def failure(self) -> str | None:
        """See LLMPolicy.failure."""
        return self.llm.failure()

    def until(self, deadline: float) -> None:
        """See LLMPolicy.until."""
        self.llm.until(deadline)

    def close(self) -> None:
        """See LLMPolicy.close."""
        self.llm.close()

    def refusal(self, spec: TaskSpec) -> str | None:
        """Mine if either policy's."""
        a, b = self.recipes.refusal(spec), self.llm.refusal(spec)
        return None if a is None or b is None else f"{a}; {b}"

    def propose(self, spec: TaskSpec, parent: Any, feedback: Feedback | None = None) -> list[Any]:
        """Root: recipe schedules interleaved with first attempts; below the recipes' best: LLM optimize."""
        if isinstance(parent, Idea):
            return self.llm.propose(spec, parent, feedback)
        self.llm.told(spec, feedback)
        if self.llm.stop_reason():
            return []
        ours = self.recipes.propose(spec, parent, feedback) if self.recipes.refusal(spec) is None else []
        if parent is None:
            theirs = self.llm.propose(spec, None, feedback)
            return [p for pair in itertools.zip_longest(ours, theirs) for p in pair if p is not None]
        key = (spec.key, parent)
        if key in self._seen and key not in self._seeded and parent == self._best_recipe(spec):
            self._seeded.add(key)
            ours = self.llm.seeded(spec, *self._seen[key]) + ours
        return ours

    def _best_recipe(self, spec: TaskSpec) -> Any:
        """The fastest passing recipe node of the task (among those seen), or None."""
        timed = {p: r.timing.median_us for (k, p), (_, r) in self._seen.items()
                 if k == spec.key and r.status.passed and r.timing}
        return min(timed, key=timed.__getitem__) if timed else None

    def chosen(self, spec: TaskSpec, payloads: list[Any]) -> None:
        """The LLM's chosen ideas are sent now; recipes need nothing."""
        self.llm.chosen(spec, [p for p in payloads if isinstance(p, Idea)])

    def ready(self, spec: TaskSpec, payloads: list[Any]) -> None:
        """The LLM's chosen ideas are awaited; recipes render at once."""
        self.llm.ready(spec, [p for p in payloads if isinstance(p, Idea)])

    def repairable(self, spec: TaskSpec, payload: Any, res: Any) -> bool:
        """LLM nodes, as the LLM policy says; recipe nodes are not repaired."""
        return isinstance(payload, Idea) and self.llm.repairable(spec, payload, res)

    def payload_of(self, spec: TaskSpec, knobs: dict[str, Any]) -> Any:
        """For --resume: recipe nodes come back; LLM nodes keep their stored source (ValueError)."""
        if {"id", "kind"} <= set(knobs):
            raise ValueError("an LLM node is not re-created on resume")
        return self.recipes.payload_of(spec, knobs)

    def render(self, spec: TaskSpec, payload: Any) -> Candidate:
        """From whichever policy proposed it."""
        return self.llm.render(spec, payload) if isinstance(payload, Idea) else self.recipes.render(spec, payload)

    def observe(self, spec: TaskSpec, payload: Any, cand: Candidate, res: EvalResult) -> None:
        """Both kinds go into the LLM's lineage; recipe nodes are remembered for seeding."""
        self.llm.observe(spec, payload, cand, res)
        if not isinstance(payload, Idea):
            self._seen[(spec.key, payload)] = (cand, res)
