"""The kernels the user's own runs found: each stored task's best verified kernel, with its speedup and a
link to its search tree in `forge ui`. Read from the store through forge.review.data (only the store
module knows SQLAlchemy)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from forge.tasks.ops import FAMILIES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    """One run's best kernel for one task."""

    run_id: str
    model: str
    task_id: int
    task: str
    family: str
    backend: str
    speedup: float | None
    tree_url: str  # the task's page in forge ui


def found_kernels(store: Any, ui_url: str, limit: int = 200) -> list[Found]:
    """Every stored task's best kernel that passed (newest runs first), at most `limit`."""
    from forge.review.data import task_view

    out: list[Found] = []
    for run in store.list_runs():
        for task in store.get_tasks(run.id):
            best = task_view(store, task).best_node
            if best is None or best.baseline or best.status != "ok":
                continue
            family = task.family if task.family in FAMILIES else "other"
            out.append(Found(run.id, run.model, task.id, task.key, family, best.cand.backend, best.speedup,
                             f"{ui_url.rstrip('/')}/runs/{run.id}/tasks/{task.id}"))
            if len(out) >= limit:
                return out
    return out
