"""The export's Helion forms: a run whose tasks have verified Helion candidates beside their CPU winners exports
each as the no-arch form in `torch-universal`, with its tuned config in its source, and the package runs that
form in a fresh process (the Triton Helion generates, under Triton's interpreter on CPU tensors) with nothing
autotuned."""

import json
import os
import subprocess
import sys

import pytest
import torch
from test_export import MODEL, _kernels

from forge.capture.model_input import load_file
from forge.cli import main
from forge.evaluate.checks import check_python
from forge.kernel import TaskSpec
from forge.policy.recipes import helion_kernels
from forge.policy.recipes.helion_common import HelionKnobs, HelionRowKnobs
from forge.runtime import artifact
from forge.store import Store

pytest.importorskip("helion")
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def helion_exported(tmp_path_factory):
    """An export of a run whose tasks each have a CPU winner, a verified Helion candidate and a verified Triton one
    with a lower reward (the export takes the best verified Python form: Helion's). Large tiles: few programs for
    the interpreter to run (tests/test_recipe_helion.py checks the schedules)."""
    from forge.policy.recipes import triton_kernels
    from forge.policy.recipes.triton_common import TritonKnobs, TritonRowKnobs

    tmp = tmp_path_factory.mktemp("helion_run")
    torch.manual_seed(0)
    loaded = load_file(MODEL, eval=True)
    kernels = _kernels(loaded.model, loaded.inputs)
    store = Store(tmp / "forge.db")
    rec = store.create_run(loaded.name, device="cpu", dtype="fp32", policy="recipes",
                           config={"load": {"file": str(MODEL), "zoo": None, "sizes": {}}, "mode": "eval"})
    good = {}
    for k in kernels:
        spec = TaskSpec(k.key, k.source, k.inputs, k.outputs)
        rows = not k.key.startswith(("silu", "add", "mul"))
        helion = helion_kernels.candidate(spec, HelionRowKnobs(rows=16) if rows else HelionKnobs(16384, 8))
        triton = triton_kernels.candidate(spec, TritonRowKnobs() if rows else TritonKnobs())
        task = store.add_task(rec.id, k.key, source=k.source)
        # the root the search records first (forge.store.recorder): the reference, no form of a kernel
        store.add_candidate(task.id, None, backend="eager", source=k.source, origin="baseline", status="ok")
        store.add_candidate(task.id, backend="cpu", source=k.kernel_source, status="ok", reward=2.0)
        store.add_candidate(task.id, backend="helion", source=helion.source, entry="launch", status="ok", reward=1.5)
        store.add_candidate(task.id, backend="triton", source=triton.source, entry="launch", status="ok", reward=1.0)
        good[k.key] = helion.source
    folder = tmp / rec.id
    artifact.save(folder, kernels, {"run_id": rec.id, "model": loaded.name, "device": "cpu", "dtype": "fp32",
                                    "device_model": artifact.device_model("cpu"), "layout": "", "mode": "eval"})
    store.update_run(rec.id, state="done", config={**rec.config, "artifact": str(folder)})
    out = tmp / "repo"
    assert main(["export", rec.id, str(out), "--format", "hf-kernels", "--db", str(tmp / "forge.db")]) == 0
    return out, good


def test_the_best_verified_helion_candidate_is_the_universal_form_with_its_config(helion_exported):
    out, good = helion_exported
    pkg = next(p for p in (out / "build" / "torch-universal").iterdir() if p.is_dir())
    entries = [e for e in json.loads((pkg / "kernels.json").read_text())["kernels"] if e["device_type"] == "cuda"]
    assert len(entries) == 3 and {(e["backend"], e["module"]) for e in entries} == {("helion", "helion")}
    for e in entries:
        source = (pkg / e["file"]).read_text()
        assert source == good[e["key"]] and check_python(source, backend="helion") == []
        assert "config=helion.Config(" in source
    assert "| helion |" in (out / "README.md").read_text()


_RUN = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from triton_interpret import _libdevice_for_the_interpreter
_libdevice_for_the_interpreter()
sys.path.insert(0, sys.argv[1])
import {pkg} as k
from helion.runtime.kernel import BoundKernel
def no_tuning(*args, **kwargs):
    raise AssertionError("Helion autotuned an exported kernel")
BoundKernel.autotune = no_tuning  # the one way in to Helion's autotuner (Kernel.autotune binds, then calls it)
torch.manual_seed(0)
for name, kernel in k._KERNELS.items():
    args = [torch.empty_strided(m.shape, m.stride, dtype=m.dtype).copy_(torch.randn(m.shape)) for m in kernel.inputs]
    outs = [m.empty(torch.device("cpu")) for m in kernel.outputs]  # the Helion form, interpreted on the CPU
    assert kernel.forms["cuda"].backend == "helion" and kernel.forms["cuda"].launch(args, outs) == 0
    torch.testing.assert_close(outs, list(kernel.reference(*args)), rtol=1e-4, atol=1e-4)
print("ok", len(k._KERNELS))
"""


def test_the_exported_helion_form_runs_its_shipped_config_in_a_fresh_process(helion_exported):
    out, _ = helion_exported
    universal = out / "build" / "torch-universal"
    (pkg,) = [p.name for p in universal.iterdir() if p.is_dir()]
    root = os.path.dirname(HERE)  # forge's checkout leaves the path (the export stands alone); helion's folder may stay
    path = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p and os.path.abspath(p) != root)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    res = subprocess.run([sys.executable, "-c", _RUN.format(pkg=pkg), str(universal), HERE], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "ok 3"
