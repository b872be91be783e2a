"""Helion recipes: the generated modules pass forge's Helion checks (forge.evaluate.tilechecks) and, run on CPU
tensors as the Triton Helion generates under Triton's interpreter (TRITON_INTERPRET=1), match the float64
reference on the Triton recipes' tasks (odd sizes, tails, broadcasts, strided and channels-last tensors); the
recipe policy offers them beside CUDA on a GPU, and the config a candidate runs with is exported with it."""

import dataclasses

import pytest
import torch
from test_recipe_triton import _inputs, _outputs, interpret, specs

from forge.evaluate.checks import check
from forge.kernel import TaskSpec
from forge.policy.recipes import helion_kernels, pointwise, rowreduce
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.helion_common import HelionKnobs, HelionRowKnobs
from forge.policy.recipes.policy import RecipePolicy
from forge.tasks.cut import compile_source
from forge.tolerance import rel_error, tolerance

pytest.importorskip("helion")


def _knobs(spec: TaskSpec) -> list[HelionKnobs | HelionRowKnobs]:
    """The recipe's schedules, each with tails: pointwise tiles of 64; rows held whole two to a tile (float32 and
    float64 statistics), and walked in four chunks or so with float64 statistics (few: the interpreter's time grows
    with the loop's trips)."""
    try:
        pointwise.lower(spec)
        return [HelionKnobs(block=64, warps=2)]
    except NotMine:
        chunk = max(16, (1 << (rowreduce.lower(spec).length - 1).bit_length()) // 4)
        return [HelionRowKnobs(rows=2), HelionRowKnobs(rows=2, acc64=True),
                HelionRowKnobs(passes=2, chunk=chunk, warps=2, acc64=True)]


def test_helion_recipes_take_every_task_the_triton_recipes_take():
    kinds = set()
    for spec in specs():
        for knobs in _knobs(spec):
            cand = helion_kernels.candidate(spec, knobs)
            assert cand.backend == "helion"
            assert check(cand) == [], (spec.key, knobs, check(cand))
            kinds.add(type(knobs))
    assert kinds == {HelionKnobs, HelionRowKnobs}


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about 40 kernels compiled by Helion and interpreted: minutes on two busy cores
def test_generated_helion_matches_eager_under_the_interpreter(tmp_path):
    jobs, cases = [], []
    for spec in specs():
        for knobs in _knobs(spec):
            source = helion_kernels.candidate(spec, knobs).source
            inputs = _inputs(spec, 0)
            jobs.append((source, inputs, _outputs(spec)))
            cases.append((spec, knobs, inputs))
    wrong = []
    for (spec, knobs, inputs), (rc, outs) in zip(cases, interpret(tmp_path, jobs), strict=True):
        if rc != 0:
            wrong.append((spec.key, knobs, rc))
            continue
        refs = compile_source(spec.source)(*[x.double() for x in inputs])
        for o, r, m in zip(outs, refs, spec.outputs, strict=True):
            err = rel_error(o, r, r.isfinite())
            if not torch.equal(o.isnan(), r.isnan()) or err > tolerance(m.dtype).kernel:
                wrong.append((spec.key, knobs, m.dtype, err, "NaN where eager has none, or none where it has"
                              if not torch.equal(o.isnan(), r.isnan()) else "error"))
    assert not wrong, wrong


def test_the_policy_offers_helion_beside_cuda_on_a_gpu_and_mutates_its_config():
    policy = RecipePolicy("cuda", helion=True)
    assert policy.helion and not policy.triton and policy.name == "recipes+helion"
    for spec in specs()[:6]:
        ideas = policy.propose(spec, None)
        helion = [i for i in ideas if isinstance(i, (HelionKnobs, HelionRowKnobs))]
        assert helion and len(helion) < len(ideas), spec.key  # both backends at the root
        cand = policy.render(spec, helion[0])
        assert cand.backend == "helion" and check(cand) == []
        assert policy.payload_of(spec, dataclasses.asdict(helion[0])) == helion[0]  # how --resume rebuilds it
        children = policy.propose(spec, helion[0])
        assert children and all(type(c) is type(helion[0]) for c in children)  # a mutation keeps the backend
        changed = {f for c in children for f, v in dataclasses.asdict(c).items() if v != getattr(helion[0], f)}
        assert {"warps", "stages"} <= changed  # the config is the search's to tune, not an autotuner's
        for c in children:  # each proposed child renders (the policy drops what its recipe refuses)
            assert f"num_warps={c.warps}, num_stages={c.stages}" in policy.render(spec, c).source
    assert not RecipePolicy("cpu", helion=True).helion  # never on a CPU


def test_helion_recipes_are_asked_for_by_name_and_stored_so():
    from forge.job import make_policy

    assert not make_policy("recipes", "cuda").helion
    assert make_policy("recipes+helion", "cuda").name == "recipes+helion"
    assert not make_policy("recipes+helion", "cpu").helion  # never on a CPU
