"""Helion's autotuner at the end of a task (issue 18 item 2).

The tree explores what Helion's autotuner does not: the algorithm and its fusion (the policy's lowerings and
their knobs, a config among them). When a task's search is over, its fastest Helion candidate goes to Helion's
own autotuner (in the worker for Python candidates, forge.evaluate.autotune), which searches that kernel's
config space; the config it chose is written into a new candidate, a child of the one tuned, judged and timed
as any other, so that it wins only by the same rules. The effort follows the time the run has left: none
under `MIN_S` seconds for it, Helion's "quick" up to `FULL_FROM_S`, "full" beyond; half the time left, at most
`MAX_S` seconds a kernel. When the policy's candidates autotune (Policy.autotunes), the search ends sooner by
`reserve` seconds, so that time is left for it. FORGE_HELION_AUTOTUNE=0 turns it off.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from forge.backends import BACKENDS
from forge.evaluate.autotune import Tuned, kernel_names
from forge.evaluate.evaluator import BaseEvaluator as Evaluator
from forge.kernel import Candidate, EvalResult
from forge.search.mcts import reward_of

if TYPE_CHECKING:
    from forge.search.driver import TaskSearch

log = logging.getLogger(__name__)

MIN_S = 15.0  # seconds: below this a quick search finds little past the config the tree found
MAX_S = 120  # seconds a kernel at most
FULL_FROM_S = 900.0  # time left from which the effort is "full"
MARGIN_S = 3.0  # seconds a reserve adds for what the tasks' end does before the autotune starts


def enabled() -> bool:
    """Whether forge runs Helion's autotuner at all (FORGE_HELION_AUTOTUNE=0 turns it off)."""
    return os.environ.get("FORGE_HELION_AUTOTUNE", "1") != "0"


def plan(left_s: float | None, kernels: int = 1) -> tuple[str, int] | None:
    """(effort, seconds a kernel) for the time the run has left (None: no limit) and the candidate's number of
    kernels (tuned one after another: half the time left in all), or None: no autotune."""
    if not enabled():
        return None
    seconds = MAX_S if left_s is None else min(MAX_S, left_s / (2 * max(kernels, 1)))
    if seconds < MIN_S:
        return None
    return ("full" if left_s is None or left_s >= FULL_FROM_S else "quick"), int(seconds)


def reserve(search_s: float, after_s: float) -> float:
    """Seconds of a search of `search_s` kept for the autotune at the end of its tasks, when the policy's
    candidates autotune (Policy.autotunes); `after_s`: what the tasks' end has past the search's deadline anyway
    (the re-timing's share). A quarter of the search, and at least what gives the first task's autotune MIN_S
    (`plan` takes half the time left; MARGIN_S for the task's end itself), at most MAX_S; none when that would
    be more than half the search, or the autotune is off. Without it the autotune had only `after_s`: a
    `--seconds 120` run on an H100 left it under 10 s, and no task was tuned (53a1df0)."""
    if not enabled():
        return 0.0
    kept = min(float(MAX_S), max(0.25 * search_s, 2 * MIN_S + MARGIN_S - after_s))
    return kept if kept <= 0.5 * search_s else 0.0


def payload(tuned_node: int, effort: str) -> dict[str, Any]:
    """The payload of a node the autotuner made: which stored node it tuned, and how hard."""
    return {"autotuned": tuned_node, "effort": effort}


def grafted(payload: Any) -> bool:
    """Whether a node's payload is one `payload` made (or its stored form, {"payload": ...})."""
    inner = payload.get("payload", payload) if isinstance(payload, dict) else None
    return isinstance(inner, dict) and "autotuned" in inner


def fastest_helion(passed: Mapping[int, Callable[[], Candidate]], results: Mapping[int, EvalResult]
                   ) -> tuple[int, Candidate] | None:
    """The passing Helion node with the lowest median, and its candidate; None when there is none (candidates
    rendered fastest first, until one autotunes)."""
    timed = sorted((res.timing.median_us, key) for key in passed
                   if (res := results.get(key)) is not None and res.timing is not None)
    for _, key in timed:
        cand = passed[key]()
        if BACKENDS[cand.backend].autotunes:
            return key, cand
    return None


def autotune(s: TaskSearch, ev: Evaluator, until: float | None) -> None:
    """Helion's autotuner on task search `s`'s fastest Helion candidate, its config judged as a child of it;
    recorded in the task's meta (`autotune`) whether or not it gave one. Once a task (a resumed run does not
    tune again), never on a node it grafted, never past `until` (time.monotonic)."""
    fastest = None if "autotune" in s.meta else fastest_helion(
        {k: c for k, c in s.passed.items() if not grafted(s.tree.nodes[k].payload)}, s.results)
    if fastest is None:
        return
    key, cand = fastest
    chosen = plan(None if until is None else until - time.monotonic(), len(kernel_names(cand.source)))
    if chosen is None:
        return
    effort, seconds = chosen
    try:
        tuned = ev.autotune(s.spec, cand, effort, seconds)
    except Exception as e:  # noqa: BLE001 - no config, not a lost run
        log.exception("task %s: Helion's autotuner failed", s.task.key)
        tuned = Tuned(None, 0.0, f"{type(e).__name__}: {e}"[:300])
    late = until is not None and time.monotonic() > until
    s.set_meta(autotune={"node": s.db_id[key], "effort": effort, "budget_s": seconds,
                         "seconds": round(tuned.seconds, 2), "configs": dict(tuned.configs),
                         "message": tuned.message or ("no time left to judge it" if late else "")})
    if tuned.candidate is None or late:
        log.warning("task %s: no autotuned candidate judged: %s", s.task.key, tuned.message or "no time left")
        return
    with s.lock:
        node = s.tree.graft(s.tree.nodes[key], payload(s.db_id[key], effort))
    res = ev.evaluate(s.spec, tuned.candidate)
    with s.lock:
        s.tree.report(node, reward_of(res.speedup if res.status.passed else None))
        s._done(node, tuned.candidate, res)
        s.seen.add(tuned.candidate, s.db_id[node.id], res, node.reward)
