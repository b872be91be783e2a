"""The worker as the judge sees it: steps sent over the pipe, tensors placed in the arena both map, and a step
that ends an evaluation raised as `Rejected` with its result. forge.evaluate.judge decides the verdict over it;
the Helion autotune (forge.evaluate.autotune) and the lab's calls (forge.evaluate.live) send their steps so too.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from forge.bench import BenchConfig
from forge.capture.export import TensorMeta
from forge.evaluate.arena import Arena, Slot
from forge.evaluate.steps import Call, Load, Reply, Time, Tune
from forge.evaluate.verify import Target
from forge.kernel import EvalResult, Status

if TYPE_CHECKING:
    from forge.evaluate.parent import Worker


class Rejected(Exception):  # noqa: N818 - a verdict, not an error
    """A step that ended the evaluation: the result says how (timeout, crash, the candidate's status)."""

    def __init__(self, result: EvalResult) -> None:
        super().__init__(result.message)
        self.result = result



class Remote(Target):
    """The worker as the judge's target: steps over the pipe, tensors in the arena."""

    def __init__(self, worker: Worker, device: str, deadline: float) -> None:
        self.worker, self.device, self.deadline = worker, device, deadline
        self.arena: Arena = worker.arena
        self.cuda = device.startswith("cuda")
        self.loaded: Load | None = None

    def step(self, msg: object) -> tuple[Reply, float]:
        """Send one step; its reply and the judge's wall seconds for it. Raises Rejected on a failure."""
        if isinstance(msg, Load):
            self.loaded = msg
        self.sync()
        start = time.perf_counter()
        reply = self.worker.exchange(msg, max(self.deadline - start, 1.0))
        wall = time.perf_counter() - start
        if isinstance(reply, EvalResult):  # the worker timed out or died
            raise Rejected(reply)
        if reply.status is not Status.OK:
            raise Rejected(EvalResult(reply.status, reply.message, device=self.device))
        return reply, wall

    def place(self, inputs: Sequence[TensorMeta], buffers: Sequence[tuple[int, torch.dtype]]
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        a = self.arena
        a.reset()
        ins = a.plan(inputs)
        a.page()  # the inputs' pages hold nothing else: they are read-only during a verification call
        bufs = [a.flat(n, d) for n, d in buffers]
        self._ref = a.open()
        return [a.view(s) for s in ins], [a.view(s) for s in bufs]

    def slot(self, t: torch.Tensor) -> Slot:
        """Where a placed tensor (or a view of one) lies in the arena."""
        dtype = str(t.dtype).removeprefix("torch.")
        if t.numel() == 0:  # an empty tensor is no place in the arena
            return Slot(0, tuple(t.shape), tuple(t.stride()), dtype)
        return Slot(t.data_ptr() - self.arena.data_ptr, tuple(t.shape), tuple(t.stride()), dtype)

    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """With the inputs read-only (CPU); a call that dies so (SIGSEGV) is run again writable, and one that
        then returns wrote into an input: `input_mutated`, whether it restored the input or not."""
        ins, outs = tuple(self.slot(t) for t in inputs), tuple(self.slot(t) for t in outputs)
        try:
            self.step(Call(self._ref, ins, outs, readonly=not self.cuda))
            return
        except Rejected as r:
            if self.cuda or r.result.status is not Status.CRASH or self.worker.last_exit != -signal.SIGSEGV:
                raise
        saved = [t.clone() for t in inputs]  # intact: they were read-only when it died
        assert self.loaded is not None
        self.step(self.loaded)  # into the new worker
        self.step(Call(self.arena.open(), ins, outs))
        restored = all(torch.equal(t, s) for t, s in zip(inputs, saved, strict=True))
        raise Rejected(EvalResult(Status.INPUT_MUTATED, "wrote into an input during the call" + (
            " and restored it after" if restored else "") + " (read-only inputs made it crash)", device=self.device))

    def time(self, inputs: Sequence[torch.Tensor], kept: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
             bench: BenchConfig, batch: int = 0, renew: bool = False) -> tuple[Reply, float]:
        """A Time step on placed inputs, kept calls into placed slots."""
        slots = tuple((tuple(self.slot(t) for t in i), tuple(self.slot(t) for t in o)) for i, o in kept)
        return self.step(Time(self._ref, tuple(self.slot(t) for t in inputs), slots, bench, batch, renew))

    def tune(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], effort: str, budget_s: int
             ) -> tuple[Reply, float]:
        """A Tune step (Helion's autotuner, forge.evaluate.autotune) on placed inputs and outputs."""
        ins, outs = tuple(self.slot(t) for t in inputs), tuple(self.slot(t) for t in outputs)
        return self.step(Tune(self._ref, ins, outs, effort, budget_s))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
