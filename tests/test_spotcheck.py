"""forge.evaluate.spotcheck with the real clock: inputs perturbed every round, kept calls only from timed rounds,
copied out as the worker copies them into the arena and judged by forge.evaluate.judge."""

from pathlib import Path

import torch
from conftest import Product

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


def _spec(model: torch.nn.Module, *inputs: torch.Tensor) -> TaskSpec:
    from forge.capture.export import capture
    from forge.tasks.cut import build_tasks

    return TaskSpec.of(build_tasks(capture(model, list(inputs)).graph_module.graph)[0])


def test_products_and_convolutions_get_their_inputs_anew_every_round_pointwise_and_reductions_not():
    from forge.evaluate.measured import renews

    assert renews(_spec(Product(), torch.randn(64, 96), torch.randn(96, 48)))
    assert renews(_spec(torch.nn.Conv2d(8, 16, 3), torch.randn(2, 8, 20, 20)))
    assert not renews(_spec(Product(), torch.randn(512, 2), torch.randn(2, 512)))  # an outer product: bytes
    assert not renews(_spec(torch.nn.SiLU(), torch.randn(64, 96)))
    assert not renews(_spec(torch.nn.LayerNorm(96), torch.randn(64, 96)))


def test_a_renewing_spot_check_changes_every_element_every_round_within_the_domain():
    from forge.evaluate.spotcheck import SpotCheck

    x, g = torch.randn(64, 33), torch.randn(40)
    spot = SpotCheck([x, g], (TensorMeta.of(x),), 10, "cpu", {1: "nonpositive"}, renew=True)
    for timed in (False, True, True):
        before = [x.clone(), g.clone()]
        spot.prepare(timed)
        assert not (x == before[0]).any() and not (g == before[1]).any()
        assert (g <= 0).all() and x.std() > 0.5  # N(0,1), and -|N(0,1)| where the input has that domain


def test_no_timed_call_can_be_served_incrementally_from_the_last_one(tmp_path: Path):
    """tests/kernels/mm_few_changed.cpp is right unless 1 to 4096 input elements changed since its last call: through
    a real worker it passes only if no timed call (nor batched one) follows a call on nearly the same inputs."""
    from forge.evaluate.evaluator import Evaluator
    from forge.kernel import Candidate, Status

    spec = _spec(Product(), torch.randn(64, 96), torch.randn(96, 48))
    with Evaluator("cpu", timeout_s=60, cache_dir=tmp_path) as ev:
        r = ev.evaluate(spec, Candidate.from_file(Path(__file__).parent / "kernels" / "mm_few_changed.cpp"))
    assert r.status is Status.OK, f"{r.status}: {r.message}"


def test_integer_and_boolean_inputs_get_values_they_held_at_other_positions_every_round():
    from forge.evaluate.spotcheck import SpotCheck

    idx = torch.tensor([3, 1000] * 32).repeat(33, 1)  # two values, far apart: any other would be new
    mask, scalar, wide = torch.arange(40) % 2 == 0, torch.tensor(3), torch.arange(64).to(torch.uint32)
    spot = SpotCheck([idx, mask, scalar, wide], (TensorMeta.of(idx),), 10, "cpu")
    changed = [0, 0]
    for timed in (False, True, True, True):
        before = [idx.clone(), mask.clone()]
        spot.prepare(timed)
        for k, (x, b) in enumerate(zip([idx, mask], before, strict=True)):
            changed[k] += int((x != b).any())
            assert (x != b).sum() <= 8  # a few elements a round (PERTURBED), not all
        assert set(idx.unique().tolist()) <= {3, 1000} and scalar.item() == 3  # an index stays one
    assert changed[0] >= 3 and changed[1] >= 3
    assert torch.equal(wide.long(), torch.arange(64))  # index_put_ cannot write uint32: left as it is


def test_many_rounds_do_not_wear_an_integer_input_down_to_a_few_values():
    from forge.evaluate.spotcheck import SpotCheck

    idx = torch.arange(64)
    spot = SpotCheck([idx], (TensorMeta.of(idx),), 10, "cpu")
    for _ in range(2000):  # a timing step's warm-up and timed rounds at most
        spot.prepare(False)
    assert len(idx.unique()) >= 24  # values copied from those first held, not from the drifting ones


def test_a_renewing_spot_check_permutes_an_integer_input_every_round():
    from forge.evaluate.spotcheck import SpotCheck

    x, idx = torch.randn(64, 33), torch.arange(500)
    spot = SpotCheck([x, idx], (TensorMeta.of(x),), 10, "cpu", renew=True)
    for timed in (False, True, True):
        before = idx.clone()
        spot.prepare(timed)
        assert (idx != before).sum() > 450 and torch.equal(idx.sort().values, torch.arange(500))
