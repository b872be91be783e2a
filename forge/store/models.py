"""SQLAlchemy 2 declarative models for the run store (runs, tasks, candidates, evaluations, llm_calls)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of every forge table."""

    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class Run(Base):
    """A forge run: one model optimised on one device with one policy."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    finished_at: Mapped[datetime | None]
    model: Mapped[str] = mapped_column(String(512))
    device: Mapped[str] = mapped_column(String(128), default="")
    dtype: Mapped[str] = mapped_column(String(32), default="")
    policy: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[str] = mapped_column(String(16), default="running", index=True)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    eager_ms: Mapped[float | None] = mapped_column(Float)
    forge_ms: Mapped[float | None] = mapped_column(Float)
    note: Mapped[str] = mapped_column(Text, default="")


class Task(Base):
    """A kernel task of a run: one structurally distinct subgraph and where its time goes."""

    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("run_id", "key", name="uq_tasks_run_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(512))
    family: Mapped[str] = mapped_column(String(64), default="")
    count: Mapped[int] = mapped_column(default=1)
    ms: Mapped[float | None] = mapped_column(Float)
    share: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(Text, default="")
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    stop_reason: Mapped[str | None] = mapped_column(String(256))


class Candidate(Base):
    """A node of a task's MCTS tree: a kernel (source, entry point, knobs) and its statistics."""

    __tablename__ = "candidates"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("candidates.id", ondelete="CASCADE"), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(Text, default="")
    entry: Mapped[str] = mapped_column(String(256), default="")
    knobs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    origin: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    visits: Mapped[int] = mapped_column(default=0)
    reward: Mapped[float | None] = mapped_column(Float)


class Evaluation(Base):
    """One build + verify + timing of a candidate."""

    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    build_log: Mapped[str] = mapped_column(Text, default="")
    verify: Mapped[dict[str, Any]] = mapped_column(default=dict)
    time_us_median: Mapped[float | None] = mapped_column(Float)
    time_us_spread: Mapped[dict[str, Any]] = mapped_column(default=dict)
    baseline_us_median: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str] = mapped_column(String(128), default="")
    device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class LLMCall(Base):
    """One language-model request and its response; doubles as the response cache."""

    __tablename__ = "llm_calls"
    __table_args__ = (Index("ix_llm_calls_request_hash", "request_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"))
    candidate_id: Mapped[int | None] = mapped_column(ForeignKey("candidates.id", ondelete="SET NULL"))
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    request_hash: Mapped[str] = mapped_column(String(128))
    prompt: Mapped[str] = mapped_column(Text, default="")
    response: Mapped[str] = mapped_column(Text, default="")
    tokens_in: Mapped[int] = mapped_column(default=0)
    tokens_out: Mapped[int] = mapped_column(default=0)
    latency_s: Mapped[float] = mapped_column(Float, default=0.0)
    usd: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[str] = mapped_column(String(16), default="ok")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
