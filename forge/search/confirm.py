"""Before a task's winner is declared: its fastest candidates timed again, with enough samples for intervals.

The search times each candidate briefly (forge.bench.DEFAULT_BENCH: 10 samples at least), enough to steer the tree,
not to tell two close candidates apart. So at the end of a task its `TOP` fastest passing candidates (by median)
are timed again through the same path, held to a first evaluation's checks but the verification before timing (the
calls on the same buffers, the worker's interleaved clock against eager with the kept calls judged, the clock and
eager cross-checked, the verification after timing, the roofline floor; forge.evaluate.judge with `retime`) with
`CONFIRM_BENCH`, and forge.confidence.decide picks the winner on their intervals: a candidate beats eager, or
another candidate, only where the intervals do not overlap. The fastest is always timed again, the others while the
run's clock allows; a re-timing there is no time or memory left for (a timeout, out of memory), one the judge
itself failed in (`reference_error`), or none at all, keeps the search's own timing. A re-timing that finds the
candidate wrong (its kept calls judged: a wrong result, a partial write, a mutated input, a clock that disagrees, a
median below the floor...) is the candidate's result from then on: it is recorded and the candidate is no
contender.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from forge.bench import BenchConfig
from forge.confidence import Contender, Decision, decide
from forge.evaluate.evaluator import BaseEvaluator as Evaluator  # local workers or a Ray cluster
from forge.kernel import Candidate, EvalResult, Status, TaskSpec

log = logging.getLogger(__name__)

TOP = 3  # candidates timed again per task
CONFIRM_BENCH = BenchConfig(warmup_s=0.05, budget_s=0.6, min_runs=30, max_runs=400)
IMPROVED = 1.05  # a winner is at least this much faster than what it replaces, by the medians
# re-timings that say nothing against the candidate: no time or memory left, the judge's own failure
KEEPS_FIRST = (Status.TIMEOUT, Status.OUT_OF_MEMORY, Status.REFERENCE_ERROR)


@dataclass(frozen=True)
class Entry:
    """A passing node of a task: its tree id, its candidate and its latest evaluation."""

    key: int
    cand: Candidate
    result: EvalResult


def top(entries: Sequence[Entry], n: int = TOP) -> list[Entry]:
    """The `n` fastest passing entries by median, in the order they were found."""
    timed = [e for e in entries if e.result.status.passed and e.result.timing and e.result.baseline]
    fastest = sorted(timed, key=lambda e: e.result.timing.median_us if e.result.timing else 0.0)[:n]
    return sorted(fastest, key=lambda e: e.key)


def retimed(ev: Evaluator, spec: TaskSpec, entries: Sequence[Entry], until: float | None) -> list[Entry]:
    """Each entry timed again with `CONFIRM_BENCH`, fastest first: the fastest always (the number reported is
    never the search's short timing), the others while the clock allows (`until`, time.monotonic); an entry
    whose re-timing could not run (KEEPS_FIRST, or no time left) keeps its result; one found wrong carries that
    verdict. In the entries' order."""
    done: dict[int, Entry] = {}
    for i, e in enumerate(sorted(entries, key=lambda e: e.result.timing.median_us if e.result.timing else 0.0)):
        if i and until is not None and time.monotonic() > until:
            break
        res = ev.retime(spec, e.cand, CONFIRM_BENCH)
        if res.status in KEEPS_FIRST or (res.status.passed and not (res.timing and res.baseline)):
            log.warning("task %s: node %d could not be timed again (%s: %s); its first timing stands", spec.key,
                        e.key, res.status.value, res.message[:200])
            continue
        if not res.status.passed:
            log.warning("task %s: node %d failed when timed again (%s: %s): not a contender", spec.key, e.key,
                        res.status.value, res.message[:200])
        done[e.key] = Entry(e.key, e.cand, res)
    return [done.get(e.key, e) for e in entries]


def decision(entries: Sequence[Entry]) -> Decision:
    """forge.confidence.decide over the entries (their keys are the contenders' keys)."""
    return decide([Contender(e.key, e.result.timing, e.result.baseline) for e in entries
                   if e.result.status.passed and e.result.timing and e.result.baseline], IMPROVED)
