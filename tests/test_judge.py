"""The judge in its own process (issue 13 item 1): a worker a candidate has taken over cannot change the
verdict or the times it is ranked by. Real worker processes (tests/taken_over_worker.py patches one as an
escaped candidate would), real builds, real SiLU kernels from tests/corpus/cpu."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TAKEN_OVER, Product

from forge.capture.export import capture
from forge.evaluate.evaluator import Evaluator
from forge.evaluate.parent import Worker
from forge.kernel import Candidate, Status, TaskSpec
from forge.tasks.cut import build_tasks

CORPUS = Path(__file__).resolve().parent / "corpus" / "cpu"

# Right (SiLU within float32's tolerance) and slow: 64 exponentials an element, so that its time is far
# above the judge's slack and a clock that claims 20x less cannot hide in the noise.
SLOW_SILU = r"""
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int r = 0; r < 64; ++r) s += expf(-x[i] - (float)r * 1e-30f);
    y[i] = x[i] / (1.0f + s / 64.0f);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def spec() -> TaskSpec:
    tasks = build_tasks(capture(torch.nn.SiLU(), [torch.randn(257, 1000)]).graph_module.graph)
    return TaskSpec.of(tasks[0])


def _evaluate(mode: str, spec: TaskSpec, cand: Candidate, tmp_path: Path, again: bool = False) -> object:
    """The candidate evaluated by a worker taken over as `mode` says, or (`again`) timed again as
    forge.search.confirm does."""
    from forge.search.confirm import CONFIRM_BENCH

    with Evaluator("cpu", timeout_s=60, cache_dir=tmp_path) as ev:
        ev.worker.close()
        ev.worker = Worker("cpu", program=(TAKEN_OVER, mode))
        return ev.retime(spec, cand, CONFIRM_BENCH) if again else ev.evaluate(spec, cand)


def test_an_untouched_worker_passes_a_slow_right_kernel(spec: TaskSpec, tmp_path: Path) -> None:
    r = _evaluate("none", spec, Candidate("cpu", SLOW_SILU), tmp_path)
    assert r.status is Status.OK, r.message
    assert r.timing is not None and r.baseline is not None and r.timing.median_us > r.baseline.median_us
    steps = r.verify["phases_s"]  # where the judge's time went, step by step, within the evaluation's own
    assert list(steps) == ["load", "verify", "repeats", "timed", "batch", "eager", "late"]
    assert steps["timed"] > 0 and sum(steps.values()) <= r.device_s


def test_a_clock_that_claims_less_time_is_caught(spec: TaskSpec, tmp_path: Path) -> None:
    r = _evaluate("fast-clock", spec, Candidate("cpu", SLOW_SILU), tmp_path)
    assert r.status is Status.FORBIDDEN_TIMER, f"{r.status}: {r.message}"
    assert "clock disagrees" in r.message


def test_a_clock_that_claims_less_time_is_caught_where_rounds_draw_all_inputs_anew(tmp_path: Path) -> None:
    """A 256^3 product's rounds draw its inputs anew (forge.evaluate.measured.renews), which costs about what the
    call does on this CPU: the cross-check's allowance for a round's cost is not RATIO times it (with it, a
    claim 20x below this kernel's time passed)."""
    tasks = build_tasks(capture(Product(), [torch.randn(256, 256), torch.randn(256, 256)]).graph_module.graph)
    kernel = Path(__file__).resolve().parent / "kernels" / "mm_few_changed.cpp"  # right on renewed inputs
    r = _evaluate("fast-clock", TaskSpec.of(tasks[0]), Candidate.from_file(kernel), tmp_path)
    assert r.status is Status.FORBIDDEN_TIMER, f"{r.status}: {r.message}"
    assert "clock disagrees" in r.message


def test_an_eager_time_made_slower_is_replaced_by_the_judges(spec: TaskSpec, tmp_path: Path) -> None:
    """A baseline 1000x slower than eager really is would give the kernel a 1000x speedup: the judge ranks
    it against its own measurement of eager instead."""
    r = _evaluate("slow-eager", spec, Candidate.from_file(CORPUS / "good.cpp"), tmp_path)
    # The control: an honest worker's eager agrees with the judge's. On a loaded machine (the whole suite on
    # two cores) one honest run measured 16x the judge's, as the judge allows for: a second run decides.
    for _ in range(2):
        honest = _evaluate("none", spec, Candidate.from_file(CORPUS / "good.cpp"), tmp_path)
        if "eager_disagrees" not in honest.verify:
            break
    assert honest.status is Status.OK and r.status is Status.OK, f"{r.status}: {r.message}"
    assert "eager_disagrees" in r.verify and "eager_disagrees" not in honest.verify
    assert r.speedup is not None and honest.speedup is not None and r.speedup < 20 * honest.speedup


def test_the_confirmations_timing_is_held_to_the_same_checks(spec: TaskSpec, tmp_path: Path) -> None:
    """Timed again (forge.search.confirm: the timing a task's winner is picked by), a candidate is held to the
    first evaluation's checks: a clock that claims 20x less is caught, an eager made 1000x slower is replaced by
    the judge's own (a kernel that tells the confirmation from the search gains nothing by it)."""
    honest = _evaluate("none", spec, Candidate("cpu", SLOW_SILU), tmp_path, again=True)
    assert honest.status is Status.OK and honest.message == "timed again", f"{honest.status}: {honest.message}"
    fast = _evaluate("fast-clock", spec, Candidate("cpu", SLOW_SILU), tmp_path, again=True)
    assert fast.status is Status.FORBIDDEN_TIMER and "clock disagrees" in fast.message, f"{fast.status}: {fast.message}"
    slow = _evaluate("slow-eager", spec, Candidate.from_file(CORPUS / "good.cpp"), tmp_path,
                     again=True)
    assert slow.status is Status.OK and "eager_disagrees" in slow.verify, f"{slow.status}: {slow.verify}"


@pytest.mark.parametrize(("kind", "status"), [("clamps_large", Status.WRONG_RESULT),
                                               ("nan_at_zero", Status.NONFINITE),
                                               ("skip_repeat", Status.STALE_RESULT)])
def test_a_kernel_that_behaves_until_the_confirmation_is_caught_there(kind: str, status: Status, spec: TaskSpec,
                                                                     tmp_path: Path) -> None:
    """Timed again without a first evaluation, as a kernel that behaves until the confirmation would be: wrong
    on hard values (the verification after timing), skipping work on a repeated output pointer (the calls on
    the same buffers). The judge before 2026-12-07 accepted all three there."""
    r = _evaluate("none", spec, Candidate.from_file(CORPUS / f"{kind}.cpp"), tmp_path, again=True)
    assert r.status is status and r.message.startswith("timed again"), f"{r.status}: {r.message}"


@pytest.mark.parametrize(("kind", "status"), [("wrong_result", Status.WRONG_RESULT), ("nan", Status.NONFINITE),
                                               ("drift_after_judging", Status.WRONG_RESULT)])
def test_patching_the_verifier_in_the_worker_changes_nothing(kind: str, status: Status, spec: TaskSpec,
                                                             tmp_path: Path) -> None:
    """forge.evaluate.verify's judging patched to pass everything, in the worker: the verdict is made elsewhere."""
    r = _evaluate("verifier", spec, Candidate.from_file(CORPUS / f"{kind}.cpp"), tmp_path)
    assert r.status is status, f"{r.status}: {r.message}"


def test_the_worker_holds_no_judge() -> None:
    """The worker's process imports neither the verifier nor the judge (import-linter checks the source;
    this checks the running process)."""
    import subprocess

    code = ("import sys, forge.evaluate.child; "
            "bad = [m for m in ('forge.evaluate.verify', 'forge.evaluate.judge') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_worker_cannot_send_its_own_verdict(spec: TaskSpec, tmp_path: Path) -> None:
    """Only a Reply may come back over the pipe: a verdict made by the worker is a broken protocol."""
    r = _evaluate("forged-verdict", spec, Candidate.from_file(CORPUS / "wrong_result.cpp"), tmp_path)
    assert r.status is Status.CRASH and "protocol" in r.message, f"{r.status}: {r.message}"


def test_a_reply_that_stops_halfway_is_a_timeout_not_a_hang(spec: TaskSpec, tmp_path: Path) -> None:
    """A header and part of a message, then a stall: the step times out, the worker is killed, forge goes on."""
    start = time.monotonic()
    with Evaluator("cpu", timeout_s=8, cache_dir=tmp_path) as ev:
        ev.worker.close()
        ev.worker = Worker("cpu", program=(TAKEN_OVER, "partial-reply"))
        r = ev.evaluate(spec, Candidate.from_file(CORPUS / "wrong_result.cpp"))
    assert r.status is Status.TIMEOUT and "10 of 1000 bytes" in r.message, f"{r.status}: {r.message}"
    assert time.monotonic() - start < 60


def test_replies_are_decoded_with_only_their_own_classes() -> None:
    import os
    import pickle

    from forge.evaluate.steps import Reply, decode, valid_reply
    from forge.kernel import EvalResult, Timing

    good = (Reply(Status.OK, "", Timing(3.0, 2.0, 4.0, 3.0, 0.5, 10), Timing(9.0, 8.0, 10.0, 9.0, 0.5, 10), 1), 0.1)
    assert valid_reply(decode(pickle.dumps(good))) == good[0]
    for bad in (os.system, (EvalResult(Status.OK), 0.0)):  # code to run in forge's process; a verdict
        with pytest.raises(pickle.UnpicklingError, match="may not send"):
            decode(pickle.dumps(bad))
    nan = (Reply(Status.OK, "", Timing(float("nan"), 1.0, 1.0, 1.0, 0.0, 3)), 0.0)
    assert valid_reply(decode(pickle.dumps(nan))) is None
    assert valid_reply(decode(pickle.dumps((Reply(Status.OK, kept=-1), 0.0)))) is None


def test_the_arena_cannot_be_shrunk_under_forge_and_a_shrunk_arena_gets_a_new_worker(spec: TaskSpec,
                                                                                     tmp_path: Path) -> None:
    """A worker that truncated the shared memfd would make forge's next access a SIGBUS: the memfd is sealed
    against shrinking (and further seals); the judge shrinks it by making a new one, for a new worker."""
    import fcntl
    import os

    with Evaluator("cpu", timeout_s=60, cache_dir=tmp_path) as ev:
        good = Candidate("cpu", SLOW_SILU)
        assert ev.evaluate(spec, good).status is Status.OK
        arena, pid = ev.worker.arena, ev.worker.proc.pid
        seals = fcntl.fcntl(arena.fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_SEAL
        with pytest.raises(PermissionError):
            os.ftruncate(arena.fd, 0)
        with pytest.raises(PermissionError):
            fcntl.fcntl(arena.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
        arena.shrink(keep_bytes=0)
        assert arena.memfds == 2 and fcntl.fcntl(arena.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
        assert ev.evaluate(spec, good).status is Status.OK
        assert ev.worker.proc.pid != pid  # the worker that held the old memfd was replaced


def test_the_worker_starts_before_the_first_candidate_is_built(tmp_path: Path) -> None:
    """An evaluator starts its worker on its judging slot at once, so that the first candidate's judging does not
    wait for Python, torch and the device to start after its build."""
    with Evaluator("cpu", cache_dir=tmp_path) as ev:
        deadline = time.monotonic() + 60
        while ev.worker.proc is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ev.worker.proc is not None and ev.worker.proc.poll() is None
        first = ev.worker.proc.pid
    with Evaluator("cpu", cache_dir=tmp_path) as ev:  # closed at once: the start under way ends, then the worker
        pass
    assert ev.worker.proc is None and first > 0


# x > 0.25 for its first two calls (the verification before timing), then with every 100th element flipped.
FLIPS_LATER = r"""
#include <stdint.h>

#include "forge_abi.h"

static int calls = 0;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  bool* y = static_cast<bool*>(out[0].data);
  const bool flip = ++calls > 2;
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] > 0.25f) != (flip && i % 100 == 0);
  return 0;
}
"""


class _Above(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x > 0.25


def test_a_bool_output_mostly_right_in_the_repeated_call_is_wrong_not_stale(tmp_path: Path) -> None:
    """A boolean output 99% right matches a random 0/1 fill on about half its elements: the repeated call's
    stale count looks only where the right value differs from what was left there, so it is `wrong_result`
    (before, about half the runs called it a `stale_result`: work skipped, which it was not)."""
    (task,) = build_tasks(capture(_Above(), [torch.randn(257, 1000)]).graph_module.graph)
    with Evaluator("cpu", timeout_s=60, cache_dir=tmp_path) as ev:
        for _ in range(3):  # each evaluation its own fills and seeds
            r = ev.evaluate(TaskSpec.of(task), Candidate("cpu", FLIPS_LATER))
            assert r.status is Status.WRONG_RESULT and "random values" in r.message, (r.status, r.message)


def test_a_copy_rate_measured_while_the_machine_was_slowed_is_measured_again(spec: TaskSpec, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The roofline floor's copy rate is measured once; measured in a slow moment (an H100 gave 1856 GB/s,
    then ran kernels at 3270) it would reject honest candidates as too fast. Below the floor the judge measures
    the rate again and keeps the higher."""
    from forge.evaluate import measured

    monkeypatch.setitem(measured._HERE.bandwidth, "cpu", 1e3)  # 1 kB/s: any real kernel is "below the floor"
    r = _evaluate("none", spec, Candidate.from_file(CORPUS / "good.cpp"), tmp_path)
    assert r.status is Status.OK, f"{r.status}: {r.message}"
    assert measured._HERE.bandwidth["cpu"] > 1e8 and r.floor_us is not None and r.floor_us < r.timing.median_us


# Right, and slow on every fourth call (4x the work: a timing whose p90 is far over its p10, as a GPU shared for a
# moment gives), within the cross-check's allowance on average (1.75x the median a call).
SOMETIMES_SLOW_SILU = r"""
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

static int64_t calls = 0;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  const int reps = (++calls % 4 == 0) ? 32 : 8;
  for (int64_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int r = 0; r < reps; ++r) s += expf(-x[i] - (float)r * 1e-30f);
    y[i] = x[i] / (1.0f + s / (float)reps);
  }
  return 0;
}
"""


def test_a_disturbed_timing_is_timed_once_more_and_said(spec: TaskSpec, tmp_path: Path) -> None:
    """Rounds whose p90 is over SPREAD times their p10 are timed again; the verdict still stands on the
    kernel's own outputs, and its detail says what was timed again (not silently ranked by a disturbed median).
    (Whether a steady kernel's rounds count as disturbed depends on this machine's load: not asserted.)"""
    r = _evaluate("none", spec, Candidate("cpu", SOMETIMES_SLOW_SILU), tmp_path)
    assert r.status is Status.OK, r.message
    assert r.timing is not None and r.timing.p90_us > 2 * r.timing.p10_us
    assert r.verify["disturbed"].startswith("timed again: p90 "), r.verify


def test_the_cross_check_ranks_a_launch_path_the_clock_hides_by_its_own_clock() -> None:
    """The batch's time a round against the worker's claim (judge.batch_verdict): within the allowance, the claim
    stands; over it by no more than the launch path the GPU clock leaves out (flush and pad), the candidate is
    ranked by the judge's time a call, never below its claim; beyond, the clocks disagree (no timing)."""
    from forge.evaluate.judge import RATIO, ROUND_RATIO, SLACK_US, batch_verdict
    from forge.kernel import Timing

    claim = Timing(5.0, 4.5, 6.0, 5.1, 0.4, 30, 4.8, 5.3)
    claimed, round_us, hidden = claim.median_us, 15.0, 200.0
    allowed = RATIO * claimed + ROUND_RATIO * round_us + SLACK_US
    assert batch_verdict(allowed - 1, claim, round_us, hidden, 40) == ("", None)
    note, judged = batch_verdict(allowed + 60, claim, round_us, hidden, 40)
    assert note.startswith("ranked by forge's clock: ") and judged is not None
    k = (allowed + 60 - round_us) / claimed
    assert judged.median_us == pytest.approx(allowed + 60 - round_us) and judged.n == claim.n
    # its interval is the claim's, scaled: no more certain than the worker's samples (forge.confidence)
    assert (judged.ci_lo_us, judged.ci_hi_us, judged.p90_us) == pytest.approx((4.8 * k, 5.3 * k, 6.0 * k))
    note, judged = batch_verdict(allowed + hidden + 1, claim, round_us, hidden, 40)
    assert note.startswith("the worker's clock disagrees with forge's") and judged is None
    assert batch_verdict(allowed + 1, claim, round_us, 0.0, 40)[1] is None  # the CPU clock hides nothing
