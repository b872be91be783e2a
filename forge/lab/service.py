"""The lab's work: an entry built (lowered, its kernel judged and cached) and run live on a person's settings.

A forge kernel runs only in the evaluator's sandboxed worker (forge.evaluate): judged once per content key
(forge.lab.cache), then called on the person's inputs (Evaluator.call) and timed again against eager
(Evaluator.retime). The vendor path runs the entry's own PyTorch function here: it is the catalogue's code,
not a candidate. Either way the outcome carries the numbers and the tensors the pictures are drawn from.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from forge.bench import BenchConfig, Clock, interleaved
from forge.evaluate.evaluator import Evaluator
from forge.kernel import EvalResult
from forge.lab.cache import Cache, EntryState, Verdict, content_key
from forge.lab.catalogue import Entry
from forge.lab.inputs import Settings, make, parse_settings
from forge.lab.lower import Lowered, lower
from forge.policy.recipes.policy import RecipePolicy
from forge.tasks.cut import compile_source

log = logging.getLogger(__name__)
LAB_BENCH = BenchConfig(warmup_s=0.02, budget_s=0.15, min_runs=10, max_runs=200)


@dataclass(frozen=True)
class Outcome:
    """One live run: which path ran, its verdict, the tensors (CPU) and the numbers."""

    path: str  # "forge" | "vendor"
    why: str  # why the vendor path ran
    status: str  # the forge kernel's verdict ("" on the vendor path without one)
    message: str
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]  # the kernel's (forge) or eager's (vendor)
    eager: tuple[torch.Tensor, ...]  # eager's (forge), or the float64 reference's (vendor)
    max_error: float | None
    us: float | None
    eager_us: float | None
    task: str = ""
    kernel_source: str = ""
    task_source: str = ""


def default_settings(entry: Entry) -> Settings:
    """The entry's settings when the person sets nothing."""
    return parse_settings(entry.inputs, {}, entry.param_bounds, (entry.lo, entry.hi))


def max_error(outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...]) -> float | None:
    """The largest absolute difference over all outputs (booleans as 0/1); None when shapes differ."""
    worst = 0.0
    for o, r in zip(outs, refs, strict=False):
        if o.shape != r.shape:
            return None
        if o.numel():
            worst = max(worst, float((o.double() - r.double()).abs().nan_to_num(float("inf")).max()))
    return worst


class Lab:
    """The lab on one device: its policy, evaluator (started on first use), cache and clock."""

    def __init__(self, device: str = "cpu", cache_dir: Path | None = None) -> None:
        from forge.lab.cache import default_dir

        self.device = device
        self.cache = Cache(cache_dir or default_dir(), device)
        self.policy = RecipePolicy(device)
        self.lock = threading.Lock()  # one run at a time: one worker, one clock
        self._evaluator: Evaluator | None = None
        self._clock: Clock | None = None
        self._lowered: dict[tuple[object, ...], Lowered] = {}

    @property
    def evaluator(self) -> Evaluator:
        """The sandboxed evaluator (its worker starts on the first kernel)."""
        if self._evaluator is None:
            self._evaluator = Evaluator(self.device, bench=LAB_BENCH, timeout_s=60.0)
        return self._evaluator

    def lowered(self, entry: Entry, inputs: list[torch.Tensor], p: float) -> Lowered:
        """The entry lowered at these inputs (remembered by shapes and parameter)."""
        key = (entry.slug, tuple(tuple(x.shape) for x in inputs), p)
        if key not in self._lowered:
            self._lowered[key] = lower(entry.fn, inputs, p, self.policy)
        return self._lowered[key]

    def verdict(self, low: Lowered) -> tuple[str, Verdict]:
        """The forge kernel's verdict: from the cache, else judged now (and kept)."""
        assert low.spec is not None and low.candidate is not None
        key = content_key(self.device, low.spec.source, low.candidate.digest)
        cached = self.cache.verdict(key)
        if cached is not None:
            return key, cached
        res = self.evaluator.evaluate(low.spec, low.candidate)
        v = Verdict(res.status.value, res.message[:500], res.timing and res.timing.median_us,
                    res.baseline and res.baseline.median_us, res.build_s, res.device_s)
        self.cache.put_verdict(key, v)
        return key, v

    def build(self, entry: Entry) -> EntryState:
        """The entry at its default settings: lowered, its forge kernel judged (or the cache's verdict)."""
        with self.lock:
            s = default_settings(entry)
            low = self.lowered(entry, make(entry.inputs, s), s.param)
            if not low.forge:
                state = EntryState(entry.slug, "vendor", low.why, task=low.spec.key if low.spec else "")
            else:
                assert low.spec is not None
                key, v = self.verdict(low)
                state = EntryState(entry.slug, "forge", "", v.status, v.us, v.eager_us, low.spec.key, key)
            self.cache.put_state(state)
            return state

    def run(self, entry: Entry, s: Settings) -> Outcome:
        """One live run of the entry on these settings (see the module doc)."""
        with self.lock:
            inputs = make(entry.inputs, s)
            low = self.lowered(entry, inputs, s.param)
            if not low.forge:
                return self._vendor(entry, s, inputs, low.why, low)
            key, v = self.verdict(low)
            if s == default_settings(entry):
                assert low.spec is not None
                self.cache.put_state(EntryState(entry.slug, "forge", "", v.status, v.us, v.eager_us,
                                                low.spec.key, key))
            if not v.ok:
                return self._vendor(entry, s, inputs, f"forge's kernel failed verification ({v.status}: "
                                    f"{v.message[:200]})", low, v.status)
            return self._forge(entry, s, inputs, low, v)

    def _forge(self, entry: Entry, s: Settings, inputs: list[torch.Tensor], low: Lowered, v: Verdict) -> Outcome:
        assert low.spec is not None and low.candidate is not None
        ins = [inputs[i].to(self.device) for i in low.order]
        got = self.evaluator.call(low.spec, low.candidate, ins)
        if isinstance(got, EvalResult):
            return self._vendor(entry, s, inputs, f"forge's kernel failed on these inputs ({got.status.value}: "
                                f"{got.message[:200]})", low, got.status.value)
        eager = tuple(compile_source(low.spec.source)(*ins))
        timed = self.evaluator.retime(low.spec, low.candidate, LAB_BENCH)
        us, eager_us = v.us, v.eager_us
        if timed.timing and timed.baseline:
            us, eager_us = timed.timing.median_us, timed.baseline.median_us
        outs = tuple(o.cpu() for o in got)
        eager = tuple(e.cpu() for e in eager)
        return Outcome("forge", "", v.status, "", tuple(inputs), outs, eager, max_error(outs, eager), us, eager_us,
                       low.spec.key, low.candidate.source, low.spec.source)

    def _vendor(self, entry: Entry, s: Settings, inputs: list[torch.Tensor], why: str, low: Lowered,
                status: str = "") -> Outcome:
        """The entry's PyTorch function here, timed by forge's clock, checked against float64."""
        ins = [x.to(self.device) for x in inputs]
        try:
            outs = _tuple(entry.fn(*ins, p=s.param))
        except (RuntimeError, ValueError, IndexError) as e:
            raise ValueError(f"Invalid settings for {entry.slug}: {type(e).__name__}: {str(e)[:200]}") from None
        try:
            ref = _tuple(entry.fn(*[x.double() for x in ins], p=s.param))
        except (RuntimeError, NotImplementedError):  # an op without float64: no reference to show
            ref = ()
        if self._clock is None:
            self._clock = Clock(self.device)
        timing = interleaved(self._clock, [lambda: entry.fn(*ins, p=s.param)], LAB_BENCH)[0]
        outs = tuple(o.cpu() for o in outs)
        ref = tuple(r.cpu() for r in ref)
        return Outcome("vendor", why, status, "", tuple(inputs), outs, ref or outs,
                       max_error(outs, ref) if ref else None, None, timing.median_us,
                       low.spec.key if low.spec else "", "", low.spec.source if low.spec else "")

    def close(self) -> None:
        """Stop the evaluator's worker."""
        if self._evaluator is not None:
            self._evaluator.close()
            self._evaluator = None


def _tuple(out: object) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out.detach(),)
    return tuple(t.detach() for t in out if isinstance(t, torch.Tensor))  # type: ignore[union-attr]


def timed(fn: object) -> float:
    """Seconds a call takes (the build command's report)."""
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start
