"""Plain frozen dataclasses returned by the run store, so no caller ever sees an ORM object."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from forge.backends import NAMES

RUN_STATES: tuple[str, ...] = ("running", "done", "failed", "stopped")
BACKENDS: tuple[str, ...] = (*NAMES, "eager")  # eager: a task's root node (the reference)


@dataclass(frozen=True)
class RunRecord:
    """One forge run: a model, a device, a search policy and its outcome."""

    id: str
    created_at: datetime
    finished_at: datetime | None
    model: str
    device: str
    dtype: str
    policy: str
    state: str
    config: dict[str, Any]
    eager_ms: float | None
    forge_ms: float | None
    note: str


@dataclass(frozen=True)
class TaskRecord:
    """One kernel task of a run (a structurally distinct subgraph to make faster)."""

    id: int
    run_id: str
    key: str
    family: str
    count: int
    ms: float | None
    share: float | None
    source: str
    meta: dict[str, Any]
    state: str
    stop_reason: str | None


@dataclass(frozen=True)
class CandidateRecord:
    """One node of a task's search tree: a kernel source plus its MCTS statistics."""

    id: int
    task_id: int
    parent_id: int | None
    backend: str
    source: str
    entry: str
    knobs: dict[str, Any]
    origin: str
    created_at: datetime
    status: str
    visits: int
    reward: float | None


@dataclass(frozen=True)
class EvaluationRecord:
    """One build + verify + timing of a candidate on a device."""

    id: int
    candidate_id: int
    status: str
    message: str
    build_log: str
    verify: dict[str, Any]
    time_us_median: float | None
    time_us_spread: dict[str, Any]
    baseline_us_median: float | None
    device: str
    device_seconds: float
    created_at: datetime

    @property
    def speedup(self) -> float | None:
        """Baseline median over candidate median, or None when either is missing."""
        if not self.time_us_median or self.baseline_us_median is None:
            return None
        return self.baseline_us_median / self.time_us_median


@dataclass(frozen=True)
class LLMCallRecord:
    """One request to a language model, with its cost; also the response cache entry."""

    id: int
    run_id: str
    task_id: int | None
    candidate_id: int | None
    provider: str
    model: str
    request_hash: str
    prompt: str
    response: str
    tokens_in: int
    tokens_out: int
    latency_s: float
    usd: float
    status: str
    created_at: datetime


@dataclass(frozen=True)
class RunCost:
    """What a run spent: LLM money and tokens, and device time on evaluations."""

    usd: float
    tokens_in: int
    tokens_out: int
    device_seconds: float
    llm_calls: int
    evaluations: int
