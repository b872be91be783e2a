"""The search: for each task, an MCTS over a policy's candidates, judged by the evaluator, stored as it goes.

The candidate budget goes where the possible gain is. First every searchable task (share of model time at
least `min_share`, and the policy's) gets a probe: its first `min_per_task` candidates (fewer when the probe
would take more than half the budget: `probe_size`), biggest share first, which measure the task's eager time
and its roofline floor. Then the rest of the budget is shared out in proportion to share x headroom, headroom
= 1 - floor / eager (the fraction of the task's time a kernel at the floor would save), biggest weight first,
at most `per_task` candidates a task; what a task leaves unused goes to the next. A task stops when it reaches
its floor, stops improving (`patience` candidates without a better time), runs out of candidates, time or
ideas, or when the policy has nothing for it ("not mine"); its stop reason says which.

Every task is stored when the search starts, every candidate and evaluation the moment it exists, and the
probe's weights and each task's candidate target when they are decided, so `resume=True` rebuilds every tree
from the store (no node evaluated again) and continues where the run stopped.

A policy that raises in `refusal`, `propose`, `render` or `stop_reason` stops that task alone, with the stop
reason `policy error: ...` (stored at once, so a resumed run does not retry it); the other tasks go on.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from forge.confidence import noisy, speedup_ci
from forge.evaluate.evaluator import BaseEvaluator as Evaluator  # local workers or a Ray cluster
from forge.kernel import Candidate, EvalResult, Feedback, NoKernel, TaskSpec
from forge.policy.base import Policy
from forge.progress import Progress
from forge.search import tune
from forge.search.confirm import Entry, decision, retimed, top
from forge.search.dedup import Seen, duplicate
from forge.search.mcts import FAIL, MCTS, Node, reward_of
from forge.search.outcome import Budget, TaskOutcome  # noqa: F401 - forge.search.driver.Budget: the API's name
from forge.search.payloads import knobs_of, payload_of, policy_error
from forge.search.probe import deepen, probe, probe_size, searched_before
from forge.search.recorder import NodeRow, Recorder, TaskRow
from forge.tasks.cut import Task

log = logging.getLogger(__name__)


class TaskSearch:
    """One task's tree, best kernel, eager time and floor: it can stop, wait for budget, and go on."""

    def __init__(self, task: Task, policy: Policy, recorder: Recorder, rec: TaskRow,
                 progress: Progress | None = None) -> None:
        self.task, self.policy, self.recorder, self.rec = task, policy, recorder, rec
        self.progress = progress or Progress()
        self.reported = False  # its stop was reported (progress.task_done)
        self.spec = TaskSpec.of(task)
        self.tree = MCTS(lambda node: policy.propose(self.spec, node.payload, self.feedback(node)))
        self.db_id: dict[int, int] = {}  # tree node id -> its recorded id
        self.results: dict[int, EvalResult] = {}  # tree node id -> its evaluation (what feedback reports)
        self.best: tuple[float, Candidate] | None = None  # (median us, candidate)
        self.best_node: int | None = None  # its tree node id
        self.passed: dict[int, Callable[[], Candidate]] = {}  # tree node id -> its candidate, of the passing nodes
        self.baselines: list[float] = []  # every paired eager median measured
        self.floor_us: float | None = None
        self.tried = 0
        self.since_best = 0
        self.stop: str | None = rec.stop_reason if rec.state == "done" else None
        self.meta: dict[str, Any] = dict(rec.meta)
        self.last_at: Any = None  # when its newest stored evaluation was made
        self.lock: threading.RLock = threading.RLock()  # search() gives the tasks probed at once one lock
        self.seen = Seen()  # the task's evaluated sources, by normal digest: none is evaluated twice
        self.repairs: list[Node] = []  # failed nodes the policy will repair on purpose, oldest first
        self.interrupted = threading.Event()  # set from another thread: stop after the batch in flight

    def start(self) -> None:
        """Record the root (the eager baseline) unless a recorded tree was restored."""
        if not self.db_id:
            self.db_id[0] = self.recorder.started(self.rec.id, self.task.source)

    def restore(self) -> None:
        """Rebuild the tree and the statistics from the record, in evaluation order; nothing is evaluated."""
        tree_id: dict[int, int] = {}  # recorded node id -> tree node id
        for c in self.recorder.nodes(self.rec.id):  # parents before children
            if c.parent_id is None:
                if not tree_id:
                    tree_id[c.id], self.db_id[0] = 0, c.id
                continue
            if c.parent_id not in tree_id or c.result is None:
                continue  # recorded but never evaluated (killed in between): it may be chosen and evaluated again
            payload, ok = payload_of(self.policy, self.spec, c.knobs)
            node = self.tree.restore(len(self.tree.nodes), tree_id[c.parent_id], payload,
                                     FAIL if c.reward is None else c.reward)
            node.pruned = node.pruned or not ok
            tree_id[c.id], self.db_id[node.id] = node.id, c.id
            self.results[node.id] = c.result
            self.seen.add(Candidate(c.backend, c.source, c.entry), c.id, c.result, node.reward)
            if c.evaluated_at is not None:
                self.last_at = c.evaluated_at if self.last_at is None else max(self.last_at, c.evaluated_at)
            self._account(node.id, c.result, lambda c=c, payload=payload, ok=ok: self._candidate(c, payload, ok))

    def _candidate(self, c: NodeRow, payload: Any, ok: bool) -> Candidate:
        if ok:
            try:
                return self.policy.render(self.spec, payload)
            except Exception as e:  # a policy that cannot render it any more: the stored source is the kernel
                log.warning("cannot re-render candidate %d: %s", c.id, e)
        return Candidate(c.backend, c.source, c.entry)

    def _account(self, key: int, ev: EvalResult, cand: Callable[[], Candidate]) -> None:
        """Count one evaluation (made now, or read back on --resume): eager time, floor, best and patience."""
        self.tried += 1
        passed, median = ev.status.passed, ev.timing.median_us if ev.timing else None
        baseline, floor = (ev.baseline.median_us if ev.baseline else None), ev.floor_us
        self.floor_us = floor or self.floor_us
        if baseline:
            self.baselines.append(baseline)
        if passed and median:
            self.passed[key] = cand
        if passed and median and (self.best is None or median < self.best[0]):
            self.best, self.best_node, self.since_best = (median, cand()), key, 0
        else:
            self.since_best += 1

    @property
    def speedup(self) -> float | None:
        """The best node's own speedup (its eager over its median), once one passed."""
        res = self.results.get(self.best_node) if self.best_node is not None else None
        return res.speedup if res is not None else None

    def halt(self, reason: str) -> None:
        """Stop the task with `reason` (or the reason it already stopped for) and report it, once."""
        self.stop = self.stop or reason
        if not self.reported:
            self.reported = True
            self.progress.task_done(self.task.key, self.tried, self.speedup, self.stop)

    @property
    def eager_us(self) -> float | None:
        """The task's eager time: the median of its paired measurements (one outlier cannot move it far)."""
        return statistics.median(self.baselines) if self.baselines else None

    def stopped(self, deadline: float, budget: Budget) -> str | None:
        """Why the task must stop now, or None."""
        try:
            why = self.policy.stop_reason()  # e.g. --max-usd spent
        except Exception as e:  # noqa: BLE001 - a policy bug: this task's stop reason, the run goes on
            log.exception("policy %s failed to say whether task %s stops", self.policy.name, self.task.key)
            return policy_error(e)
        if why:
            return why
        if self.best and self.floor_us and self.best[0] <= 1.05 * self.floor_us:
            return "reached the roofline floor"
        if self.since_best >= budget.patience:
            return f"no improvement in {budget.patience} candidates"
        if time.monotonic() > deadline:
            return "time"
        return None

    def run(self, until: int, ev: Evaluator, deadline: float, budget: Budget) -> None:
        """Evaluate batches until `until` candidates in all, or a stop condition (then `self.stop` says which).
        Important: all but the evaluations and the policy's wait for its answers (`ready`) runs under `self.lock`,
        which the tasks probed at once share (the policy and the store are not thread-safe)."""
        while self.stop is None and self.tried < until and not self.interrupted.is_set():
            with self.lock:
                nodes = self._select(until, deadline, budget)
            cands = self._render(nodes) if nodes is not None else None
            if nodes is None or cands is None:
                break
            self._evaluate(nodes, cands, ev)  # outside the lock but for the bookkeeping
            with self.lock:
                self.progress.task(self.task.key, self.tried, self.speedup)
        with self.lock:
            if self.stop is None:
                self.stop = self.stopped(deadline, budget)
            if self.stop is not None:
                self.halt(self.stop)

    def _select(self, until: int, deadline: float, budget: Budget) -> list[Node] | None:
        """select + expand (the tree; repairs first) a batch, and tell the policy it was chosen (an LLM policy
        sends its requests now, for these nodes only); None when the task stops (`self.stop` says why)."""
        self.stop = self.stopped(deadline, budget)
        if self.stop:
            return None
        try:  # the policy proposes (in expand): its exception is this task's failure, not the run's
            nodes = self._pick(min(budget.parallel, until - self.tried))
            self.policy.chosen(self.spec, [n.payload for n in nodes])
        except Exception as e:  # noqa: BLE001 - any policy bug: stored as the stop reason, the run goes on
            return self._failed(e)
        if not nodes:
            self.stop = "exhausted (no more ideas)"
            return None
        return nodes

    def _render(self, nodes: list[Node]) -> list[Candidate] | None:
        """The chosen nodes' candidates: the policy waits for them (`ready`: an LLM policy's answers) outside
        the lock the tasks probed at once share, so one slow answer holds up no other task; renders under it.
        None when the policy fails (the task stops)."""
        payloads = [n.payload for n in nodes]
        try:
            self.policy.ready(self.spec, payloads)
            with self.lock:
                return [self.policy.render(self.spec, p) for p in payloads]
        except Exception as e:  # noqa: BLE001 - any policy bug: stored as the stop reason, the run goes on
            with self.lock:
                return self._failed(e)

    def _failed(self, e: Exception) -> None:
        """The policy raised: the task stops with `policy error: ...`, stored at once (a resume skips it)."""
        log.error("policy %s failed on task %s", self.policy.name, self.task.key, exc_info=e)
        self.stop = policy_error(e)
        self.recorder.update_task(self.rec.id, state="done", stop_reason=self.stop)

    def _pick(self, n: int) -> list[Node]:
        """Up to n new nodes: repairs of failed nodes the policy asked for, then UCT's selections."""
        nodes: list[Node] = []
        while self.repairs and len(nodes) < n:
            child = self.tree.expand(self.repairs.pop(0))
            if child is not None:
                nodes.append(child)
        return nodes + [c for c in (self.tree.select() for _ in range(n - len(nodes))) if c]

    def _evaluate(self, nodes: list[Node], cands: list[Candidate], ev: Evaluator) -> None:
        """Evaluate the batch's new sources; record every node (a duplicate with its original's reward)."""
        fresh, dups, firsts = [], [], {}
        for node, cand in zip(nodes, cands, strict=True):
            key = cand.normal_digest
            if isinstance(cand, NoKernel) or (key not in firsts and self.seen.get(cand) is None):
                fresh.append((node, cand))
                firsts.setdefault(key, node)
            else:
                dups.append((node, cand))
        # builds in parallel, timing one at a time on each worker, outside the lock the tasks probed at once share
        results = ev.evaluate_many(self.spec, [c for _, c in fresh]) if fresh else []
        for (node, cand), res in zip(fresh, results, strict=True):
            with self.lock:
                self.tree.report(node, reward_of(res.speedup if res.status.passed else None))  # backpropagate
                self._done(node, cand, res)
                self.seen.add(cand, self.db_id[node.id], res, node.reward)
        with self.lock:
            for node, cand in dups:
                first = self.seen.get(cand)
                assert first is not None
                self.tree.report(node, first.reward if first.reward is not None else FAIL)
                self._done(node, cand, duplicate(first))

    def _done(self, node: Node, cand: Candidate, res: EvalResult) -> None:
        """Record one node's result, count it, tell the policy, and queue it for repair if the policy asks."""
        self._record(node, cand, res)
        self._account(node.id, res, lambda cand=cand: cand)
        try:  # feedback for policies that learn from outcomes (LLMs)
            self.policy.observe(self.spec, node.payload, cand, res)
            if not res.status.passed and self.policy.repairable(self.spec, node.payload, res):
                self.repairs.append(node)
        except Exception:  # noqa: BLE001 - lost feedback, not a lost run
            log.exception("policy %s failed to observe a result of task %s", self.policy.name, self.task.key)

    def feedback(self, node: Node) -> Feedback:
        """The node's evaluation and the task's statistics, for the policy expanding it."""
        res = self.results.get(node.id)
        errs = [v for s in (res.verify.get("sets", []) if res else []) if isinstance(s, dict)
                for k, v in s.items() if k.startswith("err") and isinstance(v, (int, float))]
        return Feedback(res.status.value if res else None, res.message if res else "",
                        res.speedup if res else None, res.timing.median_us if res and res.timing else None,
                        max(errs) if errs else None, self.best[0] if self.best else None, self.eager_us,
                        self.floor_us, self.tried, self.best[1] if self.best else None)

    def _record(self, node: Node, cand: Candidate, res: EvalResult) -> None:
        self.results[node.id] = res
        parent = self.db_id[node.parent.id] if node.parent is not None else None
        self.db_id[node.id] = self.recorder.evaluated(self.rec.id, parent, cand, knobs_of(node.payload),
                                                      self.policy.name, res, node.reward)

    def headroom(self, bandwidth: float | None) -> float:
        """1 - floor / eager, from the probe; estimated from the profile when the probe measured neither."""
        eager = self.eager_us or (self.task.ms * 1e3 / max(self.task.count, 1) if self.task.ms else None)
        floor = self.floor_us or (self.spec.floor_bytes / bandwidth * 1e6 if bandwidth else None)
        if not eager or floor is None:
            return 0.5  # nothing known: assume half of the time can go
        return max(0.0, 1.0 - floor / eager)

    def set_meta(self, **kw: Any) -> None:
        """Record allocation decisions with the task, for --resume."""
        self.meta.update(kw)
        self.recorder.update_task(self.rec.id, meta=dict(self.meta))

    def finish(self, ev: Evaluator, reason: str, until: float | None = None) -> TaskOutcome:
        """Record the task done; time its fastest candidates again (until `until`, time.monotonic) and name the
        winner, if the intervals say one beats eager (forge.search.confirm)."""
        self.halt(reason)
        if self.rec.state != "done" or self.rec.stop_reason != self.stop:
            self.recorder.update_task(self.rec.id, state="done", stop_reason=self.stop)
        tune.autotune(self, ev, until)
        entries = [Entry(k, cand(), self.results[k]) for k, cand in self.passed.items()]
        confirmed = retimed(ev, self.spec, top(entries), until)
        for e in confirmed:
            if e.result is not self.results[e.key]:
                self.results[e.key] = e.result
                self.recorder.retimed(self.db_id[e.key], e.result)
        d = decision(confirmed)
        best = next((e for e in confirmed if d.best and e.key == d.best.key), None)
        res = best.result if best else None
        status = d.status if self.tried else "skipped"
        if best is not None:
            self.best, self.best_node = (res.timing.median_us, best.cand), best.key
        self.set_meta(best_node=self.db_id[best.key] if best else None, verdict=status)
        t, b = (res.timing, res.baseline) if res else (None, None)
        return TaskOutcome(self.task.key, self.task.family, self.task.share or 0.0,
                           b.median_us if b else self.eager_us, t.median_us if t else None, self.tried, status,
                           self.stop or reason, best.cand if d.winner and best else None, self.floor_us,
                           res.speedup if res else None, speedup_ci(b, t), noisy(t) or noisy(b))


def search(tasks: list[Task], policy: Policy, ev: Evaluator, recorder: Recorder, budget: Budget,
           progress: Progress | None = None, resume: bool = False) -> list[TaskOutcome]:
    """Search every task worth it within the budget: probe each, then by share x headroom (module docstring).
    Every task, node, result and decision goes to `recorder` (forge.store.recorder.StoreRecorder: the run
    store). With `resume`, the run's recorded tasks, trees and decisions are restored and the search goes on.
    `progress` hears the probe and search stages, every batch and every task's stop (forge.progress).
    """
    stored = {r.key: r for r in recorder.tasks()} if resume else {}
    if stored:  # the shares the run was started with, not a new profile's
        tasks = [replace(t, ms=stored[t.key].ms, share=stored[t.key].share) if t.key in stored else t for t in tasks]
    ranked = sorted(tasks, key=lambda t: -(t.share or 0.0))
    out: dict[str, TaskOutcome] = {}
    states: list[TaskSearch] = []
    for t in ranked:
        rec = stored.get(t.key) or recorder.add_task(t)
        skipped = _not_searched(t, rec, policy, recorder, budget)
        if skipped is not None:
            out[t.key] = skipped
            continue
        s = TaskSearch(t, policy, recorder, rec, progress)
        if resume:
            s.restore()
        states.append(s)
    after = max(2.0, 0.1 * budget.seconds)  # the re-timing's share, past the search's deadline
    kept = tune.reserve(budget.seconds, after) if policy.autotunes else 0.0  # for the autotune at the tasks' end
    deadline = time.monotonic() + budget.seconds - searched_before(states, recorder) - kept
    policy.until(deadline)  # an LLM policy's requests end by then
    shown = progress or Progress()
    shown.searching({s.task.key: s.tried for s in states}, budget.candidates, budget.per_task)
    shown.stage("probe")

    def left() -> int:
        return budget.candidates - sum(s.tried for s in states)

    lock = threading.RLock()
    for s in states:
        s.lock = lock
    probe(states, left, ev, deadline, budget, probe_size(budget, len(states)))  # at most half the budget
    shown.stage("search")
    deep = replace(budget, parallel=max(budget.parallel, ev.parallel))  # one task at a time: a batch fills every worker
    deepen([s for s in states if s.stop is None], states, left, ev, deadline, deep)
    until = deadline + kept + after  # the autotune's and the re-timing's share
    for s in states:
        out[s.task.key] = s.finish(ev, "run budget spent", until)
    return [out[t.key] for t in ranked]


def _not_searched(t: Task, rec: TaskRow, policy: Policy, recorder: Recorder, budget: Budget) -> TaskOutcome | None:
    """The outcome of a task that is not searched (a share too small, not the policy's, a policy error, each
    recorded as the task's stop reason), or None when it is searched."""
    share = t.share or 0.0
    try:
        why_not = policy.refusal(TaskSpec.of(t)) if share >= budget.min_share else None
    except Exception as e:  # noqa: BLE001 - a policy bug on one task: that task is not searched, the rest are
        log.exception("policy %s failed on task %s", policy.name, t.key)
        why_not = policy_error(e)
    if share >= budget.min_share and why_not is None:
        return None
    status, why = (("skipped", f"share below {budget.min_share:.0%} of model time") if why_not is None
                   else ("skipped", why_not) if why_not.startswith("policy error")
                   else ("not mine", f"not mine: {why_not}"))
    if rec.state != "done":
        recorder.update_task(rec.id, state="done", stop_reason=why)
    return TaskOutcome(t.key, t.family, share, None, None, 0, status, why)
