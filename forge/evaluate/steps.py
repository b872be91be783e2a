"""What the judge (forge.evaluate.judge) and a worker (forge.evaluate.child) say to each other: frozen
dataclasses over a pipe.

No tensors travel: a step names slots of the arena both processes map (forge.evaluate.arena).
"""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass

from forge.bench import DEFAULT_BENCH, BenchConfig
from forge.evaluate.arena import ArenaRef, Slot
from forge.kernel import Status, TaskSpec, Timing


@dataclass(frozen=True)
class EvalRequest:
    """Verify (and, with `bench`, time) one built candidate of a task: what forge.evaluate.judge carries out."""

    task: TaskSpec
    backend: str
    path: str  # the built library (cpu, cuda) or module (triton)
    entry: str
    seed: int = 0
    bench: BenchConfig | None = DEFAULT_BENCH
    floor_factor: float = 0.8  # reject below this fraction of the roofline floor
    retime: bool = False  # time it again (all but the verification before timing: the repeated calls, the timed
    # rounds with their kept calls judged, the cross-checks, the verification after, the floor): a confirmation


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
    every round and random calls kept (forge.evaluate.spotcheck); copy the kept calls into `kept` (per call: input
    slots, row-major, then output slots). With `batch` > 0, no clock: that many rounds of perturb-and-call
    back to back, then one synchronisation (the judge times the whole step with its own clock). `renew`: every
    round draws all inputs anew, not only a few elements (the judge decides: forge.evaluate.measured.renews)."""

    arena: ArenaRef
    inputs: tuple[Slot, ...]
    kept: tuple[tuple[tuple[Slot, ...], tuple[Slot, ...]], ...]
    bench: BenchConfig
    batch: int = 0
    renew: bool = False


@dataclass(frozen=True)
class Tune:
    """Run Helion's autotuner on the loaded candidate's kernels, called as its launcher calls them on these slots,
    with `effort` and at most `budget_s` seconds a kernel (forge.evaluate.helion_tune); the reply's message is
    what it chose, as JSON: [[kernel name, config], ...]."""

    arena: ArenaRef
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    effort: str = "quick"
    budget_s: int = 60


ARENA_STEPS = (Call, Time, Tune)  # the steps that name the arena (a CUDA worker is sent its descriptor first)


@dataclass(frozen=True)
class Reply:
    """A step's answer: OK, or the status that rejects the candidate; timings and kept calls for Time."""

    status: Status = Status.OK
    message: str = ""
    timing: Timing | None = None
    baseline: Timing | None = None
    kept: int = 0
    fatal: bool = False  # the device context is broken: the worker exits after answering


# What a worker may send back: its replies, their statuses and timings, and the ready message's strings.
_ALLOWED = {("forge.evaluate.steps", "Reply"), ("forge.kernel", "Status"), ("forge.kernel", "Timing"),
            ("copyreg", "__newobj__"), ("copyreg", "_reconstructor"), ("builtins", "object")}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"a worker may not send {module}.{name}")
        return super().find_class(module, name)


def decode(data: bytes) -> object:
    """A worker's message, unpickled with only the classes a reply is made of (a worker a candidate has
    taken over could send any pickle: a full unpickler would run its code in forge's process)."""
    return _Unpickler(io.BytesIO(data)).load()


def valid_reply(obj: object) -> Reply | None:
    """The reply if it is one, with fields of the right types and finite, non-negative timings; else None."""
    if not isinstance(obj, tuple) or len(obj) != 2 or not isinstance(obj[0], Reply):
        return None
    r = obj[0]
    if not isinstance(r.status, Status) or not isinstance(r.message, str) or not isinstance(r.kept, int) \
            or isinstance(r.kept, bool) or r.kept < 0 or not isinstance(r.fatal, bool):
        return None
    for t in (r.timing, r.baseline):
        if t is not None and (not isinstance(t, Timing) or not all(
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in (
                    t.median_us, t.p10_us, t.p90_us, t.mean_us, t.std_us, t.n))):
            return None
    return r
