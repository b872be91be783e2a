"""The search: for each task, an MCTS over a policy's candidates, judged by the evaluator, stored as it goes.

Tasks are taken by share of model time; each gets a share of the candidate budget. A task stops when
it reaches its roofline floor, stops improving (`patience` candidates without a better time), runs out
of candidates or time, or when the policy has nothing for it ("not mine"). Every candidate and every
evaluation is written to the store the moment it exists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge.build import build
from forge.evaluate import Evaluator, evaluation_fields
from forge.kernel import Candidate, EvalResult, TaskSpec
from forge.mcts import MCTS, Node, reward_of
from forge.policy import Policy
from forge.store import Store
from forge.tasks import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """Limits of one optimize run."""

    candidates: int = 48  # over all tasks
    per_task: int = 16
    min_per_task: int = 4
    seconds: float = 600.0  # wall time over all tasks
    patience: int = 8  # candidates without improvement before a task stops
    parallel: int = 4  # candidates selected (and built) at once
    min_share: float = 0.01  # tasks below this share of model time are not searched


@dataclass(frozen=True)
class TaskOutcome:
    """What the search found for one task."""

    key: str
    family: str
    share: float
    eager_us: float | None
    best_us: float | None
    candidates: int
    status: str  # "improved" | "no gain" | "not mine" | "skipped"
    stop_reason: str
    best: Candidate | None = None
    library: str | None = None  # the built winner

    @property
    def speedup(self) -> float | None:
        """Eager over best, when both were measured."""
        return self.eager_us / self.best_us if self.eager_us and self.best_us else None


Progress = Callable[[str, int, float | None], None]  # (task key, candidates so far, best speedup)


def search_task(task: Task, policy: Policy, ev: Evaluator, store: Store, run_id: str, n_candidates: int,
                deadline: float, budget: Budget, progress: Progress | None = None) -> TaskOutcome:
    """MCTS for one task until a stop condition; see the module docstring."""
    spec = TaskSpec.of(task)
    share = task.share or 0.0
    rec = store.add_task(run_id, task.key, family=task.family, count=task.count, ms=task.ms, share=task.share,
                         source=task.source, meta={"ops": list(task.ops)}, state="running")
    why_not = policy.mine(spec)
    if why_not is not None:
        store.update_task(rec.id, state="done", stop_reason=f"not mine: {why_not}")
        return TaskOutcome(task.key, task.family, share, None, None, 0, "not mine", f"not mine: {why_not}")
    root = store.add_candidate(rec.id, None, backend="eager", source=task.source, origin="baseline", status="ok")
    db_id: dict[int, int] = {0: root.id}
    tree = MCTS(lambda node: policy.propose(spec, node.payload, ""))
    best: tuple[float, Candidate, Node] | None = None
    eager_us: float | None = None
    floor_us: float | None = None
    tried, since_best, stop = 0, 0, "budget"
    while True:
        if tried >= n_candidates:
            stop = f"budget ({n_candidates} candidates)"
            break
        if time.monotonic() > deadline:
            stop = "time"
            break
        nodes = [n for n in (tree.select() for _ in range(min(budget.parallel, n_candidates - tried))) if n]
        if not nodes:
            stop = "exhausted (no more ideas)"
            break
        cands = [policy.render(spec, n.payload) for n in nodes]
        for node, cand, res in zip(nodes, cands, ev.evaluate_many(spec, cands, seed=tried), strict=True):
            tried += 1
            speedup = res.speedup if res.status.passed else None
            tree.report(node, reward_of(speedup))
            _record(store, rec.id, db_id, node, cand, res, policy.name)
            floor_us = res.floor_us or floor_us
            if res.baseline:
                eager_us = res.baseline.median_us if eager_us is None else min(eager_us, res.baseline.median_us)
            if res.status.passed and res.timing and (best is None or res.timing.median_us < best[0]):
                best, since_best = (res.timing.median_us, cand, node), 0
            else:
                since_best += 1
        if progress:
            progress(task.key, tried, eager_us / best[0] if best and eager_us else None)
        if best and floor_us and best[0] <= 1.1 * floor_us:
            stop = "reached the roofline floor"
            break
        if since_best >= budget.patience:
            stop = f"no improvement in {budget.patience} candidates"
            break
    gain = best is not None and eager_us is not None and best[0] < eager_us / 1.05
    library = build(best[1], ev.arch).path if gain and best else None
    status = "improved" if gain else "no gain"
    store.update_task(rec.id, state="done", stop_reason=stop)
    return TaskOutcome(task.key, task.family, share, eager_us, best[0] if best else None, tried, status, stop,
                       best[1] if gain and best else None, library)


def _record(store: Store, task_id: int, db_id: dict[int, int], node: Node, cand: Candidate, res: EvalResult,
            origin: str) -> None:
    parent = db_id[node.parent.id] if node.parent is not None else None
    row = store.add_candidate(task_id, parent, backend=cand.backend, source=cand.source, entry=cand.entry,
                              knobs=_knobs(node.payload), origin=origin, status=res.status.value, visits=1,
                              reward=node.reward)
    db_id[node.id] = row.id
    store.add_evaluation(row.id, **evaluation_fields(res))


def _knobs(payload: Any) -> dict[str, Any]:
    return dict(vars(payload)) if hasattr(payload, "__dataclass_fields__") else {"payload": repr(payload)}


def search(tasks: list[Task], policy: Policy, ev: Evaluator, store: Store, run_id: str, budget: Budget,
           progress: Progress | None = None) -> list[TaskOutcome]:
    """Search every task worth it, biggest share first, within the budget."""
    deadline = time.monotonic() + budget.seconds
    ranked = sorted(tasks, key=lambda t: -(t.share or 0.0))
    eligible = [t for t in ranked if (t.share or 0.0) >= budget.min_share]
    total_share = sum(t.share or 0.0 for t in eligible) or 1.0
    left = budget.candidates
    out = []
    for t in ranked:
        if t not in eligible or left <= 0:
            why = "share below --min-share" if t not in eligible else "run budget spent"
            out.append(TaskOutcome(t.key, t.family, t.share or 0.0, None, None, 0, "skipped", why))
            continue
        n = max(budget.min_per_task, min(budget.per_task, round(budget.candidates * (t.share or 0) / total_share)))
        n = min(n, left)
        outcome = search_task(t, policy, ev, store, run_id, n, deadline, budget, progress)
        left -= outcome.candidates
        out.append(outcome)
    return out
