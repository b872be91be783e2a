"""forge export RUN --format hf-kernels DIR: a run's kernels as a Hugging Face kernel repository, loaded with the
real `kernels` package in a fresh process, swapped into the example model with `kernelize`, and its own tests run.

The run is made of real parts without a search (which picks its variant by timing, so its artifact may hold no
kernel): recipe kernels built by the real compiler for the example's tasks, saved as an artifact by
forge.runtime.artifact, recorded in a real SQLite store with the model file it came from.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES, ROOT

from forge.capture.export import capture
from forge.capture.model_input import load_file
from forge.cli import main
from forge.evaluate.build import build
from forge.kernel import KernelArtifact, TaskSpec
from forge.policy.recipes import pointwise, rowreduce
from forge.runtime import artifact
from forge.runtime.variants import Variant
from forge.store import Store
from forge.tasks.cut import build_tasks

pytest.importorskip("kernels")
MODEL = EXAMPLES / "rmsnorm_swiglu.py"


def _kernels(model, inputs):
    """A built recipe kernel for every pointwise and row-reduction task of the model."""
    arts = []
    for t in build_tasks(capture(model, inputs).graph_module.graph):
        for rec, knobs in ((rowreduce, rowreduce.RowKnobs()), (pointwise, pointwise.Knobs())):
            try:
                c = rec.candidate(rec.lower(TaskSpec.of(t)), knobs)
            except pointwise.NotMine:
                continue
            b = build(c)
            assert b.ok, b.log
            arts.append(KernelArtifact(t.key, "cpu", b.path, c.entry, t.inputs, t.outputs, t.source, c.source))
            break
    return arts


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(db, run id): a run of the example whose artifact holds its recipe kernels."""
    tmp = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    loaded = load_file(MODEL, eval=True)
    kernels = _kernels(loaded.model, loaded.inputs)
    assert {k.key.split("-")[0] for k in kernels} >= {"mean", "silu", "add"}
    store = Store(tmp / "forge.db")
    rec = store.create_run(loaded.name, device="cpu", dtype="fp32", policy="recipes",
                           config={"load": {"file": str(MODEL), "zoo": None, "sizes": {}}, "mode": "eval"})
    folder = tmp / rec.id
    artifact.save(folder, kernels, {"run_id": rec.id, "model": loaded.name, "device": "cpu", "dtype": "fp32",
                                    "device_model": artifact.device_model("cpu"), "layout": "", "mode": "eval"})
    store.update_run(rec.id, state="done", config={**rec.config, "artifact": str(folder)})
    return tmp / "forge.db", rec.id


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    db, run_id = run
    out = tmp_path_factory.mktemp("export") / "repo"
    assert main(["export", run_id, str(out), "--format", "hf-kernels", "--db", str(db)]) == 0
    return out


def test_the_repository_has_the_kernel_builder_layout(exported):
    (pkg,) = (exported / "torch-ext").iterdir()
    assert {"__init__.py", "_runtime.py", "layers.py", "kernels.json"} <= {p.name for p in pkg.iterdir()}
    assert sorted(p.suffix for p in (pkg / "kernels").iterdir()) == [".cpp"] * 3
    universal, arch = sorted((exported / "build").iterdir(), key=lambda p: p.name == "torch-universal", reverse=True)
    assert arch.name.startswith("torch") and arch.name.endswith("-cpu-x86_64-linux")
    assert universal.name == "torch-universal"
    for variant, backend in ((arch, "cpu"), (universal, "universal")):
        meta = json.loads((variant / "metadata.json").read_text())
        assert meta["backend"] == {"type": backend} and meta["name"] == pkg.name.replace("_", "-")
        assert len(meta["digest"]["files"]) == len([f for f in variant.rglob("*") if f.is_file()]) - 1
        assert len(list((variant / pkg.name / "kernels").glob("*.so"))) == 3
    toml = (exported / "build.toml").read_text()
    assert "[general]" in toml and 'backends = ["cpu"]' in toml and toml.count("[kernel.") == 3
    card = (exported / "README.md").read_text()
    assert "| `RMSNorm` |" in card and artifact.device_model("cpu") in card


_FRESH = """
import sys, torch
from pathlib import Path
from kernels import LocalLayerRepository, Mode, get_local_kernel, kernelize, replace_kernel_forward_from_hub
from kernels import use_kernel_mapping
sys.path.insert(0, sys.argv[2])
from forge.capture.model_input import load_file

repo = Path(sys.argv[1])
k = get_local_kernel(repo)
assert k.LAYERS == ["RMSNorm"], k.LAYERS
torch.manual_seed(0)
loaded = load_file(sys.argv[3], eval=True)
model, (x,) = loaded.model, loaded.inputs
with torch.no_grad():
    want = model(x)
cls = type(model.norm)
replace_kernel_forward_from_hub(cls, "RMSNorm")
with use_kernel_mapping({"RMSNorm": {"cpu": LocalLayerRepository(repo, layer_name="RMSNorm")}}):
    model = kernelize(model, mode=Mode.INFERENCE, device="cpu")
assert "forward" in vars(model.norm), "kernelize did not swap the RMSNorm"
calls = []
op = k.mean_edb7a1b21195.op
k.mean_edb7a1b21195.op = lambda *a: calls.append(1) or op(*a)
with torch.no_grad():
    got = model(x)
    compiled = torch.compile(model, fullgraph=True)(x)
torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
torch.testing.assert_close(compiled, want, rtol=1e-4, atol=1e-4)
assert calls, "the kernel did not run"
with torch.no_grad():  # a shape the kernel was not verified for: the module's own forward
    y = torch.randn(2, 8, 512)
    torch.testing.assert_close(model.norm(y), cls.forward(model.norm, y))
(out,) = k.silu_ac684d970e79(torch.randn(1024, 1376), torch.randn(1024, 1376))
print("ok", len(calls))
"""


def test_a_fresh_process_loads_it_with_kernels_and_kernelize_swaps_the_rmsnorm(exported):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the export needs torch and kernels only
    res = subprocess.run([sys.executable, "-c", _FRESH, str(exported), str(ROOT), str(MODEL)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("ok")


def test_the_exports_own_tests_pass(exported):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=exported,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "3 passed" in res.stdout


def test_a_changed_library_is_refused_by_the_kernels_package(exported, tmp_path):
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(exported, copy)
    libs = list((copy / "build").glob("*/*/kernels/mean_*.so"))
    assert len(libs) == 2  # the arch variant's and the universal one's
    for lib in libs:
        lib.write_bytes(lib.read_bytes() + b"\0")
    res = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from kernels import "
                          "get_local_kernel; get_local_kernel(Path(sys.argv[1]))", str(copy)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "digest" in res.stderr


def test_bad_input_is_one_line_and_exit_2(run, exported, tmp_path, capsys):
    db, run_id = run
    assert main(["export", run_id, str(exported), "--db", str(db)]) == 2  # not empty
    assert main(["export", "nope", str(tmp_path / "x"), "--db", str(db)]) == 2
    for bad in ("/tmp/elsewhere", "../up", 'say"hi', "Not_A_Name"):  # a name becomes paths, TOML and a package
        assert main(["export", run_id, str(tmp_path / "y"), "--db", str(db), "--name", bad]) == 2
    assert not (tmp_path / "y").exists() and not Path("/tmp/elsewhere").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(e.startswith("forge: error:") for e in err)
    assert "Invalid --name" in err[-1]


def test_a_run_whose_fastest_variant_uses_no_kernel_says_which_variant_it_was(tmp_path, capsys):
    """The artifact of a run that kept Inductor on the model as it is (its found kernels lost end to end) has no
    kernels: the export says which variant won rather than that nothing was faster."""
    loaded = load_file(MODEL, eval=True)
    store = Store(tmp_path / "forge.db")
    rec = store.create_run(loaded.name, device="cpu", dtype="fp32", policy="recipes",
                           config={"load": {"file": str(MODEL), "zoo": None, "sizes": {}}, "mode": "eval"})
    folder = tmp_path / rec.id
    artifact.save(folder, [], {"run_id": rec.id, "model": loaded.name, "device": "cpu", "dtype": "fp32",
                               "device_model": artifact.device_model("cpu"), "layout": "", "mode": "eval",
                               "variant": Variant(False, (), "inductor").to_json()})
    store.update_run(rec.id, state="done", config={**rec.config, "artifact": str(folder)})
    assert main(["export", rec.id, str(tmp_path / "repo"), "--db", str(tmp_path / "forge.db")]) == 2
    assert capsys.readouterr().err.strip() == (f"forge: error: run {rec.id}'s artifact has no kernels to export (the "
                                               "fastest of its variants end to end was 'model, inductor', which "
                                               "uses none)")
    assert not (tmp_path / "repo").exists()


@pytest.fixture(scope="module")
def triton_exported(tmp_path_factory):
    """An export of a run whose tasks have Triton candidates beside their CPU winners: one per task that matched
    the reference under Triton's interpreter (recorded ok, as a GPU run's verification would), and a wrong one
    (recorded wrong_result, with a higher reward) that the export must not take."""
    from test_recipe_triton import _inputs, _outputs, interpret

    from forge.policy.recipes import triton_kernels
    from forge.policy.recipes.triton_common import TritonKnobs, TritonRowKnobs
    from forge.tasks.cut import compile_source
    from forge.tolerance import rel_error, tolerance

    tmp = tmp_path_factory.mktemp("triton_run")
    torch.manual_seed(0)
    loaded = load_file(MODEL, eval=True)
    kernels = _kernels(loaded.model, loaded.inputs)
    store = Store(tmp / "forge.db")
    rec = store.create_run(loaded.name, device="cpu", dtype="fp32", policy="recipes",
                           config={"load": {"file": str(MODEL), "zoo": None, "sizes": {}}, "mode": "eval"})
    good = {}
    for k in kernels:
        spec = TaskSpec(k.key, k.source, k.inputs, k.outputs)
        knobs = TritonKnobs() if k.key.startswith(("silu", "add", "mul")) else TritonRowKnobs()
        source = triton_kernels.candidate(spec, knobs).source
        inputs = _inputs(spec, 0)
        ((rc, outs),) = interpret(tmp, [(source, inputs, _outputs(spec))])
        refs = compile_source(spec.source)(*[x.double() for x in inputs])
        assert rc == 0 and all(rel_error(o, r) <= tolerance(m.dtype).kernel
                               for o, r, m in zip(outs, refs, spec.outputs, strict=True)), k.key
        task = store.add_task(rec.id, k.key, source=k.source)
        store.add_candidate(task.id, backend="cpu", source=k.kernel_source, status="ok", reward=2.0)
        store.add_candidate(task.id, backend="triton", source=source, entry="launch", status="ok", reward=1.0)
        store.add_candidate(task.id, backend="triton", source=source.replace("mask=mask)", "mask=mask & (i < 7))"),
                            entry="launch", status="wrong_result", reward=5.0)
        good[k.key] = source
    folder = tmp / rec.id
    artifact.save(folder, kernels, {"run_id": rec.id, "model": loaded.name, "device": "cpu", "dtype": "fp32",
                                    "device_model": artifact.device_model("cpu"), "layout": "", "mode": "eval"})
    store.update_run(rec.id, state="done", config={**rec.config, "artifact": str(folder)})
    out = tmp / "repo"
    assert main(["export", rec.id, str(out), "--format", "hf-kernels", "--db", str(tmp / "forge.db")]) == 0
    return out, good


def test_each_native_kernel_gets_its_verified_triton_form_in_the_universal_variant(triton_exported):
    from forge.evaluate.checks import check_python

    out, good = triton_exported
    universal, arch = sorted((out / "build").iterdir(), key=lambda p: p.name == "torch-universal", reverse=True)
    (pkg,) = [p for p in universal.iterdir() if p.is_dir()]
    entries = json.loads((pkg / "kernels.json").read_text())["kernels"]
    assert sorted((e["backend"], e["device_type"]) for e in entries) == [("cpu", "cpu")] * 3 + [("triton", "cuda")] * 3
    for e in entries:
        if e["backend"] == "triton":
            source = (pkg / e["file"]).read_text()
            assert source == good[e["key"]] and check_python(source) == []  # the verified one, not the wrong one
    arch_entries = json.loads((arch / pkg.name / "kernels.json").read_text())["kernels"]
    assert {e["backend"] for e in arch_entries} == {"cpu"}  # Triton has no architecture
    meta = json.loads((universal / "metadata.json").read_text())
    assert len(meta["digest"]["files"]) == len([f for f in universal.rglob("*") if f.is_file()]) - 1
    assert (out / "build.toml").read_text().count("[kernel.") == 6
    assert "| triton |" in (out / "README.md").read_text()


_FORMS = """
import os, sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import {pkg} as k
torch.manual_seed(0)
for name, kernel in k._KERNELS.items():
    assert set(kernel.forms) == {{"cpu", "cuda"}}, kernel.forms
    args = [torch.empty_strided(m.shape, m.stride, dtype=m.dtype).copy_(torch.randn(m.shape)) for m in kernel.inputs]
    assert kernel.applies(tuple(args))  # CPU tensors: the CPU form
    want = kernel.reference(*args)
    torch.testing.assert_close(list(kernel(*args)), list(want), rtol=1e-4, atol=1e-4)
    outs = [m.empty(torch.device("cpu")) for m in kernel.outputs]  # the Triton form, interpreted on the CPU
    assert kernel.forms["cuda"].launch(args, outs) == 0
    torch.testing.assert_close(outs, list(want), rtol=1e-4, atol=1e-4)
print("ok", len(k._KERNELS))
"""


def test_the_universal_package_runs_both_forms_in_a_fresh_process(triton_exported):
    out, _ = triton_exported
    universal = out / "build" / "torch-universal"
    (pkg,) = [p.name for p in universal.iterdir() if p.is_dir()]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _FORMS.format(pkg=pkg), str(universal)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "ok 3"


def test_module_settings_that_are_no_python_literal_render_as_code():
    from forge.export.align import LayerSpec
    from forge.export.render import layers_py

    spec = LayerSpec("clamp-0123", "Clamp", "m.Clamp", 'blocks.0"""; import os; """', "x", ("",), (4,), 0, (4,),
                     (("hi", float("inf")), ("lo", float("-inf")), ("training", False), ("w", (1.0, float("nan")))))
    text = layers_py({"Clamp": (spec, "clamp")})
    ns: dict = {}
    exec(compile(text.replace("from . import _KERNELS", "_KERNELS = {}"), "layers.py", "exec"), ns)  # noqa: S102
    assert ns["_Clamp_CONFIG"]["hi"] == float("inf") and ns["_Clamp_CONFIG"]["training"] is False
    assert "import os" not in ns["Clamp"].__doc__.split("(")[0] and '"""; import os' not in text


@pytest.mark.parametrize("variant, says", [
    (Variant(True, (), "graph"), None),
    (Variant(True, (), "graph", blocks=True), None),
    (Variant(True, ("gelu-epilogue",), "cuda-graph"),
     "forge's kernels with the graph rewrite `gelu-epilogue`, and with the runtime `cuda-graph`. This repository "
     "carries the kernels alone"),
    (Variant(True, ("merge-linears", "fa4-attention"), "inductor-cuda-graph"),
     "forge's kernels with the graph rewrites `merge-linears`, `fa4-attention`, and with the runtime "
     "`inductor-cuda-graph`."),
    (Variant(True, (), "inductor", without=("mean-1",)),
     "forge's kernels with the runtime `inductor`. This repository carries the kernels alone; the rest of that "
     "speedup is `forge.load`'s. forge's result leaves out `mean-1`, exported all the same"),
])
def test_the_card_says_what_of_the_speedup_the_kernels_carry(variant, says):
    from forge.export.render import card

    info = {"run_id": "r1", "model": "m", "eager_ms": 2.0, "forge_ms": 1.0, "device": "cuda",
            "variant": variant.to_json()}
    line = next(ln for ln in card("forge-r1", info, [], {}, ["torch-universal"]).splitlines()
                if "The model end to end" in ln)
    assert "2.000 ms eager, 1.000 ms with forge (2.00x)" in line
    if says is None:  # the kernels run as the patched graph: the speedup is theirs
        assert "forge.load" not in line and line.endswith("(2.00x).")
    else:
        assert f"(2.00x), as `{variant.name}`: {says}" in line


def test_the_card_reads_the_variant_as_forge_load_rebuilds_it():
    from forge.runtime.artifact import variant_of

    v = Variant(True, ("gelu-epilogue",), "inductor-cuda-graph")
    assert variant_of({"variant": v.to_json()}) == v.to_json()
    assert variant_of({"cuda_graph": True})["runtime"] == "cuda-graph"  # an artifact from before variants
    assert variant_of({})["runtime"] == "graph" and variant_of({"variant": {"runtime": "warp"}}) == {}


def test_a_cpu_kernel_runs_only_where_the_cpu_has_the_flags_it_was_built_with(exported, tmp_path):
    from forge.export.package._runtime import _PLATFORM, Form, cpu_flags

    entries = [e for f in exported.rglob("kernels.json") for e in json.loads(f.read_text())["kernels"]
               if e["native"] and e["device_type"] == "cpu"]
    assert entries and all(set(e["cpu_flags"]) == set(cpu_flags()) and e["cpu_flags"] for e in entries)
    other = {**entries[0], "platform": _PLATFORM, "cpu_flags": [*entries[0]["cpu_flags"], "avx10_9_future"]}
    assert not Form(tmp_path, "ns", other).available  # another CPU's -march=native: the reference runs


SCAN_MODEL = '''
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as lib


class Model(torch.nn.Module):
    def forward(self, q, k, v, g, beta):
        out = lib.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]
        return torch.nn.functional.silu(out)


def get_inputs():
    q, k, v = (torch.randn(1, 80, 2, 16) for _ in range(3))
    return [q, k, v, -torch.rand(1, 80, 2), torch.rand(1, 80, 2)]


def get_init_inputs():
    return []
'''


def test_a_scan_kernel_is_left_out_of_the_export_and_said_so(tmp_path, capsys):
    """A scan's reference calls the model's library through forge's op (forge.capture.scans): the package, which
    needs torch alone, gets the run's other kernels, and the command names the scan's on stderr."""
    pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from forge.policy.recipes import scan

    model_file = tmp_path / "scan_model.py"
    model_file.write_text(SCAN_MODEL)
    loaded = load_file(model_file, eval=True)
    arts = _kernels(loaded.model, loaded.inputs)
    (task,) = [t for t in build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph) if t.family == "scan"]
    c = scan.candidate(scan.lower(TaskSpec.of(task)), scan.ScanKnobs())
    b = build(c)
    assert b.ok and arts, b.log
    arts.append(KernelArtifact(task.key, "cpu", b.path, c.entry, task.inputs, task.outputs, task.source, c.source))
    store = Store(tmp_path / "forge.db")
    rec = store.create_run(loaded.name, device="cpu", dtype="fp32", policy="recipes",
                           config={"load": {"file": str(model_file), "zoo": None, "sizes": {}}, "mode": "eval"})
    artifact.save(tmp_path / rec.id, arts, {"run_id": rec.id, "model": loaded.name, "device": "cpu", "dtype": "fp32",
                                           "device_model": artifact.device_model("cpu"), "layout": "", "mode": "eval"})
    store.update_run(rec.id, state="done", config={**rec.config, "artifact": str(tmp_path / rec.id)})
    out = tmp_path / "repo"
    capsys.readouterr()
    assert main(["export", rec.id, str(out), "--format", "hf-kernels", "--db", str(tmp_path / "forge.db")]) == 0
    err = capsys.readouterr().err
    assert f"left out the scan kernels {task.key}" in err
    manifest = json.loads(next(out.glob("torch-ext/*/kernels.json")).read_text())
    text = json.dumps(manifest)
    assert task.key not in text and "silu" in text
    assert not any("forge_scan" in p.read_text() for p in out.rglob("references/*.py"))
