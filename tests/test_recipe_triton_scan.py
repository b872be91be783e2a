"""The Triton scan recipe (the gated delta rule's recurrent form): its modules pass forge's Triton checks and, run by
Triton's interpreter on CPU tensors (TRITON_INTERPRET=1), match the library's chunked function on odd sizes (tails
past the last whole chunk of 64, a sequence shorter than one chunk, head dims that are not powers of two), with and
without an initial and a final state, and Qwen 3.5's strided views; forge's verification passes them and rejects
a kernel with one step of the rule left out; the recipe policy proposes them on a GPU."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_recipe_scan import qwen_spec
from test_recipe_triton import interpret

from forge.capture.export import capture
from forge.evaluate.checks import check
from forge.kernel import TaskSpec
from forge.policy.recipes import scan, triton_scan
from forge.policy.recipes.policy import RecipePolicy
from forge.policy.recipes.triton_scan import TritonScanKnobs
from forge.tasks.cut import build_tasks, compile_source
from forge.tolerance import rel_error, tolerance

pytest.importorskip("triton")
lib = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
HERE = Path(__file__).resolve().parent


class Rule(torch.nn.Module):
    """The library's rule called directly, with or without an initial state in and the final state out."""

    def __init__(self, final: bool, l2norm: bool) -> None:
        super().__init__()
        self.final, self.l2norm = final, l2norm

    def forward(self, q, k, v, g, beta, *state):
        out, last = lib.torch_chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=state[0] if state else None, output_final_state=self.final,
            use_qk_l2norm_in_kernel=self.l2norm)
        return (out, last) if self.final else out


@dataclasses.dataclass(frozen=True)
class Case:
    """A rule's sizes: batch, tokens, key and value heads, key and value dims."""

    b: int
    t: int
    hk: int
    hv: int
    dk: int
    dv: int
    dtype: torch.dtype = torch.float32
    state: bool = False
    final: bool = False
    l2norm: bool = True


@functools.cache
def spec_of(case: Case) -> TaskSpec:
    q, k = (torch.randn(case.b, case.t, case.hk, case.dk, dtype=case.dtype) for _ in range(2))
    v = torch.randn(case.b, case.t, case.hv, case.dv, dtype=case.dtype)
    g, beta = (torch.rand(case.b, case.t, case.hv, dtype=case.dtype) for _ in range(2))
    g = -g
    state = [torch.randn(case.b, case.hv, case.dk, case.dv)] if case.state else []
    model = Rule(case.final, case.l2norm)
    (task,) = [x for x in build_tasks(capture(model, [q, k, v, g, beta, *state]).graph_module.graph)
               if x.family == "scan"]
    return TaskSpec.of(task)


# (case, knobs): tails past whole chunks of 64, one shorter than a chunk, head dims that are not powers of two
# (masked lanes), two value blocks a head, grouped heads, every combination of states in and out.
CASES = [
    (Case(2, 80, 2, 4, 16, 8, state=True, final=True), TritonScanKnobs()),
    (Case(1, 37, 1, 2, 12, 24, torch.bfloat16, final=True), TritonScanKnobs(16, 2, prefetch=True)),
    (Case(1, 130, 2, 2, 16, 16, state=True, l2norm=False), TritonScanKnobs(8, 1, prefetch=True)),
    (Case(1, 70, 1, 3, 8, 8, torch.bfloat16), TritonScanKnobs(64, 8)),
]


def _domain_inputs(spec: TaskSpec, seed: int) -> list[torch.Tensor]:
    """Inputs laid out as the task's, in the rule's domain: g <= 0 (input 3), beta in (0, 1) (input 4)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for j, m in enumerate(spec.inputs):
        span = 1 + sum((s - 1) * st for s, st in zip(m.shape, m.stride, strict=True))
        x = torch.randn(span, generator=gen)
        x = -x.abs() if j == 3 else x.sigmoid() if j == 4 else x
        out.append(x.to(m.torch_dtype).as_strided(m.shape, m.stride))
    return out


def _outputs(spec: TaskSpec) -> list[torch.Tensor]:
    return [torch.empty_strided(m.shape, m.stride, dtype=m.torch_dtype).fill_(math.nan)
            for m in (o.written() for o in spec.outputs)]


def _source(spec: TaskSpec, knobs: TritonScanKnobs) -> str:
    return triton_scan.candidate(spec, scan.lower(spec), knobs).source


def test_the_recipe_writes_every_case_and_the_modules_pass_forge_checks():
    for case, _ in CASES:
        spec, low = spec_of(case), scan.lower(spec_of(case))
        assert (low.state is not None, low.final >= 0, low.l2norm) == (case.state, case.final, case.l2norm)
        for knobs in triton_scan.seeds(low):
            cand = triton_scan.candidate(spec, low, knobs)
            assert cand.backend == "triton" and check(cand) == [], (case, knobs, check(cand))


@pytest.mark.slow
def test_scan_kernels_match_the_library_under_the_interpreter(tmp_path):
    jobs, refs = [], []
    for case, knobs in CASES:
        spec = spec_of(case)
        inputs = _domain_inputs(spec, 0)
        jobs.append((_source(spec, knobs), inputs, _outputs(spec)))
        refs.append((case, knobs, spec, compile_source(spec.source)(*inputs)))
    errors = []
    for (case, knobs, spec, ref), (rc, outs) in zip(refs, interpret(tmp_path, jobs), strict=True):
        assert rc == 0, (case, knobs, rc)
        for o, r, m in zip(outs, ref, spec.outputs, strict=True):
            assert not o.isnan().any(), (case, knobs, "unwritten elements")
            err = rel_error(o, r)
            errors.append(f"{case.t} tokens {m.short()} {err:.1e}")
            assert err <= tolerance(m.dtype).kernel, (case, knobs, m.dtype, err)
    print("max errors against the library:", "; ".join(errors))


@pytest.mark.slow
def test_qwens_strided_views_and_the_launcher_guards_under_the_interpreter(tmp_path):
    """Qwen 3.5's task: q, k and v views of the convolution's output (token stride 1, channel stride 2048 at
    full length), 16 heads of 128 x 128; the same tensors made contiguous are refused (2), nothing written."""
    spec = qwen_spec()
    source = _source(spec, TritonScanKnobs(64, 4, prefetch=True))
    inputs = _domain_inputs(spec, 1)
    other = [x.contiguous() for x in inputs]
    (rc, outs), (rc2, outs2) = interpret(tmp_path, [(source, inputs, _outputs(spec)), (source, other, _outputs(spec))])
    assert (rc, rc2) == (0, 2) and outs2[0].isnan().all()
    (ref,) = compile_source(spec.source)(*inputs)
    err = rel_error(outs[0], ref)
    print(f"Qwen 3.5's scan at 80 tokens: max error {err:.1e} against the library")
    assert err <= tolerance(torch.bfloat16).kernel


def verify_interpreted(tmp_path: Path, jobs: list[tuple[str, TaskSpec, int]]) -> list[tuple]:
    """(status, message, max error) of forge's verification of each (Triton source, spec, seed), run with Triton's
    interpreter in a process of its own (tests/triton_verify.py)."""
    files = []
    for n, (source, spec, seed) in enumerate(jobs):
        path = tmp_path / f"verified_{n}.py"
        path.write_text(source)
        files.append((str(path), spec, seed))
    (tmp_path / "jobs.pkl").write_bytes(pickle.dumps(files))
    done = subprocess.run([sys.executable, str(HERE / "triton_verify.py"), str(tmp_path / "jobs.pkl"),
                           str(tmp_path / "results.pkl")], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return pickle.loads((tmp_path / "results.pkl").read_bytes())


# Wrong kernels the verification must reject: each is the recipe's kernel with one step of the rule left out.
WRONG = {
    "the state not decayed": ("S = S * tl.exp(gt)", "S = S"),
    "beta left out of the update": ("* bt\n", "\n"),
    "k not L2-normalised": ("k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-06))", "k = k"),
    "the output read before the update": ("S = S + k[:, None] * u[None, :]\n        tl.store(po, "
                                          "tl.sum(S * q[:, None], axis=0).to(tl.bfloat16), mask=md)",
                                          "tl.store(po, tl.sum(S * q[:, None], axis=0).to(tl.bfloat16), mask=md)\n"
                                          "        S = S + k[:, None] * u[None, :]"),
}


@pytest.mark.slow
def test_forge_verification_passes_the_recipe_and_rejects_a_step_left_out(tmp_path):
    """forge.evaluate.verify's input sets (the hard values too, g and beta drawn in their domains), reference and
    tolerances, as for Qwen's task: bf16 in and out, no state."""
    spec = spec_of(CASES[3][0])
    right = _source(spec, TritonScanKnobs())
    jobs = [(right, spec, 7)]
    for old, new in WRONG.values():
        assert right.count(old) == 1, old
        jobs.append((right.replace(old, new), spec, 7))
    (status, message, err), *wrong = verify_interpreted(tmp_path, jobs)
    assert status == "ok", message
    print(f"verified: max error {err:.1e}")
    for why, (status, message, _) in zip(WRONG, wrong, strict=True):
        assert status in ("wrong_result", "low_precision"), (why, status, message)


def test_the_policy_proposes_triton_scans_on_a_gpu_and_rebuilds_them_from_knobs():
    spec = spec_of(CASES[0][0])
    for policy in (RecipePolicy("cuda"), RecipePolicy("cuda", triton=True)):
        assert policy.refusal(spec) is None
        seeds = policy.propose(spec, None)
        assert seeds and all(isinstance(k, TritonScanKnobs) for k in seeds)  # no row or pointwise knobs
        cand = policy.render(spec, seeds[0])
        assert cand.backend == "triton" and check(cand) == []
        assert policy.payload_of(spec, dataclasses.asdict(seeds[1])) == seeds[1]
        children = policy.propose(spec, seeds[0])
        assert children and all(isinstance(c, TritonScanKnobs) for c in children)
    # at 8 value columns every block_v from 8 up writes the same kernel: proposed once
    codes = {policy.render(spec, k).source.split("\n# forge recipe")[1].split("\n", 1)[1] for k in seeds}
    assert len(codes) == len(seeds)
