"""Guarded dispatch on the CPU: real generated kernels patched into the captured graph."""

from dataclasses import replace

import pytest
import torch
from conftest import EXAMPLES

from forge.capture.export import capture, node_meta
from forge.capture.model_input import load_file
from forge.evaluate.build import build
from forge.kernel import KernelArtifact, TaskSpec
from forge.policy.recipes.emit import NotMine
from forge.policy.recipes.pointwise import Knobs, candidate, lower
from forge.runtime.dispatch import Counters, GuardedKernel, apply
from forge.runtime.endtoend import fresh_inputs, outputs_match
from forge.tasks.cut import build_tasks, cut, region_source


@pytest.fixture(scope="module")
def swiglu():
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py")
    arts = []
    for t in build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph):
        try:
            low = lower(TaskSpec.of(t))
        except NotMine:
            continue
        c = candidate(low, Knobs())
        b = build(c)
        assert b.ok, b.log
        arts.append(KernelArtifact(t.key, "cpu", b.path, c.entry, t.inputs, t.outputs, t.source))
    assert len(arts) == 2  # the SwiGLU product and the residual add
    return loaded, arts


def test_patched_model_matches_eager_and_counts_hits(swiglu):
    loaded, arts = swiglu
    opt = apply(loaded.model, loaded.inputs, arts)
    for _ in range(3):
        x = torch.randn(4, 256, 512)
        with torch.no_grad():
            expected = loaded.model(x)
        torch.testing.assert_close(opt(x), expected)
    counters = opt.counters()
    assert {k for k in counters} == {a.key for a in arts}
    assert all(c.hits == 3 and not c.fallbacks for c in counters.values())
    assert "forge_kernel_0" in opt.gm.code
    x = torch.randn(2, 100, 512)  # another shape: the captured graph does not apply, the model runs eager
    with torch.no_grad():
        torch.testing.assert_close(opt(x), loaded.model(x))
    assert opt.model_fallbacks == 1 and all(c.hits == 3 for c in opt.counters().values())


def test_guards_fall_back_to_eager_and_are_counted(swiglu):
    _, arts = swiglu
    art = next(a for a in arts if a.key.startswith("silu"))
    k = GuardedKernel(art)
    g, u = (torch.randn(m.shape) for m in art.inputs)
    torch.testing.assert_close(k(g, u)[0], k.reference(g, u)[0])
    k(g.double(), u.double())  # dtype
    other = g.t().contiguous().t()  # the same values in another layout: run on a copy in the verified one
    torch.testing.assert_close(k(other, u)[0], k.reference(g, u)[0])
    k(g.requires_grad_(), u)  # autograd
    assert k.counters.hits == 2 and k.counters.relaid == 1
    assert dict(k.counters.fallbacks) == {"dtype": 1, "autograd": 1}
    with pytest.raises(RuntimeError, match="did not run: dtype"):
        GuardedKernel(art, strict=True)(g.detach().double(), u.double())


def test_a_failing_kernel_falls_back_unless_strict(swiglu, tmp_path):
    _, arts = swiglu
    art = replace(next(a for a in arts if a.key.startswith("silu")), path=str(tmp_path / "missing.so"))
    g, u = (torch.randn(m.shape) for m in art.inputs)
    k = GuardedKernel(art)
    torch.testing.assert_close(k(g, u)[0], torch.sigmoid(g.view(4, 256, 1376)).mul(g.view(4, 256, 1376))
                               .mul(u.view(4, 256, 1376)).view(1024, 1376))
    assert k.counters.fallbacks["error"] == 1 and k.counters.hits == 0
    with pytest.raises(OSError):
        GuardedKernel(art, strict=True)(g, u)


class NormThenMean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (64,)).exp().mean(-1)  # two reductions: two regions, chained


def test_chained_regions_are_both_patched():
    from forge.policy.recipes.policy import RecipePolicy

    model, x = NormThenMean(), torch.randn(32, 64)
    pol, arts = RecipePolicy(), []
    for t in build_tasks(capture(model, [x]).graph_module.graph):
        spec = TaskSpec.of(t)
        c = pol.render(spec, pol.propose(spec, None)[0])
        arts.append(KernelArtifact(t.key, "cpu", build(c).path, c.entry, t.inputs, t.outputs, t.source))
    assert len(arts) == 2  # the second region reads the first one's output
    opt = apply(model, [x], arts)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x))
    assert [c.hits for c in opt.counters().values()] == [1, 1]


def test_kernels_from_another_device_model_run_only_after_verification_here(swiglu, tmp_path, caplog):
    from forge.runtime import artifact

    loaded, arts = swiglu
    x = torch.randn(4, 256, 512)
    with torch.no_grad():
        expected = loaded.model(x)
    same = artifact.save(tmp_path / "same", arts, {"device_model": artifact.device_model("cpu")})
    opt = artifact.load(same, loaded.model, loaded.inputs)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), expected)
    assert {k for k, c in opt.counters().items() if c.hits} == {a.key for a in arts} | {"model"}

    other = artifact.save(tmp_path / "other", arts, {"device_model": "x86_64 Some Other CPU [avx2]"})
    opt = artifact.load(other, loaded.model, loaded.inputs)  # not verified here: not used
    with torch.no_grad():
        torch.testing.assert_close(opt(x), expected)
    assert opt.counters() == {"model": Counters(1)} and "tuned on x86_64 Some Other CPU" in caplog.text
    with pytest.raises(RuntimeError, match="verify=True"):
        artifact.load(other, loaded.model, loaded.inputs, strict=True)

    caplog.clear()
    with caplog.at_level("WARNING"):
        opt = artifact.load(other, loaded.model, loaded.inputs, verify=True)  # a real worker verifies and times
    with torch.no_grad():
        torch.testing.assert_close(opt(x), expected)
    counters = opt.counters()
    assert counters.pop("model") == Counters(1)
    dropped = caplog.text.count("not used on this device")
    assert set(counters) <= {a.key for a in arts} and len(counters) + dropped == len(arts)
    assert all(c.hits == 1 for c in counters.values())


def test_torch_compile_keeps_the_kernels_as_opaque_ops(swiglu):
    """Under torch.compile each kernel is the op forge::kernel: no graph break, Inductor compiles the rest."""
    import torch._dynamo

    loaded, arts = swiglu
    opt = apply(loaded.model, loaded.inputs, arts)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(opt)(*loaded.inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert str(explained.graphs[0].code).count("forge.kernel") == len(arts)
    before = {k: c.hits for k, c in opt.counters().items()}  # explain ran the model once
    compiled = torch.compile(opt)
    for _ in range(2):
        x = torch.randn(4, 256, 512)
        with torch.no_grad():
            expected = loaded.model(x)
        torch.testing.assert_close(compiled(x), expected)
    counters = opt.counters()
    assert all(c.hits == before[k] + 2 and not c.fallbacks for k, c in counters.items())  # they ran, compiled


def test_views_still_apply_where_kernels_changed_a_layout():
    """SD3.5's MMDiT, one block: kernels write row-major where eager had permuted layouts, and attention
    then lays out its output differently too; a later `view` that relied on eager's strides raised here
    before views became reshapes in the patched graph."""
    from forge.capture.model_input import load_zoo
    from forge.policy.recipes.policy import RecipePolicy

    loaded = load_zoo("sd35-mmdit", "cpu", "fp32", layers=1, resolution=128, batch=1)
    pol, arts = RecipePolicy(), []
    graph = capture(loaded.model, loaded.inputs).graph_module.graph
    nodes = {n.name: n for n in graph.nodes}
    eager_layouts = [node_meta(nodes[o]) for r in cut(graph) for o in region_source(r).output_nodes]
    assert any(not m.contiguous and not m.channels_last for m in eager_layouts)  # eager's were permuted there
    for t in build_tasks(graph):
        spec = TaskSpec.of(t)
        ideas = pol.propose(spec, None) if pol.refusal(spec) is None else []
        if ideas:
            c = pol.render(spec, ideas[0])
            arts.append(KernelArtifact(t.key, "cpu", build(c).path, c.entry, t.inputs, t.outputs, t.source))
    assert all(m.contiguous for a in arts for m in a.outputs)  # which kernels write row-major
    opt = apply(loaded.model, loaded.inputs, arts)
    fresh = fresh_inputs(loaded.inputs)
    match, err = outputs_match(loaded.model, opt, fresh)
    assert match, err
    assert all(c.hits >= 1 and not c.fallbacks for c in opt.counters().values())


def test_a_tampered_artifact_is_refused_and_manifest_text_never_runs(swiglu, tmp_path):
    import json

    from forge.runtime import artifact

    loaded, arts = swiglu
    saved = artifact.save(tmp_path / "a", arts, {"device_model": artifact.device_model("cpu")})
    data = json.loads(saved.read_text())
    assert all(len(e["sha256"]) == 64 and (saved.parent / e["kernel_source"]).is_file() for e in data["kernels"])

    def refused(edit, match: str) -> None:
        d = json.loads(json.dumps(data))
        edit(d)
        saved.write_text(json.dumps(d))
        with pytest.raises(artifact.ArtifactError, match=match):
            artifact.load(saved, loaded.model, loaded.inputs)

    refused(lambda d: d["kernels"][0].update(file="../../../../etc/passwd"), "not a file inside the artifact")
    refused(lambda d: d["kernels"][0].pop("sha256"), "has no file with a sha256")
    refused(lambda d: d["kernels"][0].update(kernel_source_sha256="0" * 64), "was changed")
    saved.write_text(json.dumps(data))
    lib = saved.parent / data["kernels"][0]["file"]
    good = lib.read_bytes()
    lib.write_bytes(good + b"\0")  # a swapped library
    with pytest.raises(artifact.ArtifactError, match="was changed since it was saved"):
        artifact.load(saved, loaded.model, loaded.inputs)
    lib.write_bytes(good)

    # The manifest's reference text is not what runs as the fallback: a planted one is never executed.
    mark = tmp_path / "ran"
    for e in data["kernels"]:
        e["source"] = f"open({str(mark)!r}, 'w').write('x')\n" + e["source"]
    saved.write_text(json.dumps(data))
    x = torch.randn(4, 256, 512)
    opt = artifact.load(saved, loaded.model, loaded.inputs)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), loaded.model(x))
        for k in opt.patched.kernels.values():  # another dtype: each kernel falls back to its reference
            k(*[torch.randn(m.shape, dtype=torch.float64) for m in k.art.inputs])
    assert all(c.fallbacks["dtype"] == 1 for key, c in opt.counters().items() if key != "model")
    artifact.load(saved, loaded.model, loaded.inputs, verify=True)
    assert not mark.exists()


def test_an_artifact_path_that_escapes_or_a_changed_source_is_refused(swiglu, tmp_path):
    """Every way out of the folder (an absolute path, `..`, a symlink inside pointing outside) and an edited
    kernel source are refused when the artifact is read; the honest artifact reads."""
    import json

    from forge.runtime import artifact

    _, arts = swiglu
    saved = artifact.save(tmp_path / "a", arts, {"device_model": artifact.device_model("cpu")})
    data = json.loads(saved.read_text())
    honest = artifact.read(saved)
    assert [k.key for k in honest] == [a.key for a in arts]
    from pathlib import Path

    # what runs is a private copy of the bytes checked, not the folder's file (which may change after)
    assert all(not Path(k.path).is_relative_to(saved.parent) and Path(k.path).read_bytes() ==
               Path(a.path).read_bytes() for k, a in zip(honest, arts, strict=True))
    entry = data["kernels"][0]
    lib, src = saved.parent / entry["file"], saved.parent / entry["kernel_source"]
    outside = tmp_path / "outside.so"
    outside.write_bytes(lib.read_bytes())  # the same bytes: only where it lies is wrong
    (saved.parent / "kernels" / "link.so").symlink_to(outside)

    def refused(name: str, value: str, match: str) -> None:
        d = json.loads(json.dumps(data))
        d["kernels"][0][name] = value
        saved.write_text(json.dumps(d))
        with pytest.raises(artifact.ArtifactError, match=match) as e:
            artifact.read(saved)
        assert "\n" not in str(e.value)  # one line

    for name in ("file", "kernel_source"):
        refused(name, str(outside), "not a file inside the artifact folder")
        refused(name, "../outside.so", "not a file inside the artifact folder")
        refused(name, "kernels/link.so", "not a file inside the artifact folder")
    saved.write_text(json.dumps(data))
    src.write_text(src.read_text() + "\n// edited\n")
    with pytest.raises(artifact.ArtifactError, match="was changed since it was saved"):
        artifact.read(saved)


def test_a_variant_without_some_kernels_runs_the_rest(swiglu):
    """What choose tries when Inductor gave some kernels another layout (they fell back): the same variant
    without them, named so, rebuilt so by forge.load (the manifest keeps the keys left out)."""
    from forge.runtime.variants import Variant, build

    loaded, arts = swiglu
    dropped = arts[0].key
    v = Variant(True, (), "graph", without=(dropped,))
    assert v.name == "kernels (less 1), graph" and Variant.parse(v.to_json()) == v
    assert Variant.parse({"kernels": True, "rewrites": [], "runtime": "graph"}).without == ()  # older manifests
    fn, opt, _ = build(loaded.model, loaded.inputs, arts, v, "cpu")
    x = torch.randn(4, 256, 512)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), loaded.model(x))
    assert set(opt.counters()) == {a.key for a in arts} - {dropped}


@pytest.mark.parametrize("make", [lambda x: (torch.nn.functional.silu(x) * 2,), lambda x: {"a": x * 2, "b": x.sum()},
                                  lambda x: x * 3], ids=["1-tuple", "dict", "tensor"])
def test_the_optimized_model_returns_what_the_model_returns(make):
    """A 1-tuple stays a 1-tuple and a dict a dict (the 1-tuple came back as its tensor: Dynamo's graphs return
    1-tuples)."""
    class M(torch.nn.Module):
        def forward(self, x):
            return make(x)

    x = torch.randn(3, 5)
    got, want = apply(M(), [x], [])(x), M()(x)
    assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(want)
    torch.testing.assert_close(got, want)


class Relayout(torch.nn.Module):
    """A region whose output eager leaves a transposed view (its kernel writes it row-major), read by a second
    region as that view, with a matmul between that keeps the two regions apart."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(x).transpose(0, 1)
        return torch.relu(a) * 2 + a @ w


def test_a_kernel_given_another_layout_than_verified_runs_on_copies_in_that_layout():
    """The second kernel gets its input row-major from the first kernel, not transposed as eager has it: it runs
    on a copy in the verified layout (counted as `relaid`), not on the wrong strides and not eager."""
    from forge.policy.recipes.policy import RecipePolicy

    model, x, w = Relayout(), torch.randn(37, 53), torch.randn(37, 37)
    pol, arts = RecipePolicy("cpu"), []
    for t in build_tasks(capture(model, [x, w]).graph_module.graph):
        spec = TaskSpec.of(t)
        if proposals := pol.propose(spec, None):
            c = pol.render(spec, proposals[0])
            b = build(c)
            assert b.ok, b.log
            arts.append(KernelArtifact(t.key, c.backend, b.path, c.entry, t.inputs, t.outputs, t.source))
    opt = apply(model, [x, w], arts)
    for _ in range(2):
        y = torch.randn(37, 53)
        with torch.no_grad():
            torch.testing.assert_close(opt(y, w), model(y, w))
    counters = opt.counters()
    assert len(counters) == 2 and all(c.hits == 2 and not c.fallbacks for c in counters.values()), counters
    assert sorted(c.relaid for c in counters.values()) == [0, 2], counters
