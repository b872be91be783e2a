"""The model as given: a BatchNorm model in training mode (batch statistics, running statistics updated) is
captured, dispatched, compared and optimized as that function, not as its eval-mode one."""

import copy
import json

import torch
from conftest import MODELS

import forge
from forge.capture.model_input import load_file
from forge.cli import main
from forge.runtime.endtoend import outputs_match
from forge.runtime.variants import Variant, build


def _train_and_eval():
    loaded = load_file(MODELS / "conv_batchnorm.py")
    return loaded, copy.deepcopy(loaded.model).eval()


def test_the_two_modes_are_different_functions():
    loaded, ev = _train_and_eval()
    with torch.no_grad():
        a, b = loaded.model(*loaded.inputs), ev(*loaded.inputs)
    assert (a - b).abs().max() > 0.5 * a.abs().max()


def test_the_patched_graph_in_training_mode_matches_and_updates_the_running_statistics():
    loaded, _ = _train_and_eval()
    model, twin = loaded.model, copy.deepcopy(loaded.model)
    fast = forge.apply(model, loaded.inputs, [])
    x = torch.randn_like(loaded.inputs[0])
    with torch.no_grad():
        got, want = fast(x), twin(x)
    torch.testing.assert_close(got, want)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(model.bn, name), getattr(twin.bn, name))
    assert int(model.bn.num_batches_tracked) == 1 and fast.counters()["model"].hits == 1


def test_outputs_match_refuses_the_other_mode_and_a_forward_that_skips_the_update():
    loaded, ev = _train_and_eval()
    model, x = loaded.model, loaded.inputs
    assert outputs_match(model, lambda *a: model(*a), x)[0]
    assert not outputs_match(model, ev, x)[0]  # eval mode: another function
    # the same outputs, but the model's running statistics left as they were (a copy's updated instead)
    assert not outputs_match(model, copy.deepcopy(model), x)[0]
    assert int(model.bn.num_batches_tracked) == 0  # the comparison left the buffers as they were


def test_fold_bn_folds_an_eval_mode_batch_norm_only():
    loaded, ev = _train_and_eval()
    fold = Variant(False, ("fold-bn",), "graph")
    assert build(loaded.model, loaded.inputs, [], fold, "cpu")[2] == {"fold-bn": 0}
    assert build(ev, loaded.inputs, [], fold, "cpu")[2] == {"fold-bn": 1}


def test_a_result_built_in_one_mode_runs_the_model_in_the_other(caplog):
    loaded, _ = _train_and_eval()
    fast = forge.apply(loaded.model, loaded.inputs, [])
    loaded.model.eval()
    x = torch.randn_like(loaded.inputs[0])
    with torch.no_grad():
        torch.testing.assert_close(fast(x), loaded.model(x))
    assert fast.counters()["model"].fallbacks["mode changed"] == 1 and "eval mode" in caplog.text


def _optimize(tmp_path, *extra):
    out = tmp_path / "report.json"
    code = main(["optimize", str(MODELS / "conv_batchnorm.py"), "--budget", "4", "--seconds", "20", "--no-inductor",
                 "--db", str(tmp_path / "f.db"), "--json", str(out), *extra])
    assert code == 0
    return json.loads(out.read_text())


def _check(tmp_path, report, eval_mode):
    """Forge's result, loaded on the model in the report's mode, computes that mode's function."""
    loaded = load_file(MODELS / "conv_batchnorm.py", eval=eval_mode)
    twin = copy.deepcopy(loaded.model)
    fast = forge.load(tmp_path / report["artifact"], loaded.model, loaded.inputs)
    x = torch.randn_like(loaded.inputs[0]) * 2 + 1
    with torch.no_grad():
        torch.testing.assert_close(fast(x), twin(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loaded.model.bn.running_mean, twin.bn.running_mean)
    graph = next(m for m in report["variants"] if m["variant"]["name"] == "eager graph, graph")
    assert graph["match"]  # the captured graph, dispatched, matched eager in this mode


def test_optimize_runs_a_file_as_constructed_and_says_train(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    report = _optimize(tmp_path)
    assert report["mode"] == "train" and report["outputs_match"] is True
    assert "training mode" in capsys.readouterr().out
    manifest = json.loads((tmp_path / report["artifact"] / "manifest.json").read_text())
    assert manifest["mode"] == "train"
    _check(tmp_path, report, eval_mode=False)


def test_optimize_with_eval_says_eval(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = _optimize(tmp_path, "--eval")
    assert report["mode"] == "eval" and report["outputs_match"] is True
    _check(tmp_path, report, eval_mode=True)
