"""The pointwise recipe: generated C kernels verified by the real worker on assorted pointwise tasks."""

import pytest
import torch
from conftest import EXAMPLES, lowerable

from forge.capture.export import capture
from forge.capture.model_input import load_file
from forge.evaluate.evaluator import Evaluator
from forge.kernel import TaskSpec
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.pointwise import Knobs, candidate, lower
from forge.tasks.cut import build_tasks


class Mixed(torch.nn.Module):
    """BatchNorm(eval)+ReLU, a broadcast GELU-tanh cast to bf16, a permuted copy, a masked select, a tail,
    hardtanh with its default bounds (exported without them) and a clamp by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(8)
        self.w = torch.nn.Parameter(torch.randn(16))

    def forward(self, x, y, z):
        a = torch.relu(self.bn(x))
        b = torch.nn.functional.gelu(y * self.w + 1.0, approximate="tanh").to(torch.bfloat16)
        c = x.permute(0, 2, 3, 1) * 2
        d = torch.where(z > 0.5, torch.sigmoid(z), -z).clamp(-1.5, 3.0)
        e = torch.nn.functional.hardtanh(z * 3, min_val=-1, max_val=1) + torch.clamp(z, max=0.5)  # (mul,): no bounds
        return a, b, c, d, e


def specs():
    model = Mixed().eval()
    with torch.no_grad():
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
    inputs = [torch.randn(2, 8, 5, 7), torch.randn(3, 5, 16), torch.randn(1001)]  # 1001: no vector multiple
    tasks = build_tasks(capture(model, inputs).graph_module.graph)
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py", "cpu", "bf16")
    tasks += build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph)
    return lowerable(tasks, lower)


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator("cpu", timeout_s=60) as ev:
        yield ev


def test_generated_kernels_pass_verification(evaluator):
    found = specs()
    families = {t.family for t, _ in found}
    assert len(found) >= 5 and {"normalization", "activation"} <= families, [t.key for t, _ in found]
    for task, low in found:
        for knobs in (Knobs(), Knobs(simd=False, chunk=256, unroll=4, fast_math=True)):
            res = evaluator.evaluate(TaskSpec.of(task), candidate(low, knobs))
            assert res.status.value == "ok", (task.key, knobs, res.message, res.build_log[-500:])
            assert res.timing and res.timing.median_us > 0


def test_not_mine_says_why():
    loaded = load_file(EXAMPLES / "groupnorm_silu_conv.py")
    reasons = {}
    for t in build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph):
        try:
            lower(TaskSpec.of(t))
        except NotMine as e:
            reasons[t.family] = str(e)
    assert "convolution" in reasons["convolution/pooling"]
    assert "reduction or normalization" in reasons["normalization"]


def test_clamps_and_relu_keep_nan_as_torch_does():
    """torch's relu, clamp and hardtanh return NaN for NaN; a `a > b ? a : b` max returned the bound."""
    from forge.evaluate.build import build
    from forge.kernel import KernelArtifact
    from forge.runtime.dispatch import GuardedKernel

    class Clamps(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + torch.clamp(x, -0.5, 0.5) + torch.nn.functional.hardtanh(x)

    x = torch.randn(257)
    x[::7] = float("nan")
    (task,) = build_tasks(capture(Clamps(), [x]).graph_module.graph)
    built = build(candidate(lower(TaskSpec.of(task)), Knobs()))
    assert built.ok, built.log[-500:]
    art = KernelArtifact(task.key, "cpu", built.path, "forge_launch", task.inputs, task.outputs, task.source)
    with torch.no_grad():
        (got,) = GuardedKernel(art, strict=True)(x)
    torch.testing.assert_close(got, Clamps()(x), equal_nan=True)


def test_hardswish_hardsigmoid_mish_are_captured_whole_and_lowered_as_eager_computes_them():
    """Decomposed by export, HardSwish alone was five ops (five passes over memory where eager makes one);
    kept whole, the recipe writes each in eager's arithmetic: NaN stays NaN, large and tiny values saturate
    as eager's do, and a transposed input is read through its strides."""
    from forge.evaluate.build import build
    from forge.kernel import KernelArtifact
    from forge.runtime.dispatch import GuardedKernel

    class Acts(torch.nn.Module):
        def forward(self, x):
            f = torch.nn.functional
            return f.hardswish(x - 0.5) + f.mish(x) * f.hardsigmoid(x * 2)

    x = (torch.randn(37, 29) * 30).t()  # not contiguous, odd sizes
    x[::5, ::3] = float("nan")
    x[1, :4] = torch.tensor([0.0, -3.0, 3.0, 1e4])
    cap = capture(Acts(), [x])
    ops = {str(n.target) for n in cap.graph_module.graph.nodes if n.op == "call_function"}
    assert {"aten.hardswish.default", "aten.mish.default", "aten.hardsigmoid.default"} <= ops, ops
    (task,) = build_tasks(cap.graph_module.graph)
    built = build(candidate(lower(TaskSpec.of(task)), Knobs()))
    assert built.ok, built.log[-500:]
    art = KernelArtifact(task.key, "cpu", built.path, "forge_launch", task.inputs, task.outputs, task.source)
    with torch.no_grad():
        (got,) = GuardedKernel(art, strict=True)(x)
    torch.testing.assert_close(got, Acts()(x), equal_nan=True)


def test_threads_only_for_loops_worth_them(evaluator):
    """Below PARALLEL_MIN elements the loop runs on the calling thread (a vector loop, no OpenMP team: waking
    one cost 7-8 ms against 7 us of work on a loaded 2-core host); at it and above, in parallel. Both verify."""
    from forge.policy.recipes.pointwise import PARALLEL_MIN

    class Sine(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x) * 2

    for n, threads in ((512, False), (PARALLEL_MIN - 1, False), (PARALLEL_MIN, True)):
        (task,) = build_tasks(capture(Sine(), [torch.randn(n)]).graph_module.graph)
        spec = TaskSpec.of(task)
        for knobs in (Knobs(), Knobs(simd=False, unroll=4), Knobs(chunk=4096)):
            source = candidate(lower(spec), knobs).source
            assert ("#pragma omp parallel for" in source) is threads, (n, knobs)
            pragmas = [line for line in source.splitlines() if line.strip().startswith("#pragma omp")]
            assert any("simd" in p for p in pragmas) is knobs.simd, (n, knobs, pragmas)
        res = evaluator.evaluate(spec, candidate(lower(spec), Knobs()))
        assert res.status.value == "ok", (n, res.message, res.build_log[-400:])
