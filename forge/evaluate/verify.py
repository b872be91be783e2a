"""Verification of a candidate against its task's reference (in forge's process: forge.evaluate.judge).

Method (docs/verification.md):
- four input sets with fresh random values per call: three never zero, of growing magnitude and spread
  (N(0,1); 3*N(0,1)+0.5; 10*N(0,1)-1, which gives softmax logits around +-30), then the hard values
  (zeros, magnitudes at the edge of exp's overflow, large magnitudes, negatives: `_hard`);
- outputs are allocated by the harness inside a larger buffer, filled with a NaN whose payload is drawn for the
  buffer (forge.evaluate.guarded); the zones before and after each output hold random bits that must stay
  (out-of-bounds writes) and no output element may keep the NaN (partial write);
- inputs are compared bit for bit with this process's copy as the call returns, and the outputs judged are
  copied then (work left running cannot change what is judged);
- the reference runs in higher precision (fp16/bf16 -> fp32, fp32 -> fp64, dtype casts in the region
  promoted the same way); error = max |c - r| / (|r| + mean|r|) over elements where the reference
  (in the output dtype) and eager's own result are finite; it must be within max(TOLERANCE[dtype],
  2 x the eager error);
- NaN or Inf where the reference and eager are finite fails; the same output for different inputs (a cached
  result) fails; a constant output where the reference is not constant fails;
- timed calls are judged at random (forge.evaluate.spotcheck); after timing, the judge verifies once more on the
  N(0,1) and the hard values from a new secret seed, each set in its own place, every output watched from
  its call's return until a moment after the last call returned.
The candidate runs in a worker (a `Target`); inputs and outputs are shared with it (forge.evaluate.arena), while the
inputs the reference reads, the copies they are compared with and every verdict stay in this process.
"""

from __future__ import annotations

import logging
import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from forge.capture.export import TensorMeta
from forge.capture.scans import precise
from forge.evaluate.domains import input_domains, into
from forge.evaluate.guarded import Guarded
from forge.evaluate.integers import integers, signed_inputs
from forge.evaluate.verdicts import Verdict, judge_output, judged
from forge.kernel import Status
from forge.tasks.cut import compile_source

SCALES = ((1.0, 0.0), (3.0, 0.5), (10.0, -1.0))
SETS = len(SCALES) + 1  # input sets a verification runs: the scales, then the hard values
log = logging.getLogger(__name__)
_HIGHER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}


def make_input(meta: TensorMeta, k: int, gen: torch.Generator, device: str, signed: bool = False,
               domain: str = "") -> torch.Tensor:
    """Input set k for one tensor, with the meta's shape, dtype and stride: random and never zero for the
    sets of SCALES, the hard values (`_hard`) for the last of the SETS; integers as
    forge.evaluate.integers draws them (`signed`: the input may be negative, `Reference.signed`); floats mapped
    into the input's `domain` where it has one (forge.evaluate.domains, `Reference.domains`)."""
    return make_flat(meta, k, gen, device, signed, domain).as_strided(meta.shape, meta.stride)


def make_flat(meta: TensorMeta, k: int, gen: torch.Generator, device: str, signed: bool = False,
              domain: str = "") -> torch.Tensor:
    """The storage of `make_input`'s tensor: every element its strides reach, in order."""
    span = 1 + sum((s - 1) * st for s, st in zip(meta.shape, meta.stride, strict=True)) if meta.numel else 0
    dtype = meta.torch_dtype
    dev = gen.device  # generated where the generator lives: on the GPU for CUDA workers (fast)
    if dtype.is_floating_point:
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        if k % SETS == len(SCALES):
            flat = _hard(span, dtype, wide, gen)
        else:
            scale, shift = SCALES[k % SETS]
            flat = torch.randn(span, generator=gen, dtype=wide, device=dev)
            if (scale, shift) != (1.0, 0.0):
                flat.mul_(scale).add_(shift)
            flat.masked_fill_((flat.to(dtype) if dtype != wide else flat) == 0, 0.5)
        flat = into(flat, domain)
    elif dtype == torch.bool:
        flat = torch.randint(0, 2, (span,), generator=gen, device=dev).bool()
    else:
        flat = integers(span, dtype, k % SETS == len(SCALES), signed, gen)
    return flat.to(dtype).to(device)


def _hard(n: int, dtype: torch.dtype, wide: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """The values naive kernels get wrong, mixed at random: an eighth zeros, an eighth within a few units of
    where exp overflows in `dtype` (ln of its largest value: about 88.7 for float32 and bfloat16, 11.1 for
    float16), either sign, an eighth of magnitude 64 to 1024, either sign, the rest 3*N(0,1). Two draws: one
    uniform gives the kind (its eighth), the sign (the half of that) and the magnitude (the rest)."""
    dev = gen.device
    x = torch.randn(n, generator=gen, dtype=wide, device=dev).mul_(3)
    r = torch.rand(n, generator=gen, dtype=wide, device=dev).mul_(8)
    kind = r.floor()
    u = r.sub_(kind).mul_(2)
    half = u.floor()
    u.sub_(half)  # the magnitude's fraction; `half` the sign: 1 - 2 * half
    edge = math.log(torch.finfo(dtype).max)
    x.masked_fill_(kind == 0, 0.0)
    x = torch.where(kind == 1, (u * 4).add_(edge - 3).mul_(half.mul(-2).add_(1)), x)
    return torch.where(kind == 2, (u * 960).add_(64).mul_(half.mul_(-2).add_(1)), x)


def random_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Finite random values of t's shape and dtype (what a reused buffer holds: not a poison)."""
    if t.is_floating_point():
        return (torch.randn(t.shape, generator=gen, device=gen.device) * 3).to(t.dtype).to(t.device)
    high = 2 if t.dtype == torch.bool else 16
    return torch.randint(0, high, t.shape, generator=gen, device=gen.device).to(t.dtype).to(t.device)


def generator(device: str, seed: int) -> torch.Generator:
    """A seeded generator on the device's type (CUDA inputs are made on the GPU)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return torch.Generator(device=kind).manual_seed(seed)


def _promote_source(source: str) -> str:
    return re.sub(r"torch\.(float16|bfloat16|float32)\b",
                  lambda m: {"float16": "torch.float32", "bfloat16": "torch.float32",
                             "float32": "torch.float64"}[m.group(1)], source)


def _promote(t: torch.Tensor) -> torch.Tensor:
    """A copy in the higher precision (a copy at its own dtype where there is none: the reference may write it)."""
    return t.to(_HIGHER[t.dtype]) if t.dtype in _HIGHER else t.clone()


class Reference:
    """The task's reference at its own dtype (eager) and in higher precision."""

    def __init__(self, source: str) -> None:
        self.eager = compile_source(source)
        self.high = compile_source(_promote_source(source))
        self.signed = signed_inputs(source)  # the inputs that may hold negative integers
        self.domains = input_domains(source)  # the inputs drawn in a domain (a scan's log decay, its rates)

    def __call__(self, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        with torch.no_grad():
            eager = list(self.eager(*[x.clone() for x in inputs]))
            try:
                with precise():  # a scan's reference in float64 (forge.capture.scans)
                    high = list(self.high(*[_promote(x) for x in inputs]))
            except Exception:  # an op without a higher-precision kernel: compare with eager only
                high = [e.clone() for e in eager]
        return eager, high


class Target(ABC):
    """The candidate as the judge reaches it: placed tensors are shared with the process that runs it."""

    @abstractmethod
    def place(self, inputs: Sequence[TensorMeta], buffers: Sequence[tuple[int, torch.dtype]]
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Shared tensors for one call: one per input meta (its shape and strides), and flat buffers of
        (elements, dtype) for the outputs. Valid until the next `place`."""

    @abstractmethod
    def call(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Run the candidate once on placed tensors (after this process's own work on them is done) and wait
        until it returned; a failure raises forge.evaluate.remote.Rejected with its result."""

    @abstractmethod
    def sync(self) -> None:
        """Wait for this process's own device work."""


def fill(view: torch.Tensor, flat: torch.Tensor) -> None:
    """Write `flat` (make_flat's storage) into a placed input, every element its strides reach."""
    if flat.numel():
        view.as_strided((flat.numel(),), (1,)).copy_(flat)


TOGETHER_BYTES = 1 << 30  # a verification whose sets take more than this in all places (and settles) one at a time


def _settled(watched: list[_Set], settle_s: float, since: float, sync: Callable[[], None], detail: dict[str, Any]
             ) -> Verdict | None:
    """Once `settle_s` has passed since `since` (the last call's return): the first set whose output buffers
    changed from their copy taken as its call returned (`forbidden_concurrency`), or whose inputs changed from
    this process's copy since (`input_mutated`: its call compared them as it returned); None if none did."""
    time.sleep(max(0.0, settle_s - (time.perf_counter() - since)))
    sync()
    for s in watched:
        if any(not torch.equal(o.raw, f.raw) for o, f in zip(s.outs, s.frozen, strict=True)):
            return Verdict(Status.FORBIDDEN_CONCURRENCY, f"set {s.k}: an output changed after the call returned "
                           "(work left running on a thread or stream)", detail)
        j = s.changed_input()
        if j is not None:
            return Verdict(Status.INPUT_MUTATED, f"set {s.k}: input {j} changed after the call returned (work "
                           "left running on a thread or stream, or another call writing it)", detail)
    return None


def _first_failure(upto: list[_Set], bad: Verdict | None, settle_s: float, since: float, sync: Callable[[], None],
                   detail: dict[str, Any]) -> Verdict | None:
    """As with the sets judged one at a time: a change in the sets up to a failing one (`upto`: all of them
    without a failure) once they settled, else the failure `bad`, else None."""
    return (_settled(upto, settle_s, since, sync, detail) if settle_s else None) or bad


@dataclass
class _Set:
    """One input set of a verification as placed and called: its kind, the placed inputs, this process's own copy
    of them, the guarded outputs, and as the call returned: a copy of the outputs (`frozen`, what is judged) and
    the first input that differed from this process's copy (`mutated`)."""

    k: int
    inputs: list[torch.Tensor]
    mine: list[torch.Tensor]
    outs: list[Guarded]
    frozen: list[Guarded] = field(default_factory=list)
    mutated: int | None = None

    def returned(self) -> None:
        """What the call left, taken as it returned: work it left running cannot change what is judged (and
        what it changes later is seen by `_settled`)."""
        self.frozen = [o.frozen() for o in self.outs]
        self.mutated = self.changed_input()

    def changed_input(self) -> int | None:
        """The first placed input that differs from this process's copy, or None."""
        return next((j for j, (x, m) in enumerate(zip(self.inputs, self.mine, strict=True))
                     if not torch.equal(x, m)), None)


def _judge_set(s: _Set, eager: list[torch.Tensor], high: list[torch.Tensor], outputs_meta: tuple[TensorMeta, ...],
               previous: tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]] | None,
               detail: dict[str, Any]) -> tuple[Verdict | None, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A called set's inputs (unchanged by the call?) and outputs (as the call returned) judged; the failure, if
    any, and the set's eager outputs with their judged masks (for the next set's same-output check)."""
    row: dict[str, Any] = {"set": s.k}
    detail["sets"].append(row)
    if s.mutated is not None:
        return Verdict(Status.INPUT_MUTATED, f"input {s.mutated} changed during the call", detail), []
    masks = [judged(e, h, o.tensor.dtype) for o, e, h in zip(s.frozen, eager, high, strict=True)]
    for i, (o, e, h, m, finite) in enumerate(zip(s.frozen, eager, high, outputs_meta, masks, strict=True)):
        prev = None if previous is None else (previous[0][i], *previous[1][i])
        bad = judge_output(f"output {i} ({m.short()})", o, e, h, m, finite, prev, row, f"set {s.k}", i)
        if bad is not None:
            if bad.mismatch is not None:
                detail["mismatch"] = {**bad.mismatch.as_dict(), "set": s.k}
            return replace(bad, detail=detail), []
    return None, list(zip(eager, masks, strict=True))


def _prepared(ref: Reference, k: int, inputs_meta: tuple[TensorMeta, ...],
              outputs_meta: tuple[TensorMeta, ...], device: str, seed: int, finite_fill: bool,
              placed: tuple[list[torch.Tensor], list[torch.Tensor]]) -> _Set:
    """Set k's inputs drawn and filled into `placed` (its inputs and output buffers), its outputs guarded."""
    gen = generator(device, seed * 1000 + k)
    flats = [make_flat(m, k, gen, device, j in ref.signed, ref.domains.get(j, ""))
             for j, m in enumerate(inputs_meta)]
    for view, flat in zip(placed[0], flats, strict=True):
        fill(view, flat)
    mine = [f.as_strided(m.shape, m.stride) for f, m in zip(flats, inputs_meta, strict=True)]  # never shared
    outs = [Guarded(m, device, finite_fill, b) for m, b in zip(outputs_meta, placed[1], strict=True)]
    return _Set(k, placed[0], mine, outs)


def verify(target: Target, ref: Reference, inputs_meta: tuple[TensorMeta, ...],
           outputs_meta: tuple[TensorMeta, ...], device: str, seed: int, settle_s: float = 0.0,
           finite_fill: bool = False, kinds: tuple[int, ...] = tuple(range(SETS))) -> Verdict:
    """Run the candidate on fresh input sets of the `kinds` (indices into the SETS: the scales, then the hard
    values; all by default) and judge every output; see the module docstring.
    `settle_s`: every set placed at once, each output copied as its call returned, and once `settle_s` has
    passed after the last call, an output or input that changed since fails (work left running on a thread or
    stream after a call returned): one wait for all the sets, during which they are judged (one a set, each placed
    alone, where all of them would take more than TOGETHER_BYTES). `finite_fill`: outputs pre-filled with
    finite random values instead of the poison (see Guarded). What is judged is taken as each call returns (its
    outputs copied, its inputs compared with this process's copy), and the reference runs on that copy after
    the call: so the sets placed together are judged while the outputs settle. A call that fails after an
    earlier set was called gives way to that set's failure or change, as one set at a time would."""
    detail: dict[str, Any] = {"sets": []}
    # An index output (argmax, a sort) must equal eager's, and the hard values are full of ties (zeros; the
    # overflow edge in half precision) that a right kernel may break another way: such tasks run set 1 in
    # that set's place (where it is not among the kinds already), so that a verification keeps its two sets.
    index = any(not m.torch_dtype.is_floating_point and m.torch_dtype != torch.bool for m in outputs_meta)
    ks = list(dict.fromkeys(1 if index and k == len(SCALES) else k for k in kinds))
    sizes = [(Guarded.size(m), m.torch_dtype) for m in outputs_meta]
    n_in, n_out = len(inputs_meta), len(outputs_meta)
    call_bytes = sum(m.nbytes for m in inputs_meta) + sum(n * d.itemsize for n, d in sizes)
    together = bool(settle_s) and len(ks) * call_bytes <= TOGETHER_BYTES
    every = target.place(list(inputs_meta) * len(ks), sizes * len(ks)) if together else None
    called: list[_Set] = []  # called, not yet judged (with settle_s, all the sets placed together are)
    previous, returned = None, time.perf_counter()
    for at, k in enumerate(ks):
        placed = target.place(inputs_meta, sizes) if every is None else \
            (every[0][at * n_in:(at + 1) * n_in], every[1][at * n_out:(at + 1) * n_out])
        s = _prepared(ref, k, inputs_meta, outputs_meta, device, seed, finite_fill, placed)
        try:
            target.call(s.inputs, [o.tensor for o in s.outs])
        except Exception:  # the call's failure (forge.evaluate.remote.Rejected): after an earlier set's, as one by one
            bad, _, upto = _judge_called(called, ref, outputs_meta, previous, detail)
            found = _first_failure(called[:upto], bad, settle_s, returned, target.sync, detail)
            if found is not None:
                return found
            ref(s.mine)  # a broken reference is one whatever the candidate did
            raise
        returned = time.perf_counter()
        s.returned()
        called.append(s)
        if together and at < len(ks) - 1:
            continue  # judged after the last call, while the outputs settle
        bad, previous, upto = _judge_called(called, ref, outputs_meta, previous, detail)
        found = _first_failure(called[:upto], bad, settle_s, returned, target.sync, detail)
        if found is not None:
            return found
        called = []
    detail["max_err"] = max((v for r in detail["sets"] for kk, v in r.items() if kk.startswith("err")),
                            default=0.0)
    return Verdict(Status.OK, "", detail)


def _judge_called(called: list[_Set], ref: Reference, outputs_meta: tuple[TensorMeta, ...],
                  previous: tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]] | None,
                  detail: dict[str, Any]
                  ) -> tuple[Verdict | None, tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]] | None,
                             int]:
    """The called sets judged in order against the reference on their inputs: the first failure (or None), the
    last set judged as the next one's `previous` (its outputs, eager's and their judged masks), and how many of
    the sets count (up to the failing one; all without a failure)."""
    for at, s in enumerate(called):
        eager, high = ref(s.mine)
        bad, ref_now = _judge_set(s, eager, high, outputs_meta, previous, detail)
        if bad is not None:
            return bad, previous, at + 1
        previous = ([f.tensor for f in s.frozen], ref_now)  # copies already
    return None, previous, len(called)
