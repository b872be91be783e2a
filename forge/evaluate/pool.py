"""Judging slots: one evaluation worker per device, each driven by a thread of its own.

A job takes a free slot (a forge.evaluate.parent.Worker on this host, or a Ray actor of forge.evaluate.cluster),
judges one candidate on it and gives it back, so N slots judge N candidates at once while the builds run
ahead on the CPU cores. Important: a slot judges one candidate at a time: its device's clock is never shared.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from forge.errors import UserError

log = logging.getLogger(__name__)
S = TypeVar("S")
R = TypeVar("R")


class Lost(Exception):  # noqa: N818 - an event, not an error
    """A slot was lost while it judged (a Ray actor died, its node went away): the job runs again on the next
    free slot; `result` is what the job gives when every try was lost."""

    def __init__(self, message: str, result: object) -> None:
        super().__init__(message)
        self.result = result


class Slots(Generic[S]):
    """A fixed set of slots and a thread per slot; `submit(job)` runs job(slot) on the next free one."""

    def __init__(self, slots: Sequence[S], tries: int = 3) -> None:
        """`tries`: how often a job that raises Lost runs (each time on the next free slot)."""
        self.tries = tries
        self.lost = 0  # jobs whose slot was lost under them (each ran again)
        if not slots:
            raise ValueError("no judging slots")
        self.all = list(slots)
        self._free: queue.Queue[S] = queue.Queue()
        self._closing = threading.Event()  # close(): a job that has not taken its slot yet judges nothing
        for s in self.all:
            self._free.put(s)
        # twice as many threads as slots: a job waiting for its build (`ready`) holds a thread, not a slot
        self._pool = cf.ThreadPoolExecutor(max_workers=2 * len(self.all), thread_name_prefix="forge-judge")

    def __len__(self) -> int:
        return len(self.all)

    def busy(self) -> list[S]:
        """The slots judging now (taken by a job), as far as a look at the free ones can tell."""
        with self._free.mutex:  # the queue's own lock: a deque copied while another thread puts raises
            free = list(self._free.queue)
        return [s for s in self.all if s not in free]

    def submit(self, job: Callable[[S], R], ready: Callable[[], object] | None = None) -> cf.Future[R]:
        """Run `job` on a free slot (waiting for one) once `ready()` has returned (a build: no slot idles while
        it waits for one); the future holds what the job returns."""

        def run() -> R:
            if ready is not None:
                ready()
            for attempt in range(self.tries):
                slot = self._free.get()
                try:
                    if self._closing.is_set():
                        raise cf.CancelledError("the evaluator is closing")
                    return job(slot)
                except Lost as e:
                    self.lost += 1
                    log.warning("%s (try %d of %d)", e, attempt + 1, self.tries)
                    if attempt + 1 == self.tries:
                        return e.result  # type: ignore[return-value]
                finally:
                    self._free.put(slot)
            raise AssertionError("unreachable")

        return self._pool.submit(run)

    def close(self) -> None:
        """Wait for the jobs judging now, drop the others (waiting for a build or a slot: cancelled) and stop
        the threads."""
        self._closing.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Scale:
    """Where candidates are judged: `workers` worker processes on this host (one per GPU on CUDA: `--gpus`;
    CPU workers: `--workers`), or the actors of a Ray cluster (`ray`: its address, or "auto")."""

    workers: int = 1
    ray: str | None = None

    @staticmethod
    def parse_gpus(text: str, available: int) -> int:
        """`--gpus N|all` -> N; ValueError for anything else or more GPUs than there are."""
        if text == "all":
            n = available
        else:
            try:
                n = int(text)
            except ValueError:
                raise ValueError(f"Invalid --gpus: {text!r} (a number of GPUs, or all)") from None
        if n < 1 or n > available:
            raise ValueError(f"Invalid --gpus: {text!r} (this host has {available} GPU{'s' * (available != 1)})")
        return n


def devices_for(device: str, workers: int) -> list[str]:
    """The devices of `workers` workers: cuda:0..N-1 for CUDA (one per GPU; N=1 keeps the device named), N
    times "cpu" on the CPU."""
    if workers < 1:
        raise UserError(f"at least one worker is needed, not {workers}")
    if device.startswith("cuda"):
        return [device] if workers == 1 else [f"cuda:{i}" for i in range(workers)]
    return [device] * workers
