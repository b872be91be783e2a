"""How a run reports its progress: `Progress`, whose every method does nothing.

Important: the library (forge.job, forge.search) never prints; it calls a `Progress` it is given. The CLI's
forge.terminal.RunProgress shows the events (a live display on a terminal, plain lines when piped).

The events of a run, in order: `start` once; `stage("capture")` (capture and profile); on a GPU
`stage("compile")` (torch.compile's result for the model, measured before the search); `stage("probe")`
(each task's first candidates) and `stage("search")` (the rest of the budget), with `searching` before
the probe, `task` after every evaluated batch and `task_done` once per searched task; `stage("variants")`
(the found kernels' variants timed end to end); `stage("done")`.
"""

from __future__ import annotations

STAGES = ("capture", "compile", "probe", "search", "variants", "done")


class Progress:
    """Receives a run's progress events; the base class ignores them all."""

    def start(self, ends: float | None) -> None:
        """The run starts; it means to be done by `ends` (time.monotonic(); None: no time limit)."""

    def stage(self, name: str) -> None:
        """A stage (one of STAGES) begins."""

    def searching(self, tasks: dict[str, int], candidates: int, per_task: int) -> None:
        """The search starts: its tasks (key: candidates already tried, >0 when resumed), biggest share first;
        the run's candidate budget; the most one task gets."""

    def task(self, key: str, tried: int, best: float | None) -> None:
        """A batch of task `key`'s candidates was evaluated: `tried` in all, the best speedup over eager so far."""

    def task_done(self, key: str, tried: int, best: float | None, reason: str) -> None:
        """Task `key` stopped after `tried` candidates (best speedup `best`) because of `reason`."""
