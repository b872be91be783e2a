"""torch.compile(model, backend="forge"): forge as a TorchDynamo backend (forge.backend), searching or from an
artifact, on the CPU with real searches and kernels.

The shared development venv has forge installed from another checkout, so its metadata lacks this tree's entry
point: the in-process tests register the backend by hand (forge.backend.register, what the entry point names),
and `test_the_entry_point_is_what_dynamo_finds` checks the real mechanism in a subprocess, on a dist-info
generated from pyproject.toml's `torch_dynamo_backends` table put first on the path.
"""

import logging
import subprocess
import sys

import pytest
import torch
from conftest import EXAMPLES, ROOT

import forge
import forge.backend
from forge.capture.export import capture
from forge.capture.model_input import load_file
from forge.evaluate.build import build
from forge.kernel import KernelArtifact, TaskSpec
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.pointwise import Knobs, candidate, lower
from forge.runtime import artifact
from forge.runtime.artifact import ArtifactError
from forge.runtime.variants import Variant
from forge.tasks.cut import build_tasks


@pytest.fixture
def compiled():
    """torch.compile with backend="forge" registered, Dynamo's caches emptied before and after."""
    forge.backend.register()
    torch._dynamo.reset()
    yield lambda model, **options: torch.compile(model, backend="forge", fullgraph=True, options=options)
    torch._dynamo.reset()


def _graphs(**options):
    """The backend's live graphs compiled with these options (earlier tests' may live on in Dynamo's caches)."""
    return [g for g in forge.backend.graphs() if all(g.options[k] == v for k, v in options.items())]


def _swiglu():
    torch.manual_seed(0)
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py")
    return loaded.model.eval(), loaded.inputs


def _recipe_kernels(model, inputs):
    """A built recipe kernel for every pointwise task of `model` captured on `inputs`."""
    arts = []
    for t in build_tasks(capture(model, inputs).graph_module.graph):
        try:
            c = candidate(lower(TaskSpec.of(t)), Knobs())
        except NotMine:
            continue
        b = build(c)
        assert b.ok, b.log
        arts.append(KernelArtifact(t.key, "cpu", b.path, c.entry, t.inputs, t.outputs, t.source))
    return arts


class Other(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 3.0).tanh()


@pytest.mark.slow
def test_the_backend_searches_the_graph_then_loads_its_artifact(compiled, tmp_path, caplog):
    model, (x,) = _swiglu()
    fast = compiled(model, seconds=15, budget=4, db=str(tmp_path / "forge.db"), runs_dir=str(tmp_path / "runs"))
    y = torch.randn_like(x)
    with torch.no_grad(), caplog.at_level(logging.INFO, "forge.backend"):
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)  # the first call searches
        torch.testing.assert_close(fast(y), model(y), rtol=1e-4, atol=1e-4)
    (graph,) = _graphs(runs_dir=str(tmp_path / "runs"))
    assert graph.counters()["graph"] == {"hits": 2, "fallbacks": {}} and "searched this graph: run" in caplog.text
    (run,) = (tmp_path / "runs").iterdir()  # the search's artifact, as forge.optimize writes it
    keys = {k.key for k in artifact.read(run)}

    torch._dynamo.reset()
    caplog.clear()
    again = compiled(model, artifact=str(run))
    with torch.no_grad(), caplog.at_level(logging.INFO, "forge.backend"):
        torch.testing.assert_close(again(y), model(y), rtol=1e-4, atol=1e-4)
    (graph,) = _graphs(artifact=str(run))
    assert graph.kernels == {"used": len(keys), "not used": 0}  # the same graph: every kernel found its task
    assert f"{len(keys)} of {len(keys)} kernels of {run} used" in caplog.text and not graph.fallbacks


def test_the_backend_uses_an_artifacts_kernels_where_the_graph_has_their_task(compiled, tmp_path, caplog):
    model, (x,) = _swiglu()
    arts = _recipe_kernels(model, [x])
    foreign = _recipe_kernels(Other(), [torch.randn(7, 5)])  # a kernel for a task this graph does not have
    assert len(arts) == 2 and len(foreign) == 1
    artifact.save(tmp_path / "a", arts + foreign, {"device_model": artifact.device_model("cpu"), "layout": "",
                                                    "variant": Variant(True, (), "graph").to_json()})
    fast = compiled(model, artifact=str(tmp_path / "a"))
    with caplog.at_level(logging.INFO, "forge.backend"):
        with torch.no_grad():
            for _ in range(3):
                y = torch.randn_like(x)
                torch.testing.assert_close(fast(y), model(y), rtol=1e-5, atol=1e-5)
        fast(x).sum().backward()  # gradients needed: the graph itself runs, and backward works
    assert model.gate.weight.grad is not None
    graph, grad = _graphs(artifact=str(tmp_path / "a"))  # Dynamo guards on grad mode: that call got its own graph
    counters = graph.counters()
    assert graph.kernels == {"used": 2, "not used": 1} and "2 of 3 kernels" in caplog.text
    assert {k for k, c in counters.items() if k in {a.key for a in arts} and c.hits == 3} == {a.key for a in arts}
    assert counters["graph"] == {"hits": 3, "fallbacks": {}}
    assert grad.counters() == {"graph": {"hits": 0, "fallbacks": {"gradient needed": 1}}}  # nothing built for it


def test_a_refused_artifact_raises_and_a_typo_is_refused(compiled, tmp_path):
    model, (x,) = _swiglu()
    fast = compiled(model, artifact=str(tmp_path / "missing"))
    with torch.no_grad(), pytest.raises(ArtifactError, match="Invalid artifact"):
        fast(x)  # a missing (or changed) artifact is said, not hidden behind the graph's own forward
    with torch.no_grad():  # after that, the graph as it is: nothing is tried again
        torch.testing.assert_close(fast(x), model(x))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Invalid forge backend option"):
        compiled(model, secs=3)(x)


def test_the_entry_point_is_what_dynamo_finds(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    group = project["entry-points"]["torch_dynamo_backends"]
    assert group == {"forge": "forge.backend:backend"}
    info = tmp_path / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("[torch_dynamo_backends]\n" +
                                           "".join(f"{k} = {v}\n" for k, v in group.items()))
    script = ("import torch, forge.backend\n"
              "from torch._dynamo.backends.registry import list_backends, lookup_backend\n"
              "assert 'forge' in list_backends() and lookup_backend('forge') is forge.backend.backend\n"
              "from forge.runtime.artifact import ArtifactError\n"
              "m, x = torch.nn.Linear(8, 8), torch.randn(2, 8)\n"
              "try:\n"
              "    with torch.no_grad():\n"
              "        torch.compile(m, backend='forge', options={'artifact': '/nowhere'})(x)\n"
              "except ArtifactError as e:\n"
              "    print('ok' if 'Invalid artifact /nowhere' in str(e) else e)\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]  # forge's backend ran: it
    # read the options and said the artifact is not there
