"""The scan recipe: the gated delta rule's whole chunk loop as one C kernel, verified by the real (confined) worker."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from forge.capture.export import capture
from forge.capture.scans import recurrence
from forge.evaluate.confine import available
from forge.evaluate.domains import input_domains
from forge.evaluate.evaluator import Evaluator
from forge.evaluate.verdicts import within_tolerance
from forge.evaluate.verify import SETS, Reference, make_input
from forge.kernel import TaskSpec
from forge.policy.recipes import scan
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.policy import RecipePolicy
from forge.tasks.cut import build_tasks

lib = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")  # imported before capture, as a model's


class Rule(torch.nn.Module):
    """The library's rule called directly: two key heads serving four value heads, a state in and out."""

    def forward(self, q, k, v, g, beta, state):
        return lib.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)


def rule_spec(dtype: torch.dtype = torch.float32, t: int = 80) -> TaskSpec:
    """The scan task of `Rule` at 80 tokens (two chunks of 64, the second padded) in `dtype`."""
    q, k = (torch.randn(2, t, 2, 16, dtype=dtype) for _ in range(2))
    v = torch.randn(2, t, 4, 8, dtype=dtype)
    g, beta = -torch.rand(2, t, 4, dtype=dtype), torch.rand(2, t, 4, dtype=dtype)
    state = torch.randn(2, 4, 16, 8)
    (task,) = [x for x in build_tasks(capture(Rule(), [q, k, v, g, beta, state]).graph_module.graph)
               if x.family == "scan"]
    return TaskSpec.of(task)


def qwen_spec() -> TaskSpec:
    """Qwen 3.5's scan task at 80 tokens, from a meta capture (q, k and v are views of the convolution's output)."""
    from forge.capture import zoo

    model, inputs = zoo.build("qwen35", device="meta", batch=1, layers=1, seq=80)
    (task,) = [x for x in build_tasks(capture(model, inputs).graph_module.graph) if x.family == "scan"]
    return TaskSpec.of(task)


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator("cpu", timeout_s=120) as ev:
        yield ev


def test_the_rule_with_grouped_heads_and_a_state_is_lowered_with_both_outputs():
    low = scan.lower(rule_spec())
    assert (low.k_heads, low.v_heads, low.k_dim, low.v_dim, low.chunk, low.seq) == (2, 4, 16, 8, 64, 80)
    assert low.state is not None and (low.out, low.final) == (0, 1) and low.l2norm


@pytest.mark.slow
def test_scan_kernels_verify_in_the_confined_worker_and_beat_eager(evaluator):
    """The worker imports the library before its seccomp filter (forge.evaluate.parent): importing it after is
    killed. Speedups are not asserted on a shared 2-core machine, only measured."""
    assert available() == "", "the worker must be confined for this test to mean something"
    cases = [(rule_spec(), scan.ScanKnobs()), (rule_spec(torch.bfloat16), scan.ScanKnobs(fast_math=True)),
             (qwen_spec(), scan.ScanKnobs(simd=False))]
    for spec, knobs in cases:
        res = evaluator.evaluate(spec, scan.candidate(scan.lower(spec), knobs))
        assert res.status.value == "ok", (spec.key, knobs, res.message, res.build_log[-400:])
        assert res.timing is not None and res.baseline is not None


# Wrong kernels the verification must reject: each is the recipe's kernel with one step of the rule left out.
WRONG = {
    "the state not decayed between chunks": ("decay = expf(last)", "decay = 1.0f"),
    "beta left out of the chunk's triangular system": ("A[i][j] = (sa * bt[i]) * e;", "A[i][j] = sa * e;"),
    "k not L2-normalised": ("rk = 1.0f / sqrtf(sk + 1e-6f)", "rk = 1.0f"),
}


@pytest.mark.slow
@pytest.mark.parametrize("why", sorted(WRONG))
def test_a_scan_kernel_that_leaves_out_a_step_is_rejected_against_the_library(evaluator, why):
    """Verification compares the kernel with the library's function (the task's reference) on inputs in the
    rule's domain: a kernel missing one step of the recurrence fails it, where the recipe's own passes."""
    spec = rule_spec()
    cand = scan.candidate(scan.lower(spec), scan.ScanKnobs())
    old, new = WRONG[why]
    assert cand.source.count(old) == 1
    res = evaluator.evaluate(spec, replace(cand, source=cand.source.replace(old, new)))
    assert res.status.value in ("wrong_result", "low_precision"), (why, res.status, res.message)


def test_tasks_that_are_not_a_scan_are_not_mine():
    x = torch.randn(8, 16)
    (task,) = build_tasks(capture(torch.nn.SiLU(), [x]).graph_module.graph)
    with pytest.raises(NotMine, match="not a scan task"):
        scan.lower(TaskSpec.of(task))
    assert RecipePolicy("cpu").refusal(rule_spec()) is None  # a GPU's: tests/test_recipe_triton_scan.py


def test_the_policy_proposes_distinct_scan_schedules_and_rebuilds_them_from_knobs():
    spec, policy = rule_spec(), RecipePolicy("cpu")
    seeds = policy.propose(spec, None)
    assert seeds and all(isinstance(k, scan.ScanKnobs) for k in seeds)
    codes = {"\n".join(line for line in policy.render(spec, k).source.splitlines() if "forge recipe" not in line)
             for k in seeds}
    assert len(codes) == len({(k.parallel, k.simd) for k in seeds})  # fast math is a flag, not code
    children = policy.propose(spec, seeds[0])
    assert all(sum(getattr(c, f) != getattr(seeds[0], f) for f in ("parallel", "simd", "fast_math")) == 1
               for c in children)
    assert policy.payload_of(spec, {"parallel": False, "simd": True, "fast_math": True}) == \
        scan.ScanKnobs(parallel=False, fast_math=True)


def test_a_scans_decay_and_rates_are_drawn_in_their_domain():
    spec = rule_spec()
    assert input_domains(spec.source) == {3: "nonpositive", 4: "unit"}
    assert input_domains(qwen_spec().source) == {3: "nonpositive", 4: "unit"}  # through the region's views too
    gen = torch.Generator().manual_seed(0)
    for k in range(SETS):  # the scales and the hard values alike
        g = make_input(spec.inputs[3], k, gen, "cpu", domain="nonpositive")
        beta = make_input(spec.inputs[4], k, gen, "cpu", domain="unit")
        free = make_input(spec.inputs[3], k, gen, "cpu")
        assert (g <= 0).all() and ((beta >= 0) & (beta <= 1)).all() and (free > 0).any()
    (silu,) = build_tasks(capture(torch.nn.SiLU(), [torch.randn(4, 4)]).graph_module.graph)
    assert input_domains(silu.source) == {}


def test_a_float32_scan_output_is_judged_against_the_rule_not_the_librarys_float32_rounding():
    """Verification's higher-precision reference of a scan is the rule in float64 (forge.capture.scans.precise): on
    every input set, a float32 kernel computing the rule exactly (its float64 recurrence rounded to float32) is
    within tolerance, and closer to that reference than the library's own float32 chunked result is."""
    spec = rule_spec()
    ref = Reference(spec.source)
    gen = torch.Generator().manual_seed(0)
    for k in range(SETS):
        inputs = [make_input(m, k, gen, "cpu", domain=ref.domains.get(i, "")) for i, m in enumerate(spec.inputs)]
        eager, high = ref(inputs)
        exact = recurrence(*inputs[:5], inputs[5], True)
        for i, (out, e, h) in enumerate(zip(exact, eager, high, strict=True)):
            assert h.dtype == torch.float64
            out = out.to(e.dtype)
            finite = torch.isfinite(h)
            row: dict = {}
            assert within_tolerance("out", out, e, h, finite, "float32", row, f"set {k}", i) is None, row
            assert row[f"err{i}"] <= row[f"eager_err{i}"], row
