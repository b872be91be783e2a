"""Policies propose kernel candidates for a task: the base class every policy implements.

Interface (the base class `Policy`): `propose(spec, parent, feedback) -> list[payload]` gives new ideas
below a tree node (`parent` is None at the root: the eager baseline), and `render(spec, payload) -> Candidate`
turns an idea into source. `payload_of(spec, knobs) -> payload` turns the knobs stored for a candidate back
into its payload, so `forge optimize --resume` can rebuild a search tree (by default only JSON payloads can
be rebuilt; see forge.search.driver); `chosen`, `ready`, `repairable`, `observe`, `stop_reason`, `failure`,
`bind`, `until` and `close` are hooks that do nothing by default. The offline recipe policy (the default) is
forge.policy.recipes.policy; the language-model ones are in forge.policy.llm. A policy that records what it
does (an LLM policy's calls) is bound to a `CallStore`, which the run store implements (forge.store.Store):
policies never import the store.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

from forge.kernel import Candidate, Feedback, TaskSpec

log = logging.getLogger(__name__)


class CallStore(ABC):
    """Where an LLM policy keeps its calls, for the review, the cache and --replay (forge.store.Store)."""

    @abstractmethod
    def add_llm_call(self, run_id: str, **fields: Any) -> Any:
        """Record one call (provider, model, request_hash, prompt, response, tokens, latency_s, usd, status,
        task_id) of a run; returns the record, whose `id` names it."""

    @abstractmethod
    def find_llm_call(self, request_hash: str, *, status: str | tuple[str, ...] | None = "ok") -> Any:
        """The newest call with this request hash and status (one of these; None for any), or None; it has
        `response` and `status`."""

    @abstractmethod
    def llm_calls(self, run_id: str) -> list[Any]:
        """A run's calls, oldest first (each with `request_hash`, `response` and `status`); KeyError for an
        unknown run."""


class Policy(ABC):
    """What the search needs of a policy: `refusal`, `propose` and `render`; the other hooks do nothing unless
    a policy has something to do there (an LLM policy records its calls, learns from results, stops when
    its money is spent)."""

    name: str = ""
    # Whether its candidates may be tuned by their backend's own autotuner (Helion's; forge.search.tune): the
    # search then keeps time for that at the end of the tasks
    autotunes: bool = False

    @abstractmethod
    def refusal(self, spec: TaskSpec) -> str | None:
        """None if the policy can write kernels for the task, else why not."""

    @abstractmethod
    def propose(self, spec: TaskSpec, parent: Any, feedback: Feedback | None) -> list[Any]:
        """New candidate payloads below `parent` (None: the baseline); `feedback`: how `parent` did, and the
        task's statistics (forge.kernel.Feedback)."""

    @abstractmethod
    def render(self, spec: TaskSpec, payload: Any) -> Candidate:
        """The candidate for a payload."""

    def payload_of(self, spec: TaskSpec, knobs: dict[str, Any]) -> Any:
        """The payload stored as `knobs` (how --resume rebuilds a tree): by default a JSON payload stored as
        {"payload": ...}; ValueError when it cannot be rebuilt (the node is then never expanded)."""
        if set(knobs) == {"payload"}:
            return knobs["payload"]
        raise ValueError(f"not a stored payload: {knobs}")

    def chosen(self, spec: TaskSpec, payloads: list[Any]) -> None:
        """The payloads the search renders and evaluates next, before any `render`: a policy that pays per
        proposal (an LLM request) starts the work of these now, and only of these."""
        return None

    def ready(self, spec: TaskSpec, payloads: list[Any]) -> None:
        """Wait until the chosen payloads render without waiting (an LLM policy's answers have come).
        Important: the search calls it outside the lock the tasks probed at once share, so it must only wait,
        never change the policy's state. Nothing by default."""
        return None

    def repairable(self, spec: TaskSpec, payload: Any, res: Any) -> bool:
        """True if a failed node (its EvalResult `res`) is worth a repair turn now: the search then expands it
        on purpose, since UCT alone rarely comes back to a failed node. False by default."""
        return False

    def observe(self, spec: TaskSpec, payload: Any, cand: Candidate, res: Any) -> None:
        """A candidate's evaluation result (an EvalResult), for policies that learn from outcomes."""
        return None

    def stop_reason(self) -> str | None:
        """Why the search must stop now (an LLM budget spent), or None."""
        return None

    def failure(self) -> str | None:
        """Why the whole run cannot go on (an LLM policy's key holder is gone), or None; `stop_reason` then
        stops every task, and the run fails with this line. None by default."""
        return None

    def bind(self, store: CallStore, run_id: str) -> None:
        """Where the policy records what it does (the run store and the run); nothing by default."""
        return None

    def until(self, deadline: float) -> None:
        """The search ends at `deadline` (time.monotonic()): nothing the policy waits for may outlast it (an LLM
        policy's requests time out by then); nothing by default."""
        return None

    def close(self) -> None:
        """Release what the policy holds (threads, connections) when the search is over."""
        return None
