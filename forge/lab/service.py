"""The lab's work: an entry built (lowered, its kernels judged and cached) and run live on a person's settings;
a kernel the user's runs found (forge.lab.found) run live the same way.

What runs where, and why:
- forge kernels (the recipe policy's, and the stored ones the user's runs found) run only in the evaluator's
  sandboxed worker (forge.evaluate): each of the policy's first few kernels (forge.lab.lower.IDEAS) is built,
  verified and timed there once per content key (forge.lab.cache); the fastest that verified is the entry's
  kernel, called on the person's inputs (Evaluator.call) and timed again against eager there (Evaluator.retime).
- the eager reference of a forge kernel (the task's source, which forge rendered from the captured graph) is
  computed in this process, as forge's judge computes its references (forge.evaluate.judge): it is not
  candidate code.
- the vendor path runs the entry's own PyTorch function in this process, timed by forge's clock: it is the
  catalogue's code, trusted like eager, not a candidate.
Requests come at once from the web app's threads: lowering is one at a time (torch.export is not thread-safe),
judging holds a lock per task (a slow first build blocks only requests for the same task), the worker runs one
kernel at a time (its judging slot), and vendor timings are taken one at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from forge.bench import BenchConfig, Clock, interleaved
from forge.evaluate.evaluator import Evaluator
from forge.kernel import Candidate, EvalResult, TaskSpec
from forge.lab.cache import Cache, EntryState, Verdict, content_key
from forge.lab.catalogue import Entry
from forge.lab.found import Found, make_inputs
from forge.lab.inputs import Settings, make, parse_settings
from forge.lab.lower import IDEAS, Lowered, lower
from forge.lab.memo import KeyLocks, Recent
from forge.search.confirm import KEEPS_FIRST
from forge.tasks.cut import compile_source

log = logging.getLogger(__name__)
LAB_BENCH = BenchConfig(warmup_s=0.02, budget_s=0.15, min_runs=10, max_runs=200)
LOWERED_MAX = 256  # entries lowered at given shapes kept in memory (each a task and a few kernel sources)


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
    knobs: str = ""  # the schedule that ran
    tried: int = 0  # kernels judged to choose it


@dataclass(frozen=True)
class Judged:
    """A task's kernels judged: the one the lab runs (the fastest that verified, else the first) and its verdict."""

    key: str  # its verdict's content key
    verdict: Verdict
    candidate: Candidate
    knobs: str
    tried: int
    passed: int


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
    """The lab on one device: its evaluator (started on first use), cache, locks and clock (see the module doc)."""

    def __init__(self, device: str = "cpu", cache_dir: Path | None = None, ideas: int = IDEAS) -> None:
        from forge.lab.cache import default_dir

        self.device = device
        self.ideas = ideas
        self.cache = Cache(cache_dir or default_dir(), device)
        self.locks = KeyLocks()  # one judgement per task at a time
        self.lowered_at: Recent[tuple[object, ...], Lowered] = Recent(LOWERED_MAX)
        self._capture = threading.Lock()  # torch.export, one at a time
        self._timing = threading.Lock()  # this process's clock, one timing at a time
        self._start = threading.Lock()
        self._evaluator: Evaluator | None = None
        self._clock: Clock | None = None

    @property
    def evaluator(self) -> Evaluator:
        """The sandboxed evaluator (its worker starts on the first kernel)."""
        with self._start:
            if self._evaluator is None:
                self._evaluator = Evaluator(self.device, bench=LAB_BENCH, timeout_s=60.0)
            return self._evaluator

    def lowered(self, entry: Entry, inputs: list[torch.Tensor], p: float) -> Lowered:
        """The entry lowered at these inputs (the LOWERED_MAX most recent kept, by shapes and parameter)."""

        def make_it() -> Lowered:
            with self._capture:
                return lower(entry.fn, inputs, p, self.device, self.ideas)

        return self.lowered_at.get((entry.slug, tuple(tuple(x.shape) for x in inputs), p), make_it)

    def judge(self, spec: TaskSpec, cands: tuple[Candidate, ...], knobs: tuple[str, ...]) -> Judged:
        """The task's kernels judged (cached verdicts read, the others built, verified and timed now and kept);
        the fastest that verified, else the first with its failure."""
        keys = [content_key(self.device, spec.source, c.digest) for c in cands]
        with self.locks.hold(content_key(self.device, spec.source, "")):
            verdicts = [self.cache.verdict(k) for k in keys]
            todo = [i for i, v in enumerate(verdicts) if v is None]
            if todo:
                ev = self.evaluator
                for built in [ev.builds.submit(cands[i]) for i in todo]:
                    built.result()  # compiled first: no judging slot waits on a compiler meanwhile
                for i, res in zip(todo, ev.evaluate_many(spec, [cands[i] for i in todo]), strict=True):
                    verdicts[i] = Verdict(res.status.value, res.message[:500], res.timing and res.timing.median_us,
                                          res.baseline and res.baseline.median_us, res.build_s, res.device_s)
                    self.cache.put_verdict(keys[i], verdicts[i])  # type: ignore[arg-type]
        done = [v for v in verdicts if v is not None]
        ok = [i for i, v in enumerate(done) if v.ok and v.us]
        best = min(ok, key=lambda i: done[i].us or 0.0) if ok else 0
        return Judged(keys[best], done[best], cands[best], knobs[best] if knobs else "", len(cands), len(ok))

    def build(self, entry: Entry) -> EntryState:
        """The entry at its default settings: lowered, its forge kernels judged (or the cache's verdicts)."""
        s = default_settings(entry)
        low = self.lowered(entry, make(entry.inputs, s), s.param)
        state = self._state(entry, low, self.judge(low.spec, low.candidates, low.knobs) if low.forge else None)
        self.cache.put_state(state)
        return state

    def _state(self, entry: Entry, low: Lowered, j: Judged | None) -> EntryState:
        if j is None or low.spec is None:
            return EntryState(entry.slug, "vendor", low.why, task=low.spec.key if low.spec else "")
        v = j.verdict
        return EntryState(entry.slug, "forge", "", v.status, v.us, v.eager_us, low.spec.key, j.key, j.knobs, j.tried)

    def run(self, entry: Entry, s: Settings) -> Outcome:
        """One live run of the entry on these settings (see the module doc)."""
        inputs = make(entry.inputs, s)
        low = self.lowered(entry, inputs, s.param)
        if not low.forge or low.spec is None:
            return self._vendor(entry, s, inputs, low.why, low)
        j = self.judge(low.spec, low.candidates, low.knobs)
        if s == default_settings(entry):
            self.cache.put_state(self._state(entry, low, j))
        if not j.verdict.ok:
            return self._vendor(entry, s, inputs, f"forge's kernels failed verification ({j.verdict.status}: "
                                f"{j.verdict.message[:200]})", low, j.verdict.status)
        got = self.forge_run(low.spec, j, [inputs[i] for i in low.order])
        if isinstance(got, EvalResult):
            return self._vendor(entry, s, inputs, f"forge's kernel failed on these inputs ({got.status.value}: "
                                f"{got.message[:200]})", low, got.status.value)
        return dataclasses.replace(got, inputs=tuple(inputs))  # as the entry takes them (pictures)

    def run_found(self, found: Found, lo: float, hi: float) -> Outcome:
        """A kernel the user's runs found, run live on inputs over [lo, hi]: judged here once (cached by content),
        then run as the catalogue's kernels are; where it fails, eager's result with the reason."""
        if not found.runs_on(self.device):
            raise ValueError(f"Invalid run: {found.slug} is a {found.backend} kernel and this lab runs on "
                             f"{self.device}")
        spec = found.spec()
        inputs = make_inputs(spec, lo, hi)
        j = self.judge(spec, (found.candidate(),), (found.knobs_text,))
        if not j.verdict.ok:
            return self._eager(spec, inputs, f"the stored kernel failed verification here ({j.verdict.status}: "
                               f"{j.verdict.message[:200]})", j.verdict.status)
        got = self.forge_run(spec, j, inputs)
        if isinstance(got, EvalResult):
            return self._eager(spec, inputs, f"the stored kernel failed on these inputs ({got.status.value}: "
                               f"{got.message[:200]})", got.status.value)
        return got

    def forge_run(self, spec: TaskSpec, j: Judged, inputs: list[torch.Tensor]) -> Outcome | EvalResult:
        """A judged kernel called on these inputs (in the task's order) in the worker and timed again against
        eager there; eager's outputs computed here. A failure of the call, or of its timing, is its EvalResult."""
        ins = [x.to(self.device) for x in inputs]
        got = self.evaluator.call(spec, j.candidate, ins)
        if isinstance(got, EvalResult):
            return got
        eager = tuple(e.cpu() for e in compile_source(spec.source)(*ins))
        timed = self.evaluator.retime(spec, j.candidate, LAB_BENCH)
        if not timed.status.passed and timed.status not in KEEPS_FIRST:
            return timed  # found wrong when timed again (its clock, its kept calls): eager runs, and says why
        us, eager_us = j.verdict.us, j.verdict.eager_us
        if timed.status.passed and timed.timing and timed.baseline:
            us, eager_us = timed.timing.median_us, timed.baseline.median_us
        outs = tuple(o.cpu() for o in got)
        return Outcome("forge", "", j.verdict.status, "", tuple(inputs), outs, eager, max_error(outs, eager), us,
                       eager_us, spec.key, j.candidate.source, spec.source, j.knobs, j.tried)

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
        with self._timing:
            if self._clock is None:
                self._clock = Clock(self.device)
            timing = interleaved(self._clock, [lambda: entry.fn(*ins, p=s.param)], LAB_BENCH)[0]
        outs = tuple(o.cpu() for o in outs)
        ref = tuple(r.cpu() for r in ref)
        return Outcome("vendor", why, status, "", tuple(inputs), outs, ref or outs,
                       max_error(outs, ref) if ref else None, None, timing.median_us,
                       low.spec.key if low.spec else "", "", low.spec.source if low.spec else "")

    def _eager(self, spec: TaskSpec, inputs: list[torch.Tensor], why: str, status: str) -> Outcome:
        """The task's eager code here (the reference, not a candidate), timed by forge's clock."""
        ins = [x.to(self.device) for x in inputs]
        eager = compile_source(spec.source)
        outs = tuple(o.detach().cpu() for o in eager(*ins))
        with self._timing:
            if self._clock is None:
                self._clock = Clock(self.device)
            timing = interleaved(self._clock, [lambda: eager(*ins)], LAB_BENCH)[0]
        return Outcome("vendor", why, status, "", tuple(inputs), outs, outs, None, None, timing.median_us,
                       spec.key, "", spec.source)

    def close(self) -> None:
        """Stop the evaluator's worker."""
        with self._start:
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
