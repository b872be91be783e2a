"""The judge: verification, timing checks and the verdict, in forge's process, out of the candidate's reach.

A candidate runs only in a worker (forge.evaluate.child); the judge sends it steps (forge.evaluate.remote) and
reads what they wrote in the arena both map (forge.evaluate.arena). Everything that decides the verdict stays
here: the inputs the reference reads and the copies inputs are compared with, the reference in higher precision,
the error, the roofline floor's bandwidth, and a clock the candidate cannot reach. One evaluation:
1. `Load`, then verification on two of the SETS (FIRST: N(0,1) and the hard values) from the request's seed
   (forge.evaluate.verify);
2. called twice on the same buffers, on the two other SETS (forge.evaluate.repeats), new inputs and random
   outputs in between, both calls judged: work skipped on a repeated call (or a result kept by pointer);
3. `Time`: the worker times candidate and eager interleaved with its clock, inputs perturbed every round,
   random timed calls kept; the judge compares the kept calls with the reference; rounds whose spread says
   they were disturbed (either side's p90 over SPREAD times its p10) are timed once more, the less disturbed
   attempt counting, and the verdict's detail says so (`disturbed`);
4. the cross-check of the worker's clock: batches of rounds, perturbed and kept like the timed ones, timed
   here by the wall clock around each step; the least disturbed (whose kept calls are judged) must not take
   longer a round than the claimed candidate time allows (RATIO times it and the rounds' own overhead
   measured here, plus SLACK_US); one over that by no more than the launch path the worker's clock leaves out
   (the flush and pad queued ahead of each call: measured.hidden_us) is ranked by this clock's time a call
   instead; on a disagreement beyond that the candidate is timed and checked again, a second is
   `forbidden_timer`. A claimed eager time over EAGER_RATIO times eager's as timed here (plus SLACK_US) is
   replaced by this process's measurement;
5. verification again on FIRST's sets from a secret seed, outputs pre-filled with finite values, each watched
   from its call's return until a moment after the last call returned; then the roofline floor.
A candidate timed again (`retime`: forge.search.confirm's timing, which picks a task's winner) is loaded and
skips step 1's verification; steps 2 to 5 hold for it as they do here.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from forge.bench import BenchConfig
from forge.capture.export import output_view
from forge.evaluate.measured import bandwidth, hidden_us, measured_here, remeasured, renews
from forge.evaluate.remote import Rejected, Remote
from forge.evaluate.repeats import skips_repeats
from forge.evaluate.spotcheck import kept_limit
from forge.evaluate.steps import EvalRequest, Load, Reply
from forge.evaluate.verdicts import Verdict, off_reference
from forge.evaluate.verify import SETS, Reference, fill, generator, make_flat, verify
from forge.kernel import EvalResult, Status, TaskSpec, Timing

if TYPE_CHECKING:
    from forge.evaluate.parent import Worker

RATIO = 3.0  # how far the judge's clock may exceed the worker's before the times are called made up (2 was
# exceeded honestly with two test suites sharing two cores: a call's time is heavy-tailed there)
EAGER_RATIO = 2.0  # how far the worker's eager may exceed the judge's before the judge's is used
SLACK_US = 50.0  # per round, on top: launch and loop costs the judge cannot see
ROUND_RATIO = 1.5  # how far a round's own cost (perturbing, fresh outputs) may exceed what the judge measured: not
# RATIO, since a round that draws all inputs anew (forge.evaluate.measured.renews) can cost more than the call,
# and RATIO times it let a claim 20x below a 256^3 product's time through on the CPU
SPREAD = 2.0  # a timing whose p90 is over this many times its p10 was disturbed: timed once more (`_settled`)
BATCH_S = 0.02  # claimed time of the cross-check's batches, together
SPLIT = 3  # batches: the least disturbed one counts
MIN_ROUNDS = 2  # a batch's rounds at least (more for calls shorter than BATCH_S / SPLIT)
ALLOWANCE_S = 0.002  # the step's own round trip (pipe, mapping the arena)
# Verified before timing on N(0,1) and the hard values (what most wrong kernels fail, before the timing is
# spent on them), and after it on the same two from a secret seed: N(0,1) as the timed calls' inputs are (a
# kernel cannot tell the check after timing from a timed call by its values), the hard values for the edges.
# The two other scales are the repeated call's two calls (forge.evaluate.repeats), judged too: every set, every
# evaluation (an index task has no hard values: forge.evaluate.verify).
FIRST = (0, SETS - 1)
_SYSTEM = random.SystemRandom()

log = logging.getLogger(__name__)


class _Laps:
    """Seconds each step of one evaluation took, summed by name (`phases_s` in a passing result's detail: where
    the judge's time goes, benchmarks/eval_throughput.py)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.s: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.s[name] = self.s.get(name, 0.0) + now - self.last
        self.last = now

    def rounded(self) -> dict[str, float]:
        return {name: round(s, 4) for name, s in self.s.items()}


def evaluate(worker: Worker, req: EvalRequest, timeout_s: float) -> EvalResult:
    """One candidate judged (see the module doc); every failure is a result with its status. CUDA work of the
    judge's runs on the worker's device (its streams, its synchronisations)."""
    if worker.device.startswith("cuda"):
        with torch.cuda.device(worker.device):
            return _evaluate(worker, req, timeout_s)
    return _evaluate(worker, req, timeout_s)


def _evaluate(worker: Worker, req: EvalRequest, timeout_s: float) -> EvalResult:
    start = time.perf_counter()
    device = worker.device

    def result(status: Status, message: str = "", **kw: object) -> EvalResult:
        return EvalResult(status, message, device=device, device_s=time.perf_counter() - start, **kw)

    try:
        ref = Reference(req.task.source)
    except Exception as e:
        return result(Status.REFERENCE_ERROR, f"{type(e).__name__}: {e}")
    remote = Remote(worker, device, start + timeout_s)
    task, lap = req.task, _Laps()
    try:
        rate = bandwidth(device)  # before any timing: a measurement ahead (measure_ahead) is not beside one
        remote.step(Load(task, req.backend, req.path, req.entry))
        lap("load")
        if req.retime and req.bench is not None:  # verified before: timed again, held to the same checks
            return _timed_and_after(remote, ref, task, req, rate, lap, result, {}, again=True)
        # without timing (bench None) there is no verification after it: every set now
        verdict = verify(remote, ref, task.inputs, task.outputs, device, req.seed,
                         kinds=FIRST if req.bench is not None else tuple(range(SETS)))
        if verdict.status is not Status.OK or req.bench is None:
            return result(verdict.status, verdict.message, verify=verdict.detail)
        lap("verify")
        return _timed_and_after(remote, ref, task, req, rate, lap, result, verdict.detail, again=False)
    except Rejected as r:
        return replace(r.result, device=device, device_s=time.perf_counter() - start)
    except (torch.OutOfMemoryError, MemoryError) as e:  # the judge's own copies and references
        return result(Status.OUT_OF_MEMORY, f"judging: {type(e).__name__}: {str(e)[:300]}")
    except Exception as e:  # noqa: BLE001 - a failure is a result: the search goes on
        log.exception("judging %s failed", task.key)
        return result(Status.REFERENCE_ERROR, f"judging failed: {type(e).__name__}: {str(e)[:400]}")
    finally:
        worker.arena.reset()
        worker.arena.shrink()


def _timed_and_after(remote: Remote, ref: Reference, task: TaskSpec, req: EvalRequest, rate: float, lap: _Laps,
                     result: Callable[..., EvalResult], detail: dict[str, Any], again: bool) -> EvalResult:
    """Steps 2 to 5, after the verification of step 1 (its `detail`), or `again` for a candidate verified before
    and timed again (forge.search.confirm: the timing its task's winner is picked by), its messages saying so: a
    kernel that tells the confirmation from the search gains nothing by it."""
    assert req.bench is not None

    def said(message: str) -> str:
        return ("timed again" + (f": {message}" if message else "")) if again else message

    skipped = skips_repeats(remote, ref, task, remote.device, req.seed)
    if skipped is not None:
        return result(skipped.status, said(skipped.message), verify=detail)
    lap("repeats")
    try:
        timing, baseline, notes = _checked_timing(remote, ref, task, remote.device, req, detail, lap)
    except Rejected as r:
        if not again:
            raise
        raise Rejected(replace(r.result, message=said(r.result.message))) from None
    detail = {**detail, **{k: v for k, v in notes.items() if v}}
    baseline, detail = _eager_check(ref, task, remote.device, baseline, req.bench, detail)
    lap("eager")
    late = _late(remote, ref, task)
    if late.status is not Status.OK:
        return result(late.status, f"{'timed again, then' if again else 'after timing'}: {late.message}",
                      verify=detail)
    lap("late")
    detail = {**detail, "phases_s": lap.rounded()}
    floor_us, too_fast = _floor(task, remote.device, rate, timing.median_us, req.floor_factor)
    return result(Status.TOO_FAST if too_fast else Status.OK, said(too_fast), verify=detail, timing=timing,
                  baseline=baseline, floor_us=floor_us)


def _late(remote: Remote, ref: Reference, task: TaskSpec) -> Verdict:
    """The calls judged are not only the first ones: FIRST's sets again, from a seed drawn here, after all the
    timed calls, into outputs holding finite values (not the NaN poison a kernel could look for), each output
    watched for a moment after its call returned."""
    return verify(remote, ref, task.inputs, task.outputs, remote.device, _SYSTEM.getrandbits(40), settle_s=0.02,
                  finite_fill=True, kinds=FIRST)


def _floor(task: TaskSpec, device: str, rate: float, median_us: float, factor: float) -> tuple[float | None, str]:
    """The task's roofline floor in microseconds, and why the median is too fast for it ("" when it is not): the
    floor at `rate` (measured before timing), or at the rate measured again when the median is below `factor`
    times the floor (the rate was measured once)."""
    floor_us = task.floor_bytes / rate * 1e6 if rate else None
    if floor_us and median_us < factor * floor_us:
        rate = remeasured(device)
        floor_us = task.floor_bytes / rate * 1e6
        if median_us < factor * floor_us:
            return floor_us, (f"median {median_us:.2f} us is below the roofline floor {floor_us:.2f} us "
                              f"({task.floor_bytes} bytes at {rate / 1e9:.0f} GB/s)")
    return floor_us, ""


def _checked_timing(remote: Remote, ref: Reference, task: TaskSpec, device: str, req: EvalRequest,
                    detail: dict[str, Any], lap: _Laps) -> tuple[Timing, Timing, dict[str, str]]:
    """Steps 3 and 4: the timed rounds (their kept calls judged; `_settled`) and the cross-check of the worker's
    clock; on a disagreement timed and checked once more before it counts (a busy machine disturbs either), and
    notes for the verdict's detail (`disturbed`: timed again; `clock`: ranked by the judge's clock). Raises
    Rejected with the verdict of a wrong kept call or of a clock that disagrees twice."""
    assert req.bench is not None
    disagree = ""
    for again in range(2):
        timing, baseline, wrong, note = _settled(remote, ref, task, device, req.seed + again, req.bench)
        if wrong is not None:
            raise Rejected(EvalResult(wrong.status, wrong.message, verify={**detail, "timed": wrong.detail}))
        assert timing is not None and baseline is not None
        lap("timed")
        disagree, judged = _batch_check(remote, ref, task, device, timing, req.bench)
        lap("batch")
        if judged is not None:
            log.info("%s: %s", task.key, disagree)
            return judged, baseline, {"disturbed": note, "clock": disagree}
        if not disagree:
            return timing, baseline, {"disturbed": note}
    # the claimed timing stays for review; the worker's eager, never checked, is no baseline anything counts
    raise Rejected(EvalResult(Status.FORBIDDEN_TIMER, disagree, verify=detail, timing=timing))


def _inputs(remote: Remote, ref: Reference, task: TaskSpec, device: str, seed: int,
            extra: Sequence[tuple[int, torch.dtype]]
            ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Timing inputs (set 0 of `seed * 1000 + 7`) placed and filled, the extra buffers, and this
    process's own copy of the inputs."""
    gen = generator(device, seed * 1000 + 7)
    flats = [make_flat(m, 0, gen, device, j in ref.signed, ref.domains.get(j, "")) for j, m in enumerate(task.inputs)]
    placed, bufs = remote.place(task.inputs, extra)
    for view, flat in zip(placed, flats, strict=True):
        fill(view, flat)
    mine = [f.as_strided(m.shape, m.stride) for f, m in zip(flats, task.inputs, strict=True)]
    return placed, bufs, mine


def _kept_buffers(task: TaskSpec, limit: int) -> list[tuple[int, torch.dtype]]:
    return [(m.numel, m.torch_dtype) for _ in range(limit) for m in (*task.inputs, *task.outputs)]


def _kept_views(task: TaskSpec, bufs: list[torch.Tensor]) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    per = len(task.inputs) + len(task.outputs)
    metas = (*task.inputs, *task.outputs)
    calls = []
    for c in range(len(bufs) // per):
        views = [b.view(m.shape) if k < len(task.inputs) else output_view(b, m)  # inputs kept row-major
                 for k, (b, m) in enumerate(zip(bufs[c * per:(c + 1) * per], metas, strict=True))]
        calls.append((views[:len(task.inputs)], views[len(task.inputs):]))
    return calls


def judge_kept(ref: Reference, task: TaskSpec, kept: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
                where: str) -> Verdict | None:
    """The first kept call whose outputs are wrong for its own inputs, or None."""
    for n, (inputs, outs) in enumerate(kept):
        eager, high = ref([x.clone() for x in inputs])
        for i, (o, e, h, m) in enumerate(zip(outs, eager, high, task.outputs, strict=True)):
            bad, _ = off_reference(f"{where} call {n + 1} of {len(kept)} kept, output {i} ({m.short()})", o, e, h,
                                   m.dtype, where, i)
            if bad is not None:
                return replace(bad, detail={"kept": len(kept)})
    return None


def _kept_some(reply: Reply, limit: int, where: str, device: str) -> None:
    """A timing step keeps one call at least (drawn among the rounds that always run) and at most `limit`:
    a worker that says otherwise kept nothing the judge could check."""
    if not 1 <= reply.kept <= limit:
        raise Rejected(EvalResult(Status.FORBIDDEN_TIMER, f"{where} rounds came back with {reply.kept} kept calls "
                                  f"(1 to {limit} are drawn): nothing to judge them by", device=device))


def _spread(t: Timing | None) -> float:
    """A timing's p90 over its p10 (0 for none)."""
    return t.p90_us / max(t.p10_us, 1e-9) if t is not None else 0.0


def _settled(remote: Remote, ref: Reference, task: TaskSpec, device: str, seed: int, bench: BenchConfig
             ) -> tuple[Timing | None, Timing | None, Verdict | None, str]:
    """`_timed`, and once more when the candidate's or eager's spread says the rounds were disturbed (p90 over
    SPREAD times p10: on an H100 a GPU shared for a moment gave Helion kernels medians of 10-62 us at p10s of 5-8,
    and the search ranked them by those); the attempt less disturbed counts, by its spread and not its median (no
    kernel is given the faster of two by its median; the spreads are the worker's, so a kernel can steer which of
    its own two timings counts, and the cross-check holds that one to the judge's clock). The note (empty when
    undisturbed) says what was timed again."""
    first = _timed(remote, ref, task, device, seed, bench)
    worst = max(_spread(first[0]), _spread(first[1]))
    if first[2] is not None or worst <= SPREAD:
        return (*first, "")
    second = _timed(remote, ref, task, device, seed, bench)
    again = max(_spread(second[0]), _spread(second[1]))
    if second[2] is not None:
        return (*second, "")
    note = f"timed again: p90 {worst:.1f}x p10 (over {SPREAD:g}x), then {again:.1f}x"
    log.info("%s: %s", task.key, note)
    return (*(second if again < worst else first), note)


def _timed(remote: Remote, ref: Reference, task: TaskSpec, device: str, seed: int, bench: BenchConfig
           ) -> tuple[Timing | None, Timing | None, Verdict | None]:
    limit = kept_limit(task.inputs, task.outputs)
    placed, bufs, _ = _inputs(remote, ref, task, device, seed, _kept_buffers(task, limit))
    kept = _kept_views(task, bufs)
    reply, _ = remote.time(placed, kept, bench, renew=renews(task))
    _kept_some(reply, limit, "timed", remote.device)
    wrong = judge_kept(ref, task, kept[:reply.kept], "timed")
    return reply.timing, reply.baseline, wrong


def _eager_check(ref: Reference, task: TaskSpec, device: str, baseline: Timing, bench: BenchConfig,
                 detail: dict[str, Any]) -> tuple[Timing, dict[str, Any]]:
    """The worker's eager time, or this process's own where the worker's is more than EAGER_RATIO times it (plus
    SLACK_US) twice: a candidate cannot make its baseline slower than the judge sees it (a busy machine, or
    a candidate's spinning threads, can slow the worker's eager honestly too: so not a rejection)."""
    here, _ = measured_here(ref, task, device, bench)
    if baseline.median_us <= EAGER_RATIO * here.median_us + min(SLACK_US, here.median_us):
        return baseline, detail
    here, _ = measured_here(ref, task, device, bench, again=True)
    if baseline.median_us <= EAGER_RATIO * here.median_us + min(SLACK_US, here.median_us):
        return baseline, detail
    note = (f"the worker's eager median {baseline.median_us:.1f} us is more than {EAGER_RATIO:g}x forge's own "
            f"({here.median_us:.1f} us): the candidate is ranked against forge's")
    log.info("%s: %s", task.key, note)
    return here, {**detail, "eager_disagrees": note}


def _batch_check(remote: Remote, ref: Reference, task: TaskSpec, device: str, timing: Timing,
                 bench: BenchConfig) -> tuple[str, Timing | None]:
    """A batch of rounds timed by this process's clock against the worker's median: ("", None) when they agree;
    (why, None) when they disagree; (why, the time by this clock) when the difference is within the launch path
    the worker's clock leaves out by design (hidden_us: a Python launcher's, eager's several launches): the
    candidate is then ranked by this clock's time a call, which no claim can lower."""
    _, round_us = measured_here(ref, task, device, bench)
    claimed = timing.median_us
    limit = kept_limit(task.inputs, task.outputs)
    placed, bufs, _ = _inputs(remote, ref, task, device, _SYSTEM.getrandbits(40), _kept_buffers(task, limit))
    # the step's costs outside the rounds, at this device's copy rate: mapping the arena, copying kept calls
    call_bytes = sum(m.nbytes for m in (*task.inputs, *task.outputs))
    allowance = ALLOWANCE_S + (remote.arena.size + 4 * limit * call_bytes) / bandwidth(device)
    n = max(MIN_ROUNDS, min(100, math.ceil(max(BATCH_S / SPLIT, 2 * allowance) * 1e6 / max(claimed + round_us, 1.0))))
    per_round, kept, decisive, renew = float("inf"), _kept_views(task, bufs), [], renews(task)
    for _ in range(SPLIT):  # the least disturbed of several batches: a busy machine slows some of them
        reply, wall = remote.time(placed, kept, bench, batch=n, renew=renew)
        _kept_some(reply, limit, "batched", device)
        if (wall - allowance) / n * 1e6 < per_round:  # its kept calls, as they came back, judged if it decides
            per_round = (wall - allowance) / n * 1e6
            decisive = [([x.clone() for x in i], [o.clone() for o in out]) for i, out in kept[:reply.kept]]
    # The batch whose time is held against the claim is judged: one that ran fast by computing less is wrong
    # there (the others' times count for nothing, so neither do their outputs).
    wrong = judge_kept(ref, task, decisive, "batched")
    if wrong is not None:
        raise Rejected(EvalResult(wrong.status, wrong.message, verify={"batched": wrong.detail}, device=device))
    return batch_verdict(per_round, timing, round_us, hidden_us(device), n)


def batch_verdict(per_round: float, timing: Timing, round_us: float, hidden: float, n: int
                  ) -> tuple[str, Timing | None]:
    """`_batch_check`'s decision on the judge's time a round (the least disturbed of SPLIT batches of `n`), the
    worker's timing, a round's own cost and the launch path the worker's clock leaves out (`hidden`). A
    candidate ranked by the judge's clock keeps its timing's spread and interval, scaled to the judge's median
    (a point with no interval would look certain to forge.confidence, and win where intervals overlap)."""
    claimed = timing.median_us
    allowed = RATIO * claimed + ROUND_RATIO * round_us + SLACK_US
    if per_round <= allowed:
        return "", None
    if per_round <= allowed + hidden:  # a launch path up to what the clock hides (flush, pad) can explain it
        here = max(per_round - round_us, claimed)
        return (f"ranked by forge's clock: {SPLIT} batches of {n} calls took {per_round:.1f} us a call, more than "
                f"the worker's {claimed:.1f} us allows ({allowed:.1f}) and within the launch path the clock leaves "
                f"out ({hidden:.1f} us)"), scaled(timing, here / max(claimed, 1e-9))
    return (f"the worker's clock disagrees with forge's: {SPLIT} batches of {n} calls took at least "
            f"{per_round:.1f} us a call by forge's clock, the worker measured {claimed:.1f} us (allowed up "
            f"to {allowed:.1f})"), None


def scaled(t: Timing, k: float) -> Timing:
    """`t` with every time multiplied by `k` (its spread and interval relative to its median kept)."""
    def times(v: float | None) -> float | None:
        return None if v is None else v * k
    return replace(t, median_us=t.median_us * k, p10_us=t.p10_us * k, p90_us=t.p90_us * k, mean_us=t.mean_us * k,
                   std_us=t.std_us * k, ci_lo_us=times(t.ci_lo_us), ci_hi_us=times(t.ci_hi_us))
