"""The review's view of a run, gathered from the store: summaries, task trees, nodes, op-family times.

Speedups follow the search's convention (forge/search/driver.py, forge/search/confirm.py): a node's own speedup
is its latest evaluation's baseline over its median (both timed interleaved, so load on the machine affects both
alike), with its interval (forge.confidence.speedup_ci). A task's speedup is its best node's own, and its eager
and best times are that node's: the best node is the one the search recorded (the task's meta `best_node`, after
its top candidates were timed again), or for a task still searching the passing node of the smallest median. A task
counts as improved (its kernel is shipped) when the search's verdict says so (meta `verdict`), or for a task
without one when its speedup is at least `IMPROVED`. The best-so-far curves (forge.review.progress) follow the
search's best and end on its decision; re-timings are not new candidates.
"""

from __future__ import annotations

import difflib
import logging
import os
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from forge.confidence import noisy, speedup_ci
from forge.errors import StoreUnavailable
from forge.review.progress import Progress, run_series, task_progress
from forge.store import (
    ENV,
    CandidateRecord,
    EvaluationRecord,
    LLMCallRecord,
    RunCost,
    RunRecord,
    Store,
    TaskRecord,
    resolve_url,
    sqlite_file,
)
from forge.store.recorder import result_of

log = logging.getLogger(__name__)

IMPROVED = 1.05  # the search ships a task's winner only when best < eager / 1.05
OTHER = "other"  # model time outside the stored tasks (tasks below --min-share are not stored)


ELSEWHERE = "--db PATH|URL or FORGE_DB=PATH|URL points at another store"


def open_store(db: str | Path | None) -> Store:
    """Open an existing store for reading (`db`, else $FORGE_DB, else runs/forge.db); StoreUnavailable (bad
    input: one line) rather than create an empty one."""
    url = resolve_url(db, create=False)
    file = sqlite_file(url)
    if file is not None and not file.is_file():
        named = "named by $FORGE_DB; " if db is None and os.environ.get(ENV) else ""
        raise StoreUnavailable(f"no run store at {file} ({named}{ELSEWHERE})")
    return Store(url)


def find_run(store: Store, ref: str) -> RunRecord:
    """The run with this id, unique id prefix, or "last"; KeyError (naming the store searched) otherwise."""
    try:
        return store.get_run(ref)
    except KeyError:
        pass
    runs = store.list_runs()
    if ref in ("last", "latest") and runs:
        return runs[0]
    matches = [r for r in runs if r.id.startswith(ref)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        raise KeyError(f"{what} matching {ref!r} in the store {store.where} (forge runs lists them; {ELSEWHERE})")
    return matches[0]


def find_task(store: Store, run_id: str, ref: str) -> TaskRecord:
    """The run's task with this key or unique key prefix; KeyError otherwise."""
    tasks = store.get_tasks(run_id)
    matches = [t for t in tasks if t.key == ref] or [t for t in tasks if t.key.startswith(ref)]
    if len(matches) != 1:
        what = "no task" if not matches else f"{len(matches)} tasks"
        raise KeyError(f"{what} matching {ref!r} in run {run_id} (tasks: {', '.join(t.key for t in tasks)})")
    return matches[0]


# -- runs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """One run as the run list shows it."""

    run: RunRecord
    cost: RunCost
    wall_s: float  # created to finished (to now while it runs)

    @property
    def speedup(self) -> float | None:
        """Eager over forge end to end, once measured."""
        r = self.run
        return r.eager_ms / r.forge_ms if r.eager_ms and r.forge_ms else None

    @property
    def applied(self) -> bool:
        """Whether forge kept its kernels (optimize stores forge_ms = eager_ms when it keeps eager)."""
        r = self.run
        return bool(r.eager_ms and r.forge_ms and r.forge_ms < r.eager_ms)

    def per_dollar(self) -> float | None:
        """Speedup gained (speedup - 1) per dollar of LLM calls; None without cost or speedup."""
        s = self.speedup
        return (s - 1.0) / self.cost.usd if s is not None and self.cost.usd > 0 else None

    def per_device_hour(self) -> float | None:
        """Speedup gained (speedup - 1) per device-hour of evaluations."""
        s = self.speedup
        hours = self.cost.device_seconds / 3600.0
        return (s - 1.0) / hours if s is not None and hours > 0 else None


def summarize(store: Store, run: RunRecord) -> RunSummary:
    """A run with its cost and wall time."""
    end = run.finished_at or datetime.now(timezone.utc)
    return RunSummary(run, store.run_cost(run.id), max(0.0, (end - run.created_at).total_seconds()))


def list_summaries(store: Store, limit: int | None = None) -> list[RunSummary]:
    """Every run, newest first, with cost and wall time."""
    return [summarize(store, r) for r in store.list_runs(limit=limit)]


# -- tasks and trees ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """One node of a task's tree with its latest evaluation."""

    cand: CandidateRecord
    evaluation: EvaluationRecord | None
    depth: int
    visits: int  # evaluations in its subtree, itself included (what MCTS backpropagation counts)
    best: bool = False

    @property
    def baseline(self) -> bool:
        """The root: eager PyTorch, not evaluated."""
        return self.cand.origin == "baseline" or self.cand.backend == "eager"

    @property
    def status(self) -> str:
        """The evaluation's status (the candidate's while none exists)."""
        return self.evaluation.status if self.evaluation else self.cand.status

    @property
    def failed(self) -> bool:
        """Evaluated and rejected."""
        return self.evaluation is not None and self.evaluation.status != "ok"

    @property
    def speedup(self) -> float | None:
        """Its own evaluation's baseline over median, if it passed."""
        e = self.evaluation
        return e.speedup if e is not None and e.status == "ok" else None

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        """The interval of its speedup, if it passed."""
        e = self.evaluation
        if e is None or e.status != "ok":
            return None
        res = result_of(e)
        return speedup_ci(res.baseline, res.timing)

    @property
    def noisy(self) -> bool:
        """Its timing, or its eager's, spread too far (forge.confidence.noisy)."""
        if self.evaluation is None:
            return False
        res = result_of(self.evaluation)
        return noisy(res.timing) or noisy(res.baseline)

    @property
    def reason(self) -> str:
        """Why it failed: status and the first line of the message ("" if it did not fail)."""
        if not self.failed or self.evaluation is None:
            return ""
        first = (self.evaluation.message or "").strip().splitlines()
        return f"{self.evaluation.status}: {first[0]}" if first else self.evaluation.status

    def knobs_text(self) -> str:
        """The knobs as k=v pairs."""
        return " ".join(f"{k}={v}" for k, v in self.cand.knobs.items())


@dataclass(frozen=True)
class TaskView:
    """A task with its tree and the search's results on it."""

    task: TaskRecord
    nodes: tuple[NodeView, ...]  # tree order: depth first, parent before children
    eager_us: float | None  # the best node's eager (else the median of the paired eager times)
    best_us: float | None  # the best node's median
    best_id: int | None
    progress: Progress  # best speedup so far, against candidates and against time

    @property
    def curve(self) -> tuple[float | None, ...]:
        """The best speedup so far after each candidate (first evaluations), the last one the decided."""
        return self.progress.curve

    @property
    def best_node(self) -> NodeView | None:
        """The node whose speedup is the task's."""
        return next((n for n in self.nodes if n.cand.id == self.best_id), None)

    @property
    def speedup(self) -> float | None:
        """The best node's own speedup."""
        n = self.best_node
        return n.speedup if n is not None else None

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        """Its interval."""
        n = self.best_node
        return n.speedup_ci if n is not None else None

    @property
    def noisy(self) -> bool:
        """The best node's timing is noisy."""
        n = self.best_node
        return n.noisy if n is not None else False

    @property
    def verdict(self) -> str | None:
        """The search's verdict: "improved", "no gain", "no gain (within noise)"; None before it decided."""
        v = self.task.meta.get("verdict")
        return v if isinstance(v, str) else None

    @property
    def tried(self) -> int:
        """Candidates evaluated."""
        return sum(1 for n in self.nodes if n.evaluation is not None)

    @property
    def failed(self) -> int:
        """Candidates rejected."""
        return sum(1 for n in self.nodes if n.failed)

    @property
    def improved(self) -> bool:
        """The search ships (or would ship) this task's winner."""
        if self.verdict is not None:
            return self.verdict == "improved"
        return self.speedup is not None and self.speedup >= IMPROVED


def task_view(store: Store, task: TaskRecord) -> TaskView:
    """Gather a task's tree, evaluations and best-so-far curve."""
    cands = store.candidates(task.id)
    history = {c.id: store.evaluations(c.id) for c in cands}
    evals = {c.id: (history[c.id] or [None])[-1] for c in cands}
    subtree = {c.id: int(evals[c.id] is not None) for c in cands}
    for c in reversed(cands):  # tree order reversed: children are summed before their parent
        if c.parent_id in subtree:
            subtree[c.parent_id] += subtree[c.id]
    depth: dict[int, int] = {}
    for c in cands:  # tree order: a parent's depth is known before its children's
        depth[c.id] = depth[c.parent_id] + 1 if c.parent_id in depth else 0
    done = [e for e in evals.values() if e is not None]
    paired = [e.baseline_us_median for e in done if e.baseline_us_median]
    eager = statistics.median(paired) if paired else None  # as the search counts it (forge.search.driver)
    passed = [e for e in done if e.status == "ok" and e.time_us_median]
    best_id = min(passed, key=lambda e: (e.time_us_median or 0.0, e.id)).candidate_id if passed else None
    stored = task.meta.get("best_node", -1)  # the search's decision: a node id, None (nothing passed), or absent
    if stored is None or stored in evals:
        best_id = stored
    pick = evals.get(best_id) if best_id is not None else None
    best = pick.time_us_median if pick is not None else None
    eager = pick.baseline_us_median or eager if pick is not None else eager  # eager over best: the node's own
    nodes = tuple(NodeView(c, evals[c.id], depth[c.id], max(c.visits, subtree[c.id]), c.id == best_id)
                  for c in cands)
    return TaskView(task, nodes, eager, best, best_id, task_progress(history, best_id, task.meta))


@dataclass(frozen=True)
class RunView:
    """Everything the report and the run page show about one run."""

    summary: RunSummary
    tasks: tuple[TaskView, ...]  # biggest share first
    calls: tuple[LLMCallRecord, ...] = ()  # the run's LLM calls, oldest first

    def call_rows(self) -> list[tuple[LLMCallRecord, str, str, str]]:
        """(call, task key, node label, the code its node took) for every LLM call, oldest first."""
        by_task = {t.task.id: t for t in self.tasks}
        out = []
        for c in self.calls:
            t = by_task.get(c.task_id) if c.task_id is not None else None
            node = next((n.cand for n in t.nodes if n.cand.id == c.candidate_id), None) if t else None
            out.append((c, t.task.key if t else "-", f"#{c.candidate_id}" if c.candidate_id else "-",
                        node.source if node is not None else ""))
        return out

    @property
    def run(self) -> RunRecord:
        """The run record."""
        return self.summary.run

    @property
    def tried(self) -> int:
        """Candidates evaluated over all tasks."""
        return sum(t.tried for t in self.tasks)

    @property
    def budget(self) -> int | None:
        """The run's budget of candidates over all tasks (forge optimize records it), if known."""
        return (self.run.config.get("budget") or {}).get("candidates")

    def families(self) -> list[tuple[str, float, float]]:
        """(op family, ms before, ms after) of the profiled model time, biggest first.

        Before is the tasks' profiled time; after divides each shipped task's time by its speedup (only
        when forge kept its kernels). Time outside the stored tasks is `OTHER`.
        """
        before: dict[str, float] = {}
        after: dict[str, float] = {}
        total = next((t.task.ms / t.task.share for t in self.tasks if t.task.ms and t.task.share), None)
        for t in self.tasks:
            ms = t.task.ms or 0.0
            fam = t.task.family or "?"
            shipped = self.summary.applied and t.improved and t.speedup
            before[fam] = before.get(fam, 0.0) + ms
            after[fam] = after.get(fam, 0.0) + (ms / t.speedup if shipped and t.speedup else ms)
        if total is not None and total - sum(before.values()) > 1e-9:
            before[OTHER] = after[OTHER] = total - sum(before.values())
        return sorted(((f, before[f], after[f]) for f in before), key=lambda r: (r[0] == OTHER, -r[1]))

    def wall_series(self) -> list[tuple[str, list[tuple[float, float | None]]]]:
        """The whole model's estimated speedup and each task's best so far against seconds since the run
        started (forge.review.progress.run_series)."""
        tasks = [(t.task.key, t.task.share or 0.0, t.progress) for t in self.tasks]
        return run_series(tasks, self.run.created_at)

    def version(self) -> str:
        """Changes whenever the run gains a node or evaluation or changes state (for live updates)."""
        n = sum(len(t.nodes) for t in self.tasks)
        return f"{self.run.state}:{len(self.tasks)}:{n}:{self.summary.cost.evaluations}"


def run_view(store: Store, run: RunRecord) -> RunView:
    """Gather a run's summary and every task's tree."""
    tasks = sorted(store.get_tasks(run.id), key=lambda t: -(t.share or 0.0))
    return RunView(summarize(store, run), tuple(task_view(store, t) for t in tasks), tuple(store.llm_calls(run.id)))


# -- one node -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeDetail:
    """One node with everything `forge show` and the UI's node panel show."""

    run: RunRecord
    task: TaskRecord
    node: CandidateRecord
    parent: CandidateRecord | None
    evaluations: tuple[EvaluationRecord, ...]
    llm_calls: tuple[LLMCallRecord, ...]

    @property
    def evaluation(self) -> EvaluationRecord | None:
        """The latest evaluation."""
        return self.evaluations[-1] if self.evaluations else None

    def diff(self) -> str:
        """Unified diff of the source against the parent's ("" for a root)."""
        if self.parent is None:
            return ""
        lines = difflib.unified_diff(self.parent.source.splitlines(keepends=True),
                                     self.node.source.splitlines(keepends=True),
                                     f"#{self.parent.id}", f"#{self.node.id}")
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def node_detail(store: Store, candidate_id: int, run_id: str | None = None) -> NodeDetail:
    """Gather one node; KeyError if it does not exist (or is not in run_id)."""
    node = store.get_candidate(candidate_id)
    task = store.get_task(node.task_id)
    if run_id is not None and task.run_id != run_id:
        raise KeyError(f"node {candidate_id} belongs to run {task.run_id}, not {run_id}")
    parent = store.get_candidate(node.parent_id) if node.parent_id is not None else None
    calls = tuple(c for c in store.llm_calls(task.run_id) if c.candidate_id == candidate_id)
    return NodeDetail(store.get_run(task.run_id), task, node, parent, tuple(store.evaluations(candidate_id)), calls)
