"""Timed calls judged at random (the worker's half, around forge.bench.interleaved; forge.evaluate.judge judges).

A kernel that is right on the calls verification makes and wrong on the others (one that switches to a
copy after a few calls, drifts a little more every call, or caches its result keyed on a few sampled input
elements) would be timed doing less than the work. So, before every round (warm-up included):
- a few input elements at random positions get new values (positions and values from the system's random
  source), so a result cached on anything less than all of the inputs is stale; an integer or boolean input's
  new values are ones it held at other positions (an index stays one verification drew:
  forge.evaluate.integers);
- some timed calls, drawn at random, are kept: one among the first `min_runs` timed rounds (which always
  happen), later ones with a chance of LATER each; their inputs are copied before the call (outside the
  timed region) and their outputs kept; after timing each kept output is judged against the reference on
  its own inputs as verification judges (NaN/Inf, tolerance, integer equality), by forge.evaluate.judge in forge's
  process: the worker copies the kept calls into slots of the shared arena (forge.evaluate.arena).
Which calls are kept cannot be told from the call: every call gets fresh outputs and perturbed inputs, and
the kept inputs' copies are allocated before the first round (every round allocates alike: a kept call's
outputs get the address the others get).

A task that does far more arithmetic than it moves bytes (a GEMM, a convolution, attention: the judge decides,
forge.evaluate.measured.renews) gets all of its inputs drawn anew every round instead (an integer or boolean
one permuted): with 8 elements changed a round, a kernel that kept the last inputs and result could find what
changed and update the result at the cost of reading its inputs, right on every call and timed far below the
work (for a pointwise or reduction task that costs what the work does). A round then costs a draw of all its
inputs: on a CPU about what the call costs (the judge's cross-check allows a round's cost 1.5x, not the 3x it
allows the call: forge.evaluate.judge.ROUND_RATIO).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from forge.capture.export import TensorMeta, empty_output
from forge.evaluate.domains import into

_SYSTEM = random.SystemRandom()
PERTURBED = 8  # input elements changed before every round
SURE = 1  # kept calls drawn among the timed rounds that always happen (min_runs)
LATER = 1 / 16  # chance that a later round is kept, up to MAX_KEPT in all
MAX_KEPT = 2
KEEP_BYTES = 1 << 30  # fewer kept calls when a call's inputs and outputs are larger than this over MAX_KEPT


class SpotCheck:
    """Perturbs the inputs before each round and keeps the outputs of random calls (see the module doc)."""

    def __init__(self, inputs: list[torch.Tensor], outputs: tuple[TensorMeta, ...], sure_rounds: int,
                 device: str, domains: dict[int, str] | None = None, renew: bool = False) -> None:
        """`sure_rounds`: how many timed rounds the timing makes at least (the first kept calls are among
        them); `domains`: the inputs whose new values stay in a domain (forge.evaluate.domains); `renew`:
        every round draws all floating-point inputs anew and permutes the others (forge.evaluate.measured.renews),
        not only a few elements."""
        self.inputs, self.outputs, self.device = inputs, outputs, device
        self.limit = kept_limit(tuple(TensorMeta.of(x) for x in inputs), outputs)
        rounds = max(sure_rounds, 1)
        self.sure = set(_SYSTEM.sample(range(rounds), min(SURE, self.limit, rounds)))
        gen = torch.Generator(device=inputs[0].device if inputs else "cpu")  # where normal_ draws in place
        gen.manual_seed(_SYSTEM.getrandbits(63))
        self._plans = [p for p in (_Perturbation(x, gen, (domains or {}).get(j, ""), renew)
                                   for j, x in enumerate(inputs)) if p.flat is not None]
        self._turn = 0
        self.round = -1
        self.pending: list[torch.Tensor] | None = None
        self.kept: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        # The kept calls' input copies, allocated now: a copy made in its round would take the block the
        # allocator hands a call's outputs round after round, and a kept call's outputs would land elsewhere (a
        # kernel that computed only when its output address changed was timed skipping, and judged computing).
        self._copies = [[torch.empty_like(x) for x in inputs] for _ in range(self.limit)]

    def prepare(self, timed: bool) -> None:
        """Before a round: new values at random input positions; for a timed round that is kept, a copy of
        the inputs."""
        for p in self._plans:
            p.apply(self._turn)
        self._turn += 1
        self.pending = None
        if not timed:
            return
        self.round += 1  # of the timed rounds
        keep = self.round in self.sure or (self.round > max(self.sure, default=0) and _SYSTEM.random() < LATER)
        if keep and len(self.kept) < self.limit:
            self.pending = self._copies[len(self.kept)]
            for copy, x in zip(self.pending, self.inputs, strict=True):
                copy.copy_(x)

    def wrap(self, call: Callable[[list[torch.Tensor], list[torch.Tensor]], None]) -> Callable[[], None]:
        """The candidate's timed callable: fresh outputs every call (a fair clock), kept when drawn."""
        outputs = self.outputs

        def cand() -> None:
            outs = [empty_output(m, self.device) for m in outputs]
            call(self.inputs, outs)
            if self.pending is not None:
                self.kept.append((self.pending, outs))
                self.pending = None
        return cand

    def store(self, slots: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> int:
        """Copy the kept calls into the judge's slots (per kept call: its inputs, row-major, and its outputs);
        how many were kept. The judge compares them with the reference in its own process."""
        for (inputs, outs), (in_slots, out_slots) in zip(self.kept, slots, strict=False):
            for t, s in zip([*inputs, *outs], [*in_slots, *out_slots], strict=True):
                s.copy_(t)
        return min(len(self.kept), len(slots))


def kept_limit(inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...]) -> int:
    """How many timed calls may be kept for a task (fewer for large ones: each is a copy of its tensors)."""
    size = sum(m.nbytes for m in inputs) + sum(m.nbytes for m in outputs)
    return max(1, min(MAX_KEPT, KEEP_BYTES // max(size, 1)))


TURNS = 512  # rounds of perturbation drawn at once (then drawn anew)
_DRAWN = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})  # normal_ draws them in place
_UNINDEXED = frozenset({torch.uint16, torch.uint32, torch.uint64})  # index_put_ has no kernel for them


class _Perturbation:
    """PERTURBED elements of an input get new values every round, at random positions: N(0,1) for a
    floating-point input; for another (integer, boolean) values it held at other positions when the timing
    began, so that an index stays one verification drew and the values never drift to a few. All rounds'
    positions and values drawn at once, so that a round costs one indexed write an input (a few microseconds of
    launch on a GPU, not a dozen small kernels), anew every TURNS rounds. `renew`: all of its elements get new
    values every round: N(0,1) drawn in place, or a permutation of the values it held."""

    def __init__(self, x: torch.Tensor, gen: torch.Generator, domain: str = "", renew: bool = False) -> None:
        self.flat: torch.Tensor | None = None
        self.domain, self.renew = domain, renew
        span = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True)) if x.numel() else 0
        if x.numel() == 0 or x.dim() == 0 or span != x.numel() or x.dtype in _UNINDEXED:
            return  # a scalar, an input whose elements share memory (expanded), or one index_put_ cannot write
        self.flat, self.gen, self.span = x.as_strided((span,), (1,)), gen, span
        self.held = None if x.is_floating_point() else self.flat.clone()  # an integer or boolean input's values
        if not renew:
            self._draw()

    def _draw(self) -> None:
        assert self.flat is not None
        dev, x = self.gen.device, self.flat
        self.index = torch.randint(0, self.span, (TURNS, PERTURBED), generator=self.gen, device=dev).to(x.device)
        if self.held is None:
            values = into(torch.randn(TURNS, PERTURBED, generator=self.gen, device=dev), self.domain)
        else:
            source = torch.randint(0, self.span, (TURNS, PERTURBED), generator=self.gen, device=dev)
            values = self.held[source.to(x.device)]
        self.values = values.to(x.device, x.dtype)

    def apply(self, turn: int) -> None:
        assert self.flat is not None
        if self.renew:
            self._renew()
            return
        t = turn % TURNS
        if t == 0 and turn:  # drawn anew every TURNS rounds: states never come back (warm-up runs by time)
            self._draw()
        self.flat.index_put_((self.index[t],), self.values[t])

    def _renew(self) -> None:
        """Every element anew: N(0,1) in place, mapped into the domain; or a permutation of the values held."""
        flat = self.flat
        assert flat is not None
        if self.held is not None:
            perm = torch.randperm(self.span, generator=self.gen, device=self.gen.device)
            flat.copy_(self.held[perm.to(flat.device)])
        elif flat.device == self.gen.device and flat.dtype in _DRAWN:
            flat.normal_(generator=self.gen)
            if self.domain:
                flat.copy_(into(flat, self.domain))
        else:  # on another device than the first input's, or a dtype normal_ does not draw (float8)
            flat.copy_(into(torch.randn(self.span, generator=self.gen, device=self.gen.device), self.domain))
