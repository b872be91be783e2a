"""Timed calls judged at random (runs inside the worker, around forge.bench.interleaved).

A kernel that is right on the calls verification makes and wrong on the others (one that switches to a
copy after a few calls, drifts a little more every call, or caches its result keyed on a few sampled input
elements) would be timed doing less than the work. So, before every round (warm-up included):
- a few input elements at random positions get new values (positions and values from the system's random
  source), so a result cached on anything less than all of the inputs is stale;
- some timed calls, drawn at random, are kept: one among the first `min_runs` timed rounds (which always
  happen), later ones with a chance of LATER each; their inputs are copied before the call (outside the
  timed region) and their outputs kept; after timing each kept output is judged against the reference on
  its own inputs as verification judges (NaN/Inf, tolerance, integer equality).
Which calls are kept cannot be told from the call: every call gets fresh outputs and perturbed inputs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import torch

from forge.capture import TensorMeta
from forge.verify import Reference, Verdict, judged, nonfinite, within_tolerance

_SYSTEM = random.SystemRandom()
PERTURBED = 8  # input elements changed before every round
SURE = 1  # kept calls drawn among the timed rounds that always happen (min_runs)
LATER = 1 / 16  # chance that a later round is kept, up to MAX_KEPT in all
MAX_KEPT = 2
KEEP_BYTES = 1 << 30  # fewer kept calls when a call's inputs and outputs are larger than this over MAX_KEPT


class SpotCheck:
    """Perturbs the inputs before each round and keeps the outputs of random calls (see the module doc)."""

    def __init__(self, inputs: list[torch.Tensor], outputs: tuple[TensorMeta, ...], sure_rounds: int,
                 device: str) -> None:
        """`sure_rounds`: how many timed rounds the timing makes at least (the first kept calls are among
        them)."""
        self.inputs, self.outputs, self.device = inputs, outputs, device
        size = sum(x.numel() * x.element_size() for x in inputs) + sum(m.nbytes for m in outputs)
        self.limit = max(1, min(MAX_KEPT, KEEP_BYTES // max(size, 1)))
        rounds = max(sure_rounds, 1)
        self.sure = set(_SYSTEM.sample(range(rounds), min(SURE, self.limit, rounds)))
        self.gen = torch.Generator(device="cuda" if device.startswith("cuda") else "cpu")
        self.gen.manual_seed(_SYSTEM.getrandbits(63))
        self.round = -1
        self.pending: list[torch.Tensor] | None = None
        self.kept: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def prepare(self, timed: bool) -> None:
        """Before a round: new values at random input positions; for a timed round that is kept, a copy of
        the inputs."""
        for x in self.inputs:
            _perturb(x, self.gen)
        self.pending = None
        if not timed:
            return
        self.round += 1  # of the timed rounds
        keep = self.round in self.sure or (self.round > max(self.sure, default=0) and _SYSTEM.random() < LATER)
        if keep and len(self.kept) < self.limit:
            self.pending = [x.clone() for x in self.inputs]

    def wrap(self, call: Callable[[list[torch.Tensor], list[torch.Tensor]], None]) -> Callable[[], None]:
        """The candidate's timed callable: fresh outputs every call (a fair clock), kept when drawn."""
        shapes = [(m.shape, m.torch_dtype) for m in self.outputs]

        def cand() -> None:
            outs = [torch.empty(s, dtype=d, device=self.device) for s, d in shapes]
            call(self.inputs, outs)
            if self.pending is not None:
                self.kept.append((self.pending, outs))
                self.pending = None
        return cand

    def judge(self, ref: Reference) -> Verdict | None:
        """After timing: a verdict on the first kept call that is wrong, or None when all are right."""
        for n, (inputs, outs) in enumerate(self.kept):
            eager, high = ref(inputs)
            for i, (o, e, h, m) in enumerate(zip(outs, eager, high, self.outputs, strict=True)):
                name, finite = f"timed call {n + 1} of {len(self.kept)} kept, output {i} ({m.short()})", \
                    judged(e, h, o.dtype)
                bad = nonfinite(name, o, finite) or within_tolerance(name, o, e, h, finite, m.dtype, {}, "timed", i)
                if bad is not None:
                    return replace(bad, detail={"kept": len(self.kept), "rounds": self.round + 1})
        return None


def _perturb(x: torch.Tensor, gen: torch.Generator) -> None:
    """PERTURBED elements of a floating-point input at random positions get N(0,1) values (in place)."""
    if not x.is_floating_point() or x.numel() == 0 or x.dim() == 0:
        return
    dev = gen.device
    index = tuple(torch.randint(0, s, (PERTURBED,), generator=gen, device=dev).to(x.device) for s in x.shape)
    values = torch.randn(PERTURBED, generator=gen, device=dev).to(x.device, x.dtype)
    try:
        x.index_put_(index, values)
    except RuntimeError:  # an input whose elements share memory (expanded): left as it is
        pass
