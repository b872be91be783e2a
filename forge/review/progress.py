"""Best speedup so far: per task against candidates tried, and for the whole run against wall time.

The curves follow what the search decided, not the single highest number it saw. During the search a task's
best is the passing candidate of the smallest median (forge.search.driver counts it so), shown with its own
speedup (its eager over its median, timed alongside it), from the candidate's first evaluation: so the curve
can fall when a faster candidate was timed against a faster eager. When the task is decided (its meta has
`verdict` and `best_node`, after its fastest candidates were timed again, forge.search.confirm), the curve's
last point is the decided speedup: the best node's latest evaluation, which is the task's speedup (so too when
nodes were timed again but the decision is not stored yet). Re-timings (stored as further evaluations of a
node) are not new candidates: a node counts once, where it was first evaluated.

Against wall time, each task steps at each of its candidates' first evaluations and at its decision (the
time of its last evaluation). The whole-model line is an estimate from the profile: a task of share `s` whose
kernel ships at speedup `x` saves `s * (1 - 1/x)` of the profiled model time, so the model's speedup is
`1 / (1 - sum of savings)`; a task ships when its verdict is "improved" or, undecided, at `IMPROVED` or more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from forge.store import EvaluationRecord

IMPROVED = 1.05  # the search ships a task's winner only when best < eager / 1.05
MODEL = "whole model (estimate)"


@dataclass(frozen=True)
class Progress:
    """A task's best speedup so far."""

    curve: tuple[float | None, ...]  # after each candidate, in the order first evaluated; the last is decided
    decided: bool  # the search decided (the last point is the decision)
    steps: tuple[tuple[datetime, float | None], ...]  # (when, best so far): first evaluations, then the decision
    improved: bool | None  # the verdict ships the winner (None while undecided)


def _decided(meta: Mapping[str, Any]) -> bool:
    return isinstance(meta.get("verdict"), str) and "best_node" in meta


def task_progress(history: Mapping[int, Sequence[EvaluationRecord]], best_id: int | None,
                  meta: Mapping[str, Any]) -> Progress:
    """The best-so-far curve of a task from each node's evaluations (in id order), its best node (the task's
    speedup is that node's latest evaluation's) and the task's meta."""
    firsts = sorted((evs[0] for evs in history.values() if evs), key=lambda e: e.id)
    best: EvaluationRecord | None = None
    curve: list[float | None] = []
    steps: list[tuple[datetime, float | None]] = []
    for e in firsts:
        if e.status == "ok" and e.time_us_median and (best is None or e.time_us_median < (best.time_us_median or 0)):
            best = e
        value = best.speedup if best is not None else None
        curve.append(value)
        steps.append((e.created_at, value))
    decided, again = _decided(meta), any(len(evs) > 1 for evs in history.values())
    if not firsts or not (decided or again):  # no re-timing: the task's best is the last point already
        return Progress(tuple(curve), False, tuple(steps), None)
    latest = history.get(best_id, [])[-1:] if best_id is not None else []
    value = latest[0].speedup if latest and latest[0].status == "ok" else None
    curve[-1] = value  # after the re-timings (and the decision): the task's speedup
    steps.append((max(e.created_at for evs in history.values() for e in evs), value))
    return Progress(tuple(curve), decided, tuple(steps), meta["verdict"] == "improved" if decided else None)


def shipped(value: float | None, improved: bool | None) -> float:
    """The speedup a task's kernel brings to the model: `value` where it ships (the verdict says so, or while
    undecided `value` is at least `IMPROVED`), else 1 (forge keeps eager)."""
    if value is None:
        return 1.0
    return value if (improved if improved is not None else value >= IMPROVED) else 1.0


def run_series(tasks: Sequence[tuple[str, float, Progress]], start: datetime
               ) -> list[tuple[str, list[tuple[float, float | None]]]]:
    """Per task (key, share, progress) its best so far against seconds since `start`, and the whole model's
    estimate (`MODEL`, last: the tasks keep the colours of the curves against candidates) at every step."""
    events = sorted(((at, i, v, k == len(p.steps) - 1) for i, (_, _, p) in enumerate(tasks)
                     for k, (at, v) in enumerate(p.steps)), key=lambda ev: ev[0])
    per_task: list[list[tuple[float, float | None]]] = [[] for _ in tasks]
    current: list[float] = [1.0] * len(tasks)
    model: list[tuple[float, float | None]] = []
    for at, i, value, final in events:
        secs = max(0.0, (at - start).total_seconds())
        per_task[i].append((secs, value))
        p = tasks[i][2]
        current[i] = shipped(value, p.improved if final and p.decided else None)
        saved = sum(share * (1.0 - 1.0 / x) for (_, share, _), x in zip(tasks, current, strict=True))
        model.append((secs, 1.0 / (1.0 - saved) if saved < 1.0 else None))
    out = [(key, pts) for (key, _, _), pts in zip(tasks, per_task, strict=True) if pts]
    return out + ([(MODEL, model)] if model else [])
