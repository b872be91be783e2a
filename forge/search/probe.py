"""The budget's two stages. The probe: every searched task's first candidates, biggest share first, several
tasks at once when the evaluator has more workers than one task's batch fills (tasks of one model on different
GPUs at once). Then `deepen`: the tasks still live, by share x headroom."""

from __future__ import annotations

import concurrent.futures as cf
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

from forge.evaluate.evaluator import BaseEvaluator

if TYPE_CHECKING:
    from forge.search.driver import Budget, TaskSearch
    from forge.search.recorder import Recorder


def probe(states: list[TaskSearch], left: Callable[[], int], ev: BaseEvaluator, deadline: float,
          budget: Budget, size: int) -> None:
    """Run each task's probe (`size` candidates in all, probe_size, within what the run has
    `left`).

    With `ev.parallel // budget.parallel` above one, that many tasks are probed at once (threads; each task's
    bookkeeping under the lock the tasks share, TaskSearch.run), each with the candidates the run had left for
    it when the probe started, in share order; otherwise one after the other, each given what is left then.
    """
    at_once = max(1, ev.parallel // max(1, budget.parallel))
    targets: list[tuple[TaskSearch, int]] = []
    spare = left()
    for s in states:
        if s.stop is not None or s.tried >= size:
            continue
        if (left() if at_once == 1 else spare) <= 0:
            s.halt("run budget spent")
            continue
        s.start()
        if at_once == 1:
            s.run(min(size, s.tried + left()), ev, deadline, budget)
            continue
        n = min(size - s.tried, spare)
        spare -= n
        targets.append((s, s.tried + n))
    if targets:
        pool = cf.ThreadPoolExecutor(at_once, thread_name_prefix="forge-task")
        try:
            for f in [pool.submit(s.run, until, ev, deadline, budget) for s, until in targets]:
                f.result()
        except BaseException:  # Ctrl-C (or a bug): every task stops after the batch it is in, none starts
            for s, _ in targets:
                s.interrupted.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def probe_size(budget: Budget, tasks: int) -> int:
    """Candidates each task gets in the probe: `min_per_task`, fewer when the probe would take more than half
    of the candidate budget (at --budget 24 over 6 tasks, 2 each), and at least one."""
    if tasks <= 0:
        return budget.min_per_task
    return max(1, min(budget.min_per_task, budget.candidates // (2 * tasks)))


def bandwidth_of(states: list[TaskSearch]) -> float | None:
    """Bytes per second the worker measured, recovered from the floors of probed tasks."""
    rates = [s.spec.floor_bytes / (s.floor_us * 1e-6) for s in states if s.floor_us and s.spec.floor_bytes]
    return statistics.median(rates) if rates else None


def searched_before(states: list[TaskSearch], recorder: Recorder) -> float:
    """Seconds a stopped run had already searched (they count against --seconds when it is resumed)."""
    done_at = [s.last_at for s in states if s.last_at is not None]
    if not done_at:
        return 0.0
    created = recorder.created_at()
    return max(0.0, (max(done_at) - created).total_seconds())


def deepen(live: list[TaskSearch], states: list[TaskSearch], left: Callable[[], int], ev: BaseEvaluator,
           deadline: float, budget: Budget) -> None:
    """After the probe: the tasks still live, by share x headroom, each to its share of what is left (the
    weights and targets are stored, so a resumed run keeps them)."""
    if live and any("weight" not in s.meta for s in live):
        bandwidth = bandwidth_of(states)
        for s in live:
            h = s.headroom(bandwidth)
            s.set_meta(headroom=round(h, 4), weight=(s.task.share or 0.0) * h)
    live.sort(key=lambda s: -s.meta["weight"])
    for i, s in enumerate(live):
        if "target" not in s.meta:
            rest = sum(x.meta["weight"] for x in live[i:])
            extra = round(max(0, left()) * s.meta["weight"] / rest) if rest > 0 else 0
            s.set_meta(target=min(budget.per_task, s.tried + extra))
        s.run(s.meta["target"], ev, deadline, budget)
        if s.stop is None:
            s.halt(f"budget ({s.tried} candidates for share x headroom "
                   f"{s.task.share or 0.0:.2f} x {s.meta['headroom']:.2f})")
