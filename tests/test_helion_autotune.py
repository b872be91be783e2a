"""Helion's autotuner for a Helion candidate (issue 18 item 2): the worker's answer is data, checked field by field
and written into the kernel's `config=` (forge.evaluate.autotune); the search's end of a task gives it a share of
the time left (forge.search.tune); on a GPU the tuned candidate is judged as any other."""

import json

import pytest
import torch
from test_recipe_triton import specs

from forge.evaluate.autotune import config_text, kernel_names, parse_configs, with_configs
from forge.evaluate.checks import check
from forge.kernel import Candidate
from forge.policy.recipes import helion_kernels
from forge.policy.recipes.helion_common import HelionKnobs, HelionRowKnobs
from forge.search import tune
from forge.search.mcts import MCTS, Node

pytest.importorskip("helion")


def _candidate(rows: bool = False) -> Candidate:
    for spec in specs():
        try:
            return helion_kernels.candidate(spec, HelionRowKnobs(rows=2) if rows else HelionKnobs(block=64, warps=2))
        except Exception:  # noqa: BLE001 - not this lowering's task
            continue
    raise AssertionError("no task takes the recipe")


@pytest.mark.parametrize("rows", [False, True])
def test_the_chosen_config_is_written_into_the_kernel_and_passes_the_checks(rows: bool) -> None:
    cand = _candidate(rows)
    names = kernel_names(cand.source)
    assert names
    chosen = {n: {"block_sizes": [256], "num_warps": 8, "num_stages": 3, "indexing": "tensor_descriptor",
                  "pid_type": "flat", "range_unroll_factors": [0]} for n in names}
    tuned = with_configs(cand.source, parse_configs(json.dumps([[n, c] for n, c in chosen.items()]), names))
    for n in names:
        assert config_text(chosen[n]) in tuned
    assert check(Candidate("helion", tuned, cand.entry)) == []
    before, after = cand.source.splitlines(), tuned.splitlines()
    assert len(before) == len(after)  # only the config changed: the rest, comments too, as it was
    assert sum(a != b for a, b in zip(before, after, strict=True)) == len(names)
    assert "helion.Config(block_sizes=[256], indexing='tensor_descriptor', num_stages=3, num_warps=8" in tuned


@pytest.mark.parametrize("answer", [
    [["not_a_kernel", {"num_warps": 4}]],  # a name the candidate has no kernel of
    [["K", {"num_warps": {"x": 1}}]],  # a nested dict
    [["K", {"num_warps": [[[1]]]}]],  # lists too deep
    [["K", {"indexing": "pointer'); import os; ('"}]],  # a string that is not a plain word
    [["K", {"import": 1}]],  # a keyword for a key
    [["K", {"num_warps": 1 << 40}]],  # an absurd number
    [["K", {}]],  # no config at all
    [[["K"], {"num_warps": 4}]],  # a name that is not a string
    [],
    {"K": {"num_warps": 4}},
])
def test_an_answer_that_is_not_plain_data_is_refused(answer: object) -> None:
    with pytest.raises(ValueError):
        parse_configs(json.dumps(answer), {"K"})
    with pytest.raises(ValueError):
        parse_configs('[["K", {"num_warps": NaN}]]', {"K"})


def test_the_effort_follows_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tune.plan(None) == ("full", tune.MAX_S)
    assert tune.plan(10.0) is None  # 5 s would find little
    assert tune.plan(100.0) == ("quick", 50)
    assert tune.plan(100.0, kernels=2) == ("quick", 25)  # two kernels share half the time left
    assert tune.plan(50.0, kernels=2) is None
    assert tune.plan(5000.0) == ("full", tune.MAX_S)
    monkeypatch.setenv("FORGE_HELION_AUTOTUNE", "0")
    assert tune.plan(None) is None


def test_a_node_the_autotuner_made_is_never_tuned_again_nor_breaks_a_resume() -> None:
    made = tune.payload(7, "quick")
    assert tune.grafted(made) and tune.grafted({"payload": made})  # as made, and as stored and read back
    assert not tune.grafted(HelionKnobs(block=64, warps=2)) and not tune.grafted({"payload": 3})

    def propose(node: Node) -> list:
        if isinstance(node.payload, dict):  # what the recipe policy does with a payload not its own
            raise KeyError(type(node.payload))
        return ["a"]

    tree = MCTS(propose)
    tree.restore(1, 0, "a", 0.1)
    tree.restore(2, 1, {"payload": made}, 0.2)  # the autotuned child, stored
    tree.restore(3, 2, {"payload": made}, 0.3)  # one made under it by an earlier resume: its parent cannot expand
    assert tree.nodes[2].proposals == [] and tree.nodes[3].reward == 0.3


def test_the_worker_records_each_kernel_as_the_launcher_calls_it_without_running_it(tmp_path) -> None:
    """forge.evaluate.helion_tune binds a recorder to each kernel's name while the launcher runs: the arguments the
    autotuner will be given, positional or by keyword, and the kernels themselves back in place after."""
    import importlib.util

    from forge.evaluate.helion_tune import recorded_calls

    spec = next(s for s in specs() if s.inputs[0].dtype == "float32")
    cand = helion_kernels.candidate(spec, HelionKnobs(block=64, warps=2))
    path = tmp_path / "cand.py"
    path.write_text(cand.source)
    loader = importlib.util.spec_from_file_location("cand_under_test", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    inputs = [torch.randn(m.shape) for m in spec.inputs]
    outputs = [torch.full(m.shape, 7.0) for m in spec.outputs]
    before = {n: getattr(module, n) for n in kernel_names(cand.source)}
    calls = recorded_calls(module, module.launch, inputs, outputs)
    assert calls and {n for n, _, _ in calls} == set(before)
    assert all(k is before[n] for n, k, _ in calls) and all(isinstance(a, tuple) and a for _, _, a in calls)
    assert {n: getattr(module, n) for n in before} == before  # put back
    assert all(bool((o == 7.0).all()) for o in outputs)  # recorded, not run

    def by_keyword(ins: list, outs: list) -> None:  # a launcher that names the kernel's parameters
        kernel = next(iter(before.values()))
        params = list(kernel.signature.parameters)
        module_kernel = getattr(module, next(iter(before)))
        module_kernel(**dict(zip(params, calls[0][2], strict=False)))

    (_, _, args), = recorded_calls(module, by_keyword, inputs, outputs)
    assert len(args) == len(calls[0][2]) and all(a is b for a, b in zip(args, calls[0][2], strict=True))


@pytest.mark.cuda
@pytest.mark.timeout(600)
def test_helions_autotuner_gives_a_config_that_is_judged_like_any_candidate(tmp_path) -> None:
    from forge.evaluate.evaluator import Evaluator

    spec = next(s for s in specs() if s.inputs[0].dtype == "float32")
    cand = helion_kernels.candidate(spec, HelionKnobs(block=64, warps=2))
    with Evaluator("cuda", cache_dir=tmp_path, timeout_s=120) as ev:
        tuned = ev.autotune(spec, cand, "quick", 20)
        assert tuned.candidate is not None, tuned.message
        assert {n for n, _ in tuned.configs} == kernel_names(cand.source)
        assert all(text in tuned.candidate.source for _, text in tuned.configs)
        res = ev.evaluate(spec, tuned.candidate)
        assert res.status.passed, res.message
        assert res.timing is not None and torch.cuda.is_available()


def test_the_search_is_seeded_with_the_config_the_candidate_was_judged_with(tmp_path) -> None:
    """forge.evaluate.helion_tune.settle: the seeds Helion's search takes into its first population, read as it
    reads them (the settings, then transferred onto the kernel bound to the launcher's arguments), are the
    candidate's own config, the one it was judged with."""
    import importlib.util

    from helion.autotuner.base_search import normalize_autotune_seed_configs

    from forge.evaluate.helion_tune import recorded_calls, settle

    spec, made = next(s for s in specs() if s.inputs[0].dtype == "float32"), 0
    for knobs in (HelionKnobs(block=64, warps=2), HelionRowKnobs(rows=2)):
        try:
            cand = helion_kernels.candidate(spec, knobs)
        except Exception:  # noqa: BLE001 - not this lowering's task
            continue
        path = tmp_path / f"cand_{type(knobs).__name__}.py"
        path.write_text(cand.source)
        loader = importlib.util.spec_from_file_location(f"cand_seeded_{type(knobs).__name__}", path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        inputs = [torch.randn(m.shape) for m in spec.inputs]
        outputs = [torch.empty(m.shape) for m in spec.outputs]
        calls = recorded_calls(module, module.launch, inputs, outputs)
        assert calls
        made += 1
        for _, kernel, args in calls:
            assert normalize_autotune_seed_configs(kernel.settings) == ()
            settle(kernel, "quick", 30)
            assert (kernel.settings.autotune_effort, kernel.settings.autotune_budget_seconds) == ("quick", 30)
            bound = kernel.bind(args)
            generation = bound.env.config_spec.create_config_generation(
                overrides=kernel.settings.autotune_config_overrides or None)
            seeds = generation.user_seed_flat_config_pairs(normalize_autotune_seed_configs(kernel.settings))
            assert [c for _, c in seeds] == [bound._normalized_config_copy(kernel.configs[0])]
            assert dict(seeds[0][1].config)["num_warps"] == dict(kernel.configs[0].config)["num_warps"]
    assert made
