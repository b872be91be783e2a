"""forge optimize end to end on the CPU: a real search, store, artifact, dispatch and measurement."""

import json

import pytest
import torch
from conftest import EXAMPLES

import forge
from forge.capture.model_input import load_file
from forge.cli import main
from forge.store import Store


def test_optimize_writes_report_store_and_a_loadable_artifact(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # runs/ lands here
    out = tmp_path / "report.json"
    code = main(["optimize", str(EXAMPLES / "rmsnorm_swiglu.py"), "--budget", "12", "--db", str(tmp_path / "f.db"),
                 "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert {"run_id", "device", "policy", "eager_ms", "forge_ms", "speedup", "outputs_match", "max_rel_err",
            "tasks", "cost"} <= report.keys()
    assert report["outputs_match"] is True and report["eager_ms"] > 0 and report["forge_ms"] > 0
    assert {"usd", "tokens_in", "tokens_out", "device_seconds", "wall_seconds"} <= report["cost"].keys()
    by_family = {t["family"]: t for t in report["tasks"]}
    assert by_family["matmul"]["status"] == "not mine"
    searched = [t for t in report["tasks"] if t["candidates"]]
    assert searched and all(t["stop_reason"] for t in report["tasks"])
    assert sum(t["candidates"] for t in report["tasks"]) <= 12

    store = Store(str(tmp_path / "f.db"))
    run = store.get_run(report["run_id"])
    assert run.state == "done" and run.eager_ms == report["eager_ms"]
    stored = sum(len(store.candidates(t.id)) - 1 for t in store.get_tasks(run.id) if store.candidates(t.id))
    assert stored == sum(t["candidates"] for t in report["tasks"])  # every evaluated candidate is stored

    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py")
    opt = forge.load(tmp_path / report["artifact"], loaded.model, loaded.inputs)
    x = torch.randn(4, 256, 512)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), loaded.model(x), rtol=1e-4, atol=1e-5)
    variant = report["variant"]  # the fastest variant measured end to end: with the kernels or without
    assert report["applied"] == (variant is not None)
    assert not report["applied"] or report["forge_ms"] < report["eager_ms"]
    used = variant is not None and variant["kernels"]
    improved = [t["key"] for t in report["tasks"] if t["status"] == "improved"] if used else []
    counters = opt.counters()
    assert counters.pop("model").hits == 1 and sorted(counters) == sorted(improved)
    assert all(c.hits == 1 for c in counters.values())
    assert {m["variant"]["runtime"] for m in report["variants"]} >= {"graph", "inductor"}


@pytest.mark.cuda
def test_optimize_on_the_gpu_generates_cuda_kernels_and_keeps_outputs(tmp_path, monkeypatch):
    """The same job on an NVIDIA GPU in bf16: CUDA recipes searched, the artifact loadable with its kernels."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.json"
    code = main(["optimize", str(EXAMPLES / "rmsnorm_swiglu.py"), "--device", "cuda", "--dtype", "bf16",
                 "--budget", "16", "--db", str(tmp_path / "f.db"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cuda" and report["outputs_match"] is True
    improved = [t for t in report["tasks"] if t["status"] == "improved"]
    assert improved and all(t["speedup"] > 1.05 for t in improved)
    store = Store(str(tmp_path / "f.db"))
    backends = {c.backend for t in store.get_tasks(report["run_id"]) for c in store.candidates(t.id)}
    assert "cuda" in backends
    assert report["graph_ms"] > 0 and report["graph_note"] == ""  # the patched forward was timed as a CUDA graph
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py", "cuda", "bf16")
    opt = forge.load(tmp_path / report["artifact"], loaded.model, loaded.inputs)
    if report["cuda_graph"]:  # the chosen variant's patched forward replays as a CUDA graph (forge.load's ForgeModel)
        assert opt.patched is not None and opt.patched.cuda_graph and opt.patched.graph_error == ""
    for _ in range(2):  # a replayed graph computes on each call's inputs
        x = torch.randn_like(loaded.inputs[0])
        with torch.no_grad():
            got, want = opt(x), loaded.model(x)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    if report["applied"] and report["variant"]["kernels"]:  # the fastest variant may be one without them
        assert opt.counters() and all(c.hits >= 1 and not c.fallbacks for c in opt.counters().values())
    else:
        assert not opt.counters()


@pytest.mark.cuda
def test_a_cuda_graph_replays_the_patched_model_on_new_inputs():
    """forge.apply(cuda_graph=True): captured on the first call, replayed after, outputs cloned out."""
    from forge.runtime.dispatch import apply

    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py", "cuda", "bf16")
    opt = apply(loaded.model, loaded.inputs, [], cuda_graph=True)
    outs = []
    for _ in range(3):
        x = torch.randn_like(loaded.inputs[0])
        with torch.no_grad():
            got, want = opt(x), loaded.model(x)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        outs.append((got, want))
    assert opt.cuda_graph and opt.graph_error == "" and opt._replay is not None
    got, want = outs[0]  # later replays did not overwrite what the first call returned
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_the_search_ends_early_enough_for_the_compilation_after_it():
    from forge.job import _search_seconds
    from forge.runtime.variants import Ahead

    # no floor measured ahead (the CPU): its share of the run, less what capture took; never under 5 s
    assert _search_seconds(300.0, 20.0, None) == 130.0 and _search_seconds(300.0, 200.0, None) == 5.0
    # a 90-s floor and a 40-s chain ahead: the re-timing (a tenth), the chain with kernels and one more
    # compilation must fit before 0.95 of the run, which ends the search before its share
    assert _search_seconds(300.0, 100.0, Ahead((object(),), 90.0, 40.0)) == pytest.approx(300 * 0.85 - 230)
    assert _search_seconds(300.0, 100.0, Ahead((), 90.0, 40.0)) == 50.0  # nothing measured: the share alone
    # a short floor leaves the share as it is
    assert _search_seconds(300.0, 60.0, Ahead((object(),), 10.0, 10.0)) == 90.0
