"""What the search records and what a resumed search reads back, as an interface (forge.store implements it).

The search (forge.search.driver) knows nothing of tables: it hands a Recorder its tasks, each node it evaluated
with the result, its allocation decisions and its stop reasons, and on --resume reads back the rows it
wrote, as the EvalResults they were (its datetimes timezone-aware). forge.store.recorder.StoreRecorder keeps
them in the run store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from forge.kernel import Candidate, EvalResult

if TYPE_CHECKING:
    from forge.tasks.cut import Task


@dataclass(frozen=True)
class TaskRow:
    """A recorded task, as the search needs it."""

    id: int
    key: str
    ms: float | None
    share: float | None
    state: str  # "pending", "running", "done"
    stop_reason: str | None
    meta: dict[str, Any]


@dataclass(frozen=True)
class NodeRow:
    """A recorded node of a task's tree, with its last evaluation (None: recorded, never evaluated)."""

    id: int
    parent_id: int | None
    backend: str
    source: str
    entry: str
    knobs: dict[str, Any]
    reward: float | None
    result: EvalResult | None
    evaluated_at: datetime | None


class Recorder(ABC):
    """One run's record of the search."""

    @abstractmethod
    def tasks(self) -> list[TaskRow]:
        """The run's recorded tasks (for --resume)."""

    @abstractmethod
    def add_task(self, task: Task) -> TaskRow:
        """Record a task of the run; its row."""

    @abstractmethod
    def update_task(self, task_id: int, **fields: Any) -> None:
        """Change a task's state, stop_reason or meta (the allocation decisions, kept for --resume)."""

    @abstractmethod
    def started(self, task_id: int, source: str) -> int:
        """Record the root of a task's tree (its eager reference) and that the task runs; the root's id."""

    @abstractmethod
    def evaluated(self, task_id: int, parent_id: int | None, cand: Candidate, knobs: dict[str, Any], origin: str,
                  res: EvalResult, reward: float | None) -> int:
        """Record one evaluated node (the candidate, its result, the LLM calls it came from); its id."""

    @abstractmethod
    def retimed(self, node_id: int, res: EvalResult) -> None:
        """Record a recorded node's new timing (forge.search.confirm): its latest evaluation."""

    @abstractmethod
    def nodes(self, task_id: int) -> list[NodeRow]:
        """A task's recorded nodes, parents before children (for --resume)."""

    @abstractmethod
    def created_at(self) -> datetime:
        """When the run began (a resumed run counts the time it already searched)."""
