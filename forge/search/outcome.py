"""What a search is given (its Budget) and what it finds for each task (TaskOutcome): forge.search.driver's
input and output, which forge.job and the CLI read."""

from __future__ import annotations

from dataclasses import dataclass

from forge.kernel import Candidate


@dataclass(frozen=True)
class Budget:
    """Limits of one optimize run."""

    candidates: int = 400  # over all tasks: a cap; the wall time is what ends a run by default
    per_task: int = 16
    min_per_task: int = 4  # the probe: every searched task's first candidates (measure eager time and floor)
    seconds: float = 300.0  # wall time of the search (forge optimize: of the whole run, see forge.job)
    patience: int = 8  # candidates without improvement before a task stops
    parallel: int = 4  # candidates selected (and built) at once
    min_share: float = 0.01  # tasks below this share of model time are not searched


@dataclass(frozen=True)
class TaskOutcome:
    """What the search found for one task."""

    key: str
    family: str
    share: float
    eager_us: float | None
    best_us: float | None
    candidates: int
    status: str  # "improved" | "no gain" | "no gain (within noise)" | "not mine" | "skipped"
    stop_reason: str
    best: Candidate | None = None  # the winner (None: eager stays; forge.job builds it)
    floor_us: float | None = None  # the roofline floor: the task's bytes at the device's copy bandwidth
    speedup: float | None = None  # the best node's own (its eager over its median; eager_us and best_us are its)
    speedup_ci: tuple[float, float] | None = None  # its 95% interval (forge.confidence)
    noisy: bool = False  # its timing (or its eager's) spread too far (forge.confidence.noisy)
