"""Triton recipes: the generated modules pass forge's Triton checks and, run by Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1), match the float64 reference on odd sizes, tails, broadcasts, strided and channels-last
tensors; the recipe policy offers them beside CUDA on a GPU."""

import dataclasses
import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_recipe_cuda import specs as mixed_specs
from torch import nn

from forge.capture.export import capture
from forge.evaluate.checks import check
from forge.kernel import TaskSpec
from forge.policy.recipes import pointwise, triton_kernels
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.policy import RecipePolicy
from forge.policy.recipes.triton_common import TritonKnobs, TritonRowKnobs
from forge.tasks.cut import build_tasks, compile_source
from forge.tolerance import rel_error, tolerance

pytest.importorskip("triton")
HERE = Path(__file__).resolve().parent


class Transposed(nn.Module):
    """Inputs read through non-contiguous strides: a transposed matrix, a sliced one, a column broadcast."""

    def forward(self, a, b, c):
        return torch.tanh(a) * b + c, torch.softmax(a * 2, -1), nn.functional.layer_norm(b, (b.shape[-1],))


class Anchors(nn.Module):
    """The seven anchors' regions (benchmarks/anchors.py) at small, odd shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.rms = nn.Parameter(torch.randn(300) * 0.1)
        self.gn = nn.GroupNorm(4, 8, eps=1e-6)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, s, h, g, u, v, x, scale, shift, f):
        soft = torch.softmax(s.float(), -1).to(torch.bfloat16)
        hf = h.float()
        rms = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.rms.float())).to(h.dtype)
        swiglu = nn.functional.silu(g) * u
        gn = nn.functional.silu(self.gn(v))
        gelu = nn.functional.gelu(g, approximate="tanh")
        ln = nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
        bn = torch.relu(self.bn(f))
        return soft, rms, swiglu, gn, gelu, ln, bn


def _tasks(model: nn.Module, inputs: list[torch.Tensor]) -> list[TaskSpec]:
    return [TaskSpec.of(t) for t in build_tasks(capture(model.eval(), inputs).graph_module.graph)]


@functools.cache
def specs() -> list[TaskSpec]:
    bf = torch.bfloat16
    base = torch.randn(23, 40)
    transposed = _tasks(Transposed(), [base.t(), torch.randn(40, 46)[:, ::2], torch.randn(40, 1)])
    anchors = Anchors()
    with torch.no_grad():
        anchors.bn.running_var.uniform_(0.5, 2.0)
    ins = [torch.randn(2, 3, 5, 130).to(bf), torch.randn(7, 300).to(bf), torch.randn(9, 37).to(bf),
           torch.randn(9, 37).to(bf), torch.randn(2, 8, 5, 3), torch.randn(1, 11, 96), torch.randn(1, 96),
           torch.randn(1, 96), torch.randn(2, 6, 5, 7)]
    out = []
    for spec in mixed_specs() + transposed + _tasks(anchors, ins):
        try:
            triton_kernels.candidate(spec, _knobs(spec)[0])
        except NotMine:
            continue
        out.append(spec)
    return out


def _knobs(spec: TaskSpec) -> list[object]:
    try:
        pointwise.lower(spec)
        return [TritonKnobs(), TritonKnobs(block=64, warps=2)]
    except NotMine:
        return [TritonRowKnobs(), TritonRowKnobs(chunk=16, warps=2), TritonRowKnobs(chunk=64)]


def _inputs(spec: TaskSpec, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for m in spec.inputs:  # as verification makes them: never zero, up to +-30 in magnitude
        x = torch.randn(m.shape, generator=g) * 3
        x = torch.where(x.abs() < 1e-3, 1e-3, x).to(m.torch_dtype)
        out.append(torch.empty_strided(m.shape, m.stride, dtype=m.torch_dtype).copy_(x))
    return out


def _outputs(spec: TaskSpec) -> list[torch.Tensor]:
    return [torch.empty_strided(w.shape, w.stride, dtype=w.torch_dtype).fill_(math.nan)
            for w in (m.written() for m in spec.outputs)]


def interpret(tmp_path, jobs: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]) -> list[tuple]:
    """(return code, outputs) of each (Triton source, inputs, outputs), run by Triton's interpreter in a process
    of its own (tests/triton_interpret.py)."""
    files = []
    for n, (source, inputs, outputs) in enumerate(jobs):
        path = tmp_path / f"kernel_{n}.py"
        path.write_text(source)
        files.append((str(path), inputs, outputs))
    torch.save(files, tmp_path / "jobs.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(HERE / "triton_interpret.py"), str(tmp_path / "jobs.pt"),
                           str(tmp_path / "results.pt")], env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp_path / "results.pt")


def test_triton_recipes_take_pointwise_and_row_tasks():
    kinds = {"pointwise" if isinstance(_knobs(s)[0], TritonKnobs) else "rows" for s in specs()}
    assert kinds == {"pointwise", "rows"}
    assert len(specs()) >= 20


def test_generated_triton_passes_forge_checks():
    for spec in specs():
        for knobs in _knobs(spec):
            cand = triton_kernels.candidate(spec, knobs)
            assert cand.backend == "triton"
            assert check(cand) == [], (spec.key, knobs, check(cand))


def test_generated_triton_matches_eager_under_the_interpreter(tmp_path):
    jobs, cases = [], []
    for spec in specs():
        for knobs in _knobs(spec):
            source = triton_kernels.candidate(spec, knobs).source
            for seed in (0, 1):
                inputs = _inputs(spec, seed)
                jobs.append((source, inputs, _outputs(spec)))
                cases.append((spec, knobs, inputs))
    strided = {s.key for s, _, _ in cases if any(not m.contiguous for m in s.inputs)}
    assert len(strided) >= 3 and any(m.written().channels_last for s, _, _ in cases for m in s.outputs)
    for (spec, knobs, inputs), (rc, outs) in zip(cases, interpret(tmp_path, jobs), strict=True):
        assert rc == 0, (spec.key, knobs, rc)
        refs = compile_source(spec.source)(*[x.double() for x in inputs])
        for o, r, m in zip(outs, refs, spec.outputs, strict=True):
            # a BatchNorm's running variance is drawn negative at times: NaN there in eager too, and only there
            assert torch.equal(o.isnan(), r.isnan()), (spec.key, knobs, "unwritten elements, or NaN")
            err = rel_error(o, r, r.isfinite())
            assert err <= tolerance(m.dtype).kernel, (spec.key, knobs, m.dtype, err)


def test_the_launcher_refuses_other_tensors(tmp_path):
    spec = next(s for s in specs() if any(not m.contiguous for m in s.inputs))
    source = triton_kernels.candidate(spec, _knobs(spec)[0]).source
    inputs = _inputs(spec, 0)
    other = [x.contiguous() for x in inputs]  # same shapes, other strides
    got = interpret(tmp_path, [(source, inputs, []), (source, other, _outputs(spec)), (source, inputs, _outputs(spec))])
    assert [rc for rc, _ in got] == [1, 2, 0]
    assert all(o.isnan().all() for o in got[1][1])  # refused: nothing written


def test_the_policy_offers_triton_beside_cuda_on_a_gpu():
    policy = RecipePolicy("cuda", triton=True)
    for spec in specs()[:6]:
        ideas = policy.propose(spec, None)
        triton = [i for i in ideas if isinstance(i, (TritonKnobs, TritonRowKnobs))]
        assert triton and len(triton) < len(ideas), spec.key  # both backends at the root
        cand = policy.render(spec, triton[0])
        assert cand.backend == "triton" and check(cand) == []
        assert policy.payload_of(spec, dataclasses.asdict(triton[0])) == triton[0]
        assert not isinstance(policy.payload_of(spec, dataclasses.asdict(ideas[0])), (TritonKnobs, TritonRowKnobs))
        children = policy.propose(spec, triton[0])
        assert children and all(type(c) is type(triton[0]) for c in children)  # a mutation keeps the backend
    assert not RecipePolicy("cpu").triton


def test_triton_recipes_are_asked_for_by_name_and_stored_so():
    import importlib.util

    from forge.job import make_policy

    assert not make_policy("recipes", "cuda").triton and make_policy("recipes", "cuda").name == "recipes"
    both = make_policy("recipes+triton", "cuda")
    has_triton = importlib.util.find_spec("triton") is not None
    assert both.triton == has_triton and both.name == ("recipes+triton" if has_triton else "recipes")
    assert not make_policy("recipes+triton", "cpu").triton  # never on a CPU
