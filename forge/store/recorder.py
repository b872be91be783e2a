"""The run store as the search's Recorder (forge.search.recorder), and the rows of an evaluation result."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from forge.kernel import Candidate, EvalResult, Status, Timing
from forge.search.recorder import NodeRow, Recorder, TaskRow

from .core import Store
from .records import EvaluationRecord, TaskRecord

if TYPE_CHECKING:
    from forge.tasks.cut import Task


def evaluation_fields(res: EvalResult) -> dict[str, object]:
    """The keyword arguments of Store.add_evaluation for a result (median and spread included)."""
    spread = None
    if res.timing:
        t = res.timing
        spread = {"p10": t.p10_us, "p90": t.p90_us, "mean": t.mean_us, "std": t.std_us, "n": t.n,
                  "ci_lo": t.ci_lo_us, "ci_hi": t.ci_hi_us, "floor_us": res.floor_us}
    verify = dict(res.verify)
    if res.baseline:
        verify["baseline"] = {"median": res.baseline.median_us, "p10": res.baseline.p10_us,
                              "p90": res.baseline.p90_us, "n": res.baseline.n, "ci_lo": res.baseline.ci_lo_us,
                              "ci_hi": res.baseline.ci_hi_us}
    return {"status": res.status.value, "message": res.message, "build_log": res.build_log, "verify": verify,
            "time_us_median": res.timing.median_us if res.timing else None, "time_us_spread": spread,
            "baseline_us_median": res.baseline.median_us if res.baseline else None, "device": res.device,
            "device_seconds": res.device_s}


def result_of(ev: EvaluationRecord) -> EvalResult:
    """The EvalResult an evaluation row was written from (what a resumed search counts with)."""
    spread = ev.time_us_spread or {}
    timing = None
    if ev.time_us_median is not None:
        m = ev.time_us_median
        timing = Timing(m, spread.get("p10", m), spread.get("p90", m), spread.get("mean", m), spread.get("std", 0.0),
                        int(spread.get("n", 0)), spread.get("ci_lo"), spread.get("ci_hi"))
    baseline = None
    if ev.baseline_us_median is not None:
        b, kept = ev.baseline_us_median, (ev.verify or {}).get("baseline", {})
        baseline = Timing(b, kept.get("p10", b), kept.get("p90", b), b, 0.0, int(kept.get("n", 0)), kept.get("ci_lo"),
                          kept.get("ci_hi"))
    try:
        status = Status(ev.status)
    except ValueError:  # a status this version does not know: not a pass
        status = Status.LAUNCH_ERROR
    return EvalResult(status, ev.message, ev.build_log, 0.0, dict(ev.verify or {}), timing, baseline,
                      spread.get("floor_us"), ev.device, ev.device_seconds)


def _row(r: TaskRecord) -> TaskRow:
    return TaskRow(r.id, r.key, r.ms, r.share, r.state, r.stop_reason, dict(r.meta))


class StoreRecorder(Recorder):
    """One run's record of the search, kept in a Store."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def tasks(self) -> list[TaskRow]:
        return [_row(r) for r in self.store.get_tasks(self.run_id)]

    def add_task(self, task: Task) -> TaskRow:
        return _row(self.store.add_task(self.run_id, task.key, family=task.family, count=task.count, ms=task.ms,
                                        share=task.share, source=task.source, meta={"ops": list(task.ops)}))

    def update_task(self, task_id: int, **fields: Any) -> None:
        self.store.update_task(task_id, **fields)

    def started(self, task_id: int, source: str) -> int:
        root = self.store.add_candidate(task_id, None, backend="eager", source=source, origin="baseline",
                                        status="ok")
        self.store.update_task(task_id, state="running")
        return root.id

    def evaluated(self, task_id: int, parent_id: int | None, cand: Candidate, knobs: dict[str, Any], origin: str,
                  res: EvalResult, reward: float | None) -> int:
        row = self.store.add_candidate(task_id, parent_id, backend=cand.backend, source=cand.source,
                                       entry=cand.entry, knobs=knobs, origin=origin, status=res.status.value,
                                       visits=1, reward=reward)
        self.store.link_llm_calls(cand.llm_calls, row.id)  # the prompts and answers behind this node
        self.store.add_evaluation(row.id, **evaluation_fields(res))
        return row.id

    def retimed(self, node_id: int, res: EvalResult) -> None:
        self.store.add_evaluation(node_id, **evaluation_fields(res))

    def nodes(self, task_id: int) -> list[NodeRow]:
        out = []
        for c in sorted(self.store.candidates(task_id), key=lambda c: c.id):
            evs = self.store.evaluations(c.id)
            last = evs[-1] if evs else None
            out.append(NodeRow(c.id, c.parent_id, c.backend, c.source, c.entry, dict(c.knobs), c.reward,
                               result_of(last) if last else None, last.created_at if last else None))
        return out

    def created_at(self) -> datetime:
        return self.store.get_run(self.run_id).created_at
