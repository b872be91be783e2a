"""CUDA recipes: generated kernels compile with nvcc (wherever nvcc is) and pass verification on a GPU."""

import shutil

import pytest
import torch
from conftest import MODELS
from torch import nn

from forge.capture import layout
from forge.capture.export import capture
from forge.capture.model_input import load_file
from forge.evaluate.build import build
from forge.evaluate.evaluator import Evaluator
from forge.kernel import TaskSpec
from forge.policy.recipes import cuda, pointwise, rowreduce
from forge.policy.recipes.emit import NotMine
from forge.tasks.cut import build_tasks


def supported(spec: TaskSpec) -> str:
    """"pointwise" or "rows" when a CUDA recipe takes the task; NotMine with the reasons otherwise."""
    reasons = []
    for kind, mod in (("pointwise", pointwise), ("rows", rowreduce)):
        try:
            mod.lower(spec)
            return kind
        except NotMine as e:
            reasons.append(f"{kind}: {e}")
    raise NotMine("; ".join(reasons))


class Mixed(nn.Module):
    """Pointwise: BN(eval)+ReLU (per-channel), broadcast GELU-tanh cast to bf16, a permuted copy, an odd tail;
    rows: softmax with upcast, RMSNorm with (1 + w), LayerNorm + modulate, GroupNorm + SiLU, log-softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(8)
        self.w = nn.Parameter(torch.randn(16))
        self.rms = nn.Parameter(torch.randn(40) * 0.1)
        self.gn = nn.GroupNorm(4, 8, eps=1e-6)

    def forward(self, x, y, z, s, h):
        a = torch.relu(self.bn(x))
        b = nn.functional.gelu(y * self.w + 1.0, approximate="tanh").to(torch.bfloat16)
        c = x.permute(0, 2, 3, 1) * 2
        d = torch.where(z > 0.5, torch.sigmoid(z), -z).clamp(-1.5, 3.0)
        e = torch.softmax(s.float(), -1).to(torch.bfloat16)
        hf = h.float()
        f = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.rms)).to(torch.bfloat16)
        g = nn.functional.layer_norm(h, (40,), eps=1e-6) * (1 + y[0, :1, :1]) + 0.5
        k = nn.functional.silu(self.gn(x))
        m = torch.log_softmax(z.view(7, 143), -1)
        return a, b, c, d, e, f, g, k, m


class ScaleNHWC(nn.Module):
    def forward(self, x, y):
        return torch.relu(x * 2 + y)


def specs() -> list[TaskSpec]:
    model = Mixed().eval()
    with torch.no_grad():
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
    inputs = [torch.randn(2, 8, 5, 7), torch.randn(3, 5, 16), torch.randn(1001),
              torch.randn(6, 300).to(torch.bfloat16), torch.randn(12, 40).to(torch.bfloat16)]
    out = []
    # and the tasks of a convolutional block captured channels-last: kernels that write NHWC outputs
    nhwc_tasks = []
    for dtype in ("fp32", "bf16"):
        block = load_file(MODELS / "conv_groupnorm.py", "cpu", dtype)
        nhwc_tasks += build_tasks(layout.channels_last(capture(block.model, block.inputs), block.inputs)
                                  .graph_module.graph)
    x_nhwc = torch.randn(2, 12, 5, 3).contiguous(memory_format=torch.channels_last)  # a pointwise NHWC output
    scale = build_tasks(capture(ScaleNHWC(), [x_nhwc, torch.randn(12, 1, 1)]).graph_module.graph)
    for t in build_tasks(capture(model, inputs).graph_module.graph) + nhwc_tasks + scale:
        spec = TaskSpec.of(t)
        try:
            supported(spec)
        except NotMine:
            continue
        out.append(spec)
    return out


KNOBS = (cuda.CudaKnobs(), cuda.CudaKnobs(threads=128, vec=4, blocks=2, fast_math=True),
         cuda.CudaRowKnobs(), cuda.CudaRowKnobs(threads=128, cluster=2, vec=4, cache=False, fast_math=True),
         cuda.CudaRowKnobs(threads=64 * 2, cluster=4, vec=8, cache=True),
         cuda.CudaRowKnobs(threads=128, warp_rows=True), cuda.CudaRowKnobs(threads=64, warp_rows=True, vec=2),
         cuda.CudaRowKnobs(threads=128, cluster=2, smem=True), cuda.CudaRowKnobs(threads=64, smem=True, vec=4),
         cuda.CudaRowKnobs(threads=64, cluster=16, smem=True, fast_math=True))


def candidates(spec: TaskSpec) -> list[tuple[object, object]]:
    kind = supported(spec)
    out = []
    for k in KNOBS:
        if (kind == "pointwise") != isinstance(k, cuda.CudaKnobs):
            continue
        try:
            out.append((k, cuda.candidate(spec, k)))
        except NotMine:
            pass  # e.g. a row that does not split into the cluster
    return out


def test_recipes_take_the_mixed_tasks():
    kinds = {supported(s) for s in specs()}
    assert kinds == {"pointwise", "rows"}
    assert len(specs()) >= 8


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_generated_cuda_compiles(tmp_path):
    for spec in specs():
        for knobs, cand in candidates(spec):
            res = build(cand, "sm_90", tmp_path)
            assert res.ok, (spec.key, knobs, res.log[-1500:])


@pytest.mark.cuda
def test_generated_cuda_kernels_pass_verification():
    with Evaluator("cuda", timeout_s=120) as ev:
        for spec in specs():
            for knobs, cand in candidates(spec):
                res = ev.evaluate(spec, cand)
                assert res.status.value == "ok", (spec.key, knobs, res.status.value, res.message)
                assert res.timing and res.timing.median_us > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "sd35-vae-decoder"])
def test_every_recipe_task_of_a_reference_model_gets_cuda_ideas(name, tmp_path):
    """Full-size shapes (captured on meta): the VAE's GroupNorms have rows of 4M elements, past what a
    block keeps on chip, so only the re-reading schedule applies there."""
    from forge.capture.model_input import load_zoo
    from forge.policy.recipes.policy import RecipePolicy

    loaded = load_zoo(name, "meta", "bf16")
    policy = RecipePolicy("cuda")
    mine = 0
    for t in build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph):
        spec = TaskSpec.of(t)
        if policy.refusal(spec) is not None:
            continue
        mine += 1
        ideas = policy.propose(spec, None)
        assert ideas, t.key
        cand = policy.render(spec, ideas[0])
        assert cand.backend == "cuda" and "forge_launch" in cand.source
        if shutil.which("nvcc") and mine <= 6:
            res = build(cand, "sm_90", tmp_path)
            assert res.ok, (t.key, res.log[-1500:])
    assert mine >= 10
