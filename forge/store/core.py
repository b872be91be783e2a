"""The Store class: every read and write of forge's run database goes through it."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from forge.policy.base import CallStore

from .base import StoreBase, _apply, _check_run_state, _record, new_run_id
from .models import Candidate, Evaluation, LLMCall, Run, Task, utcnow
from .records import (
    BACKENDS,
    CandidateRecord,
    EvaluationRecord,
    LLMCallRecord,
    RunCost,
    RunRecord,
    TaskRecord,
)

log = logging.getLogger(__name__)


class Store(StoreBase, CallStore):
    """Persistent record of runs, tasks, candidate trees, evaluations and LLM calls."""

    # -- runs -------------------------------------------------------------------------------------

    def create_run(
        self,
        model: str,
        *,
        device: str = "",
        dtype: str = "",
        policy: str = "",
        config: dict[str, Any] | None = None,
        note: str = "",
        state: str = "running",
        run_id: str | None = None,
    ) -> RunRecord:
        """Start a new run (state "running" by default) and return it."""
        _check_run_state(state)
        with self._write() as s:
            if run_id is None:
                run_id = new_run_id()
                while s.get(Run, run_id) is not None:
                    run_id = new_run_id()
            elif s.get(Run, run_id) is not None:
                raise ValueError(f"run id {run_id!r} already exists")
            row = Run(
                id=run_id,
                model=model,
                device=device,
                dtype=dtype,
                policy=policy,
                config=dict(config or {}),
                note=note,
                state=state,
            )
            s.add(row)
            s.flush()
            s.refresh(row)
            record = _record(RunRecord, row)
        log.info("created run %s for %s", record.id, model)
        return record

    def get_run(self, run_id: str) -> RunRecord:
        """Return the run with this id, or raise KeyError."""
        with self._read() as s:
            return _record(RunRecord, self._get(s, Run, run_id, "run"))

    def list_runs(self, *, limit: int | None = None, state: str | None = None) -> list[RunRecord]:
        """Return runs newest first, optionally only those in one state."""
        query = select(Run).order_by(Run.created_at.desc(), Run.id.desc())
        if state is not None:
            query = query.where(Run.state == state)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as s:
            return [_record(RunRecord, row) for row in s.scalars(query)]

    def update_run(self, run_id: str, **fields: Any) -> RunRecord:
        """Change fields of a run; a final state also stamps finished_at unless given."""
        if "state" in fields:
            _check_run_state(fields["state"])
            if fields["state"] != "running":
                fields.setdefault("finished_at", utcnow())
        with self._write() as s:
            row = self._get(s, Run, run_id, "run")
            _apply(row, "run", fields)
            s.flush()
            s.refresh(row)
            return _record(RunRecord, row)

    # -- tasks ------------------------------------------------------------------------------------

    def add_task(
        self,
        run_id: str,
        key: str,
        *,
        family: str = "",
        count: int = 1,
        ms: float | None = None,
        share: float | None = None,
        source: str = "",
        meta: dict[str, Any] | None = None,
        state: str = "pending",
        stop_reason: str | None = None,
    ) -> TaskRecord:
        """Add a task (unique per run and key) to a run and return it."""
        try:
            with self._write() as s:
                self._get(s, Run, run_id, "run")
                row = Task(
                    run_id=run_id,
                    key=key,
                    family=family,
                    count=count,
                    ms=ms,
                    share=share,
                    source=source,
                    meta=dict(meta or {}),
                    state=state,
                    stop_reason=stop_reason,
                )
                s.add(row)
                s.flush()
                s.refresh(row)
                return _record(TaskRecord, row)
        except IntegrityError as exc:
            raise ValueError(f"run {run_id!r} already has a task with key {key!r}") from exc

    def get_task(self, task_id: int) -> TaskRecord:
        """Return the task with this id, or raise KeyError."""
        with self._read() as s:
            return _record(TaskRecord, self._get(s, Task, task_id, "task"))

    def get_tasks(self, run_id: str) -> list[TaskRecord]:
        """Return a run's tasks in the order they were added."""
        with self._read() as s:
            self._get(s, Run, run_id, "run")
            rows = s.scalars(select(Task).where(Task.run_id == run_id).order_by(Task.id))
            return [_record(TaskRecord, row) for row in rows]

    def update_task(self, task_id: int, **fields: Any) -> TaskRecord:
        """Change fields of a task (state, stop_reason, ms, ...) and return it."""
        with self._write() as s:
            row = self._get(s, Task, task_id, "task")
            _apply(row, "task", fields)
            s.flush()
            s.refresh(row)
            return _record(TaskRecord, row)

    # -- candidates -------------------------------------------------------------------------------

    def add_candidate(
        self,
        task_id: int,
        parent_id: int | None = None,
        *,
        backend: str,
        source: str = "",
        entry: str = "",
        knobs: dict[str, Any] | None = None,
        origin: str = "",
        status: str = "pending",
        visits: int = 0,
        reward: float | None = None,
    ) -> CandidateRecord:
        """Add a node to a task's search tree (parent_id None for a root) and return it."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        with self._write() as s:
            self._get(s, Task, task_id, "task")
            if parent_id is not None:
                parent = self._get(s, Candidate, parent_id, "candidate")
                if parent.task_id != task_id:
                    raise ValueError(f"candidate {parent_id} belongs to task {parent.task_id}, not {task_id}")
            row = Candidate(
                task_id=task_id,
                parent_id=parent_id,
                backend=backend,
                source=source,
                entry=entry,
                knobs=dict(knobs or {}),
                origin=origin,
                status=status,
                visits=visits,
                reward=reward,
            )
            s.add(row)
            s.flush()
            s.refresh(row)
            return _record(CandidateRecord, row)

    def get_candidate(self, candidate_id: int) -> CandidateRecord:
        """Return the candidate with this id, or raise KeyError."""
        with self._read() as s:
            return _record(CandidateRecord, self._get(s, Candidate, candidate_id, "candidate"))

    def candidates(self, task_id: int) -> list[CandidateRecord]:
        """Return a task's candidates in tree order: depth first, each parent before its children."""
        with self._read() as s:
            self._get(s, Task, task_id, "task")
            rows = s.scalars(select(Candidate).where(Candidate.task_id == task_id).order_by(Candidate.id))
            nodes = [_record(CandidateRecord, row) for row in rows]
        ids = {node.id for node in nodes}
        children: dict[int | None, list[CandidateRecord]] = {}
        for node in nodes:
            parent = node.parent_id if node.parent_id in ids else None
            children.setdefault(parent, []).append(node)
        ordered: list[CandidateRecord] = []
        stack = list(reversed(children.get(None, [])))
        while stack:
            node = stack.pop()
            ordered.append(node)
            stack.extend(reversed(children.get(node.id, [])))
        return ordered

    # -- evaluations ------------------------------------------------------------------------------

    def add_evaluation(
        self,
        candidate_id: int,
        *,
        status: str,
        message: str = "",
        build_log: str = "",
        verify: dict[str, Any] | None = None,
        time_us_median: float | None = None,
        time_us_spread: dict[str, Any] | None = None,
        baseline_us_median: float | None = None,
        device: str = "",
        device_seconds: float = 0.0,
    ) -> EvaluationRecord:
        """Record one evaluation (build, verify, timing) of a candidate and return it."""
        with self._write() as s:
            self._get(s, Candidate, candidate_id, "candidate")
            row = Evaluation(
                candidate_id=candidate_id,
                status=status,
                message=message,
                build_log=build_log,
                verify=dict(verify or {}),
                time_us_median=time_us_median,
                time_us_spread=dict(time_us_spread or {}),
                baseline_us_median=baseline_us_median,
                device=device,
                device_seconds=device_seconds,
            )
            s.add(row)
            s.flush()
            s.refresh(row)
            return _record(EvaluationRecord, row)

    def evaluations(self, candidate_id: int) -> list[EvaluationRecord]:
        """Return a candidate's evaluations, oldest first."""
        with self._read() as s:
            self._get(s, Candidate, candidate_id, "candidate")
            query = select(Evaluation).where(Evaluation.candidate_id == candidate_id).order_by(Evaluation.id)
            return [_record(EvaluationRecord, row) for row in s.scalars(query)]

    # -- llm calls --------------------------------------------------------------------------------

    def add_llm_call(
        self,
        run_id: str,
        *,
        provider: str,
        model: str,
        request_hash: str,
        prompt: str = "",
        response: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        latency_s: float = 0.0,
        usd: float = 0.0,
        status: str = "ok",
        task_id: int | None = None,
        candidate_id: int | None = None,
    ) -> LLMCallRecord:
        """Record one language-model call (and cache its response) and return it."""
        with self._write() as s:
            self._get(s, Run, run_id, "run")
            if task_id is not None:
                self._get(s, Task, task_id, "task")
            if candidate_id is not None:
                self._get(s, Candidate, candidate_id, "candidate")
            row = LLMCall(
                run_id=run_id,
                task_id=task_id,
                candidate_id=candidate_id,
                provider=provider,
                model=model,
                request_hash=request_hash,
                prompt=prompt,
                response=response,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                latency_s=latency_s,
                usd=usd,
                status=status,
            )
            s.add(row)
            s.flush()
            s.refresh(row)
            return _record(LLMCallRecord, row)

    def link_llm_calls(self, call_ids: tuple[int, ...] | list[int], candidate_id: int) -> None:
        """Link stored LLM calls to the candidate their answer became, and to its task (calls already linked
        stay)."""
        if not call_ids:
            return
        with self._write() as s:
            cand = self._get(s, Candidate, candidate_id, "candidate")
            for row in s.scalars(select(LLMCall).where(LLMCall.id.in_(list(call_ids)))):
                if row.candidate_id is None:
                    row.candidate_id = candidate_id
                    row.task_id = row.task_id if row.task_id is not None else cand.task_id

    def find_llm_call(self, request_hash: str, *, status: str | tuple[str, ...] | None = "ok"
                      ) -> LLMCallRecord | None:
        """Return the newest call with this request hash (and status, or one of these; None for any), or None."""
        query = select(LLMCall).where(LLMCall.request_hash == request_hash)
        if status is not None:
            query = query.where(LLMCall.status.in_((status,) if isinstance(status, str) else status))
        with self._read() as s:
            row = s.scalars(query.order_by(LLMCall.id.desc()).limit(1)).first()
            return None if row is None else _record(LLMCallRecord, row)

    def llm_calls(self, run_id: str) -> list[LLMCallRecord]:
        """Return a run's language-model calls, oldest first."""
        with self._read() as s:
            self._get(s, Run, run_id, "run")
            query = select(LLMCall).where(LLMCall.run_id == run_id).order_by(LLMCall.id)
            return [_record(LLMCallRecord, row) for row in s.scalars(query)]

    # -- totals -----------------------------------------------------------------------------------

    def run_cost(self, run_id: str) -> RunCost:
        """Return what a run spent: LLM dollars and tokens, and device seconds of its evaluations."""
        with self._read() as s:
            self._get(s, Run, run_id, "run")
            usd, tokens_in, tokens_out, calls = s.execute(
                select(
                    func.coalesce(func.sum(LLMCall.usd), 0.0),
                    func.coalesce(func.sum(LLMCall.tokens_in), 0),
                    func.coalesce(func.sum(LLMCall.tokens_out), 0),
                    func.count(LLMCall.id),
                ).where(LLMCall.run_id == run_id)
            ).one()
            seconds, evals = s.execute(
                select(func.coalesce(func.sum(Evaluation.device_seconds), 0.0), func.count(Evaluation.id))
                .join(Candidate, Evaluation.candidate_id == Candidate.id)
                .join(Task, Candidate.task_id == Task.id)
                .where(Task.run_id == run_id)
            ).one()
        return RunCost(
            usd=float(usd),
            tokens_in=int(tokens_in),
            tokens_out=int(tokens_out),
            device_seconds=float(seconds),
            llm_calls=int(calls),
            evaluations=int(evals),
        )
