"""forge.evaluate.spotcheck with the real clock: inputs perturbed every round, kept calls only from timed rounds,
copied out as the worker copies them into the arena and judged by forge.evaluate.judge."""

import torch

from forge.bench import BenchConfig, Clock, interleaved
from forge.capture.export import TensorMeta
from forge.evaluate.judge import judge_kept
from forge.evaluate.verify import Reference
from forge.kernel import TaskSpec

SOURCE = '''
import torch
aten = torch.ops.aten


def region(in0: "f32[64, 33]"):
    return (aten.mul.Tensor(in0, 2.0),)
'''


def test_kept_calls_come_from_timed_rounds_and_wrong_ones_are_judged():
    from forge.evaluate.spotcheck import SpotCheck

    x = torch.randn(64, 33)
    first = x.clone()
    meta = (TensorMeta.of(x),)
    timed_now = []  # what prepare was told before each round

    spot = SpotCheck([x], meta, 10, "cpu")

    def prepare(timed: bool) -> None:
        timed_now.append(timed)
        spot.prepare(timed)

    calls = {"n": 0}

    def double(inputs, outputs):  # right in warm-up, wrong once the timed rounds begin
        calls["n"] += 1
        outputs[0].copy_(inputs[0] * (2.0 if not timed_now[-1] else 3.0))

    cand = spot.wrap(double)
    interleaved(Clock("cpu"), [cand, lambda: x * 2], BenchConfig(warmup_s=0.01, budget_s=0.02, min_runs=10),
                prepare)
    assert not torch.equal(x, first)  # perturbed in place, every round
    assert timed_now.count(True) >= 10 and timed_now[:3] == [False] * 3
    assert 1 <= len(spot.kept) <= 2
    wrong = judge_kept(Reference(SOURCE), _task(meta), _stored(spot, meta), "timed")
    assert wrong is not None and wrong.status.value == "wrong_result" and "timed call" in wrong.message


def test_a_right_kernel_passes_the_spot_checks():
    from forge.evaluate.spotcheck import SpotCheck

    x = torch.randn(64, 33)
    spot = SpotCheck([x], (TensorMeta.of(x),), 10, "cpu")
    cand = spot.wrap(lambda inputs, outputs: outputs[0].copy_(inputs[0] * 2))
    interleaved(Clock("cpu"), [cand, lambda: x * 2], BenchConfig(warmup_s=0.01, budget_s=0.02, min_runs=10),
                spot.prepare)
    meta = spot.outputs
    assert spot.kept and judge_kept(Reference(SOURCE), _task(meta), _stored(spot, meta), "timed") is None


def _task(meta: tuple[TensorMeta, ...]) -> TaskSpec:
    return TaskSpec("mul", SOURCE, meta, meta, 0)


def _stored(spot, meta):  # noqa: ANN001, ANN202
    """The kept calls as the worker hands them over: copied into buffers of their own."""
    slots = [([torch.empty(m.shape) for m in meta], [torch.empty(m.shape) for m in meta]) for _ in spot.kept]
    assert spot.store(slots) == len(spot.kept)
    return slots
