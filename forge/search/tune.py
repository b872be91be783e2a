"""Helion's autotuner at the end of a task (issue 18 item 2).

The tree explores what Helion's autotuner does not: the algorithm and its fusion (the policy's lowerings and
their knobs, a config among them). When a task's search is over, its fastest Helion candidate goes to Helion's
own autotuner (in the worker for Python candidates, forge.evaluate.autotune), which searches that kernel's
config space; the config it chose is written into a new candidate, a child of the one tuned, judged and timed
as any other, so that it wins only by the same rules. The effort follows the time the run has left: none
under `MIN_S` seconds for it, Helion's "quick" up to `FULL_FROM_S`, "full" beyond; half the time left, at most
`MAX_S` seconds a kernel. FORGE_HELION_AUTOTUNE=0 turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from forge.backends import BACKENDS
from forge.kernel import Candidate, EvalResult

MIN_S = 15.0  # seconds: below this a quick search finds little past the config the tree found
MAX_S = 120  # seconds a kernel at most
FULL_FROM_S = 900.0  # time left from which the effort is "full"


def plan(left_s: float | None, kernels: int = 1) -> tuple[str, int] | None:
    """(effort, seconds a kernel) for the time the run has left (None: no limit) and the candidate's number of
    kernels (tuned one after another: half the time left in all), or None: no autotune."""
    if os.environ.get("FORGE_HELION_AUTOTUNE", "1") == "0":
        return None
    seconds = MAX_S if left_s is None else min(MAX_S, left_s / (2 * max(kernels, 1)))
    if seconds < MIN_S:
        return None
    return ("full" if left_s is None or left_s >= FULL_FROM_S else "quick"), int(seconds)


def payload(tuned_node: int, effort: str) -> dict[str, Any]:
    """The payload of a node the autotuner made: which stored node it tuned, and how hard."""
    return {"autotuned": tuned_node, "effort": effort}


def grafted(payload: Any) -> bool:
    """Whether a node's payload is one `payload` made (or its stored form, {"payload": ...})."""
    inner = payload.get("payload", payload) if isinstance(payload, dict) else None
    return isinstance(inner, dict) and "autotuned" in inner


def fastest_helion(passed: Mapping[int, Callable[[], Candidate]], results: Mapping[int, EvalResult]
                   ) -> tuple[int, Candidate] | None:
    """The passing Helion node with the lowest median, and its candidate; None when there is none."""
    found = None
    for key, cand in passed.items():
        res = results.get(key)
        if res is None or res.timing is None:
            continue
        c = cand()
        if BACKENDS[c.backend].autotunes and (found is None or res.timing.median_us < found[0]):
            found = (res.timing.median_us, key, c)
    return (found[1], found[2]) if found else None
