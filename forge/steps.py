"""What the judge (forge.judge) and a worker (forge.worker) say to each other: frozen dataclasses over a pipe.

No tensors travel: a step names slots of the arena both processes map (forge.arena).
"""

from __future__ import annotations

from dataclasses import dataclass

from forge.arena import ArenaRef, Slot
from forge.bench import DEFAULT_BENCH, BenchConfig
from forge.kernel import Status, TaskSpec, Timing


@dataclass(frozen=True)
class EvalRequest:
    """Verify (and, with `bench`, time) one built candidate of a task: what forge.judge carries out."""

    task: TaskSpec
    backend: str
    path: str  # the built library (cpu, cuda) or module (triton)
    entry: str
    seed: int = 0
    bench: BenchConfig | None = DEFAULT_BENCH
    floor_factor: float = 0.8  # reject below this fraction of the roofline floor


@dataclass(frozen=True)
class Load:
    """Load this candidate (and the task's eager code, the timing baseline) for the steps that follow."""

    task: TaskSpec
    backend: str
    path: str
    entry: str


@dataclass(frozen=True)
class Call:
    """Call the candidate once on these slots, synchronise, answer."""

    arena: ArenaRef
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    guard: bool = True  # a Python launcher runs under NoTorchCompute
    readonly: bool = False  # the inputs' pages read-only during the call (CPU: a write kills the worker)


@dataclass(frozen=True)
class Time:
    """Time the candidate against eager, interleaved, on inputs at these slots (forge.bench), perturbed before
    every round and random calls kept (forge.spotcheck); copy the kept calls into `kept` (per call: input
    slots, row-major, then output slots). With `batch` > 0, no clock: that many rounds of perturb-and-call
    back to back, then one synchronisation (the judge times the whole step with its own clock)."""

    arena: ArenaRef
    inputs: tuple[Slot, ...]
    kept: tuple[tuple[tuple[Slot, ...], tuple[Slot, ...]], ...]
    bench: BenchConfig
    batch: int = 0


@dataclass(frozen=True)
class Reply:
    """A step's answer: OK, or the status that rejects the candidate; timings and kept calls for Time."""

    status: Status = Status.OK
    message: str = ""
    timing: Timing | None = None
    baseline: Timing | None = None
    kept: int = 0
    fatal: bool = False  # the device context is broken: the worker exits after answering
