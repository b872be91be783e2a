"""Capturing in channels-last (forge.capture.layout): the graph, its tasks, kernels that write channels-last,
the run."""

import json
import operator

import pytest
import torch
from conftest import EXAMPLES, MODELS, lowerable

import forge
from forge.capture import layout
from forge.capture.export import TensorMeta, capture
from forge.capture.model_input import load_file
from forge.cli import main
from forge.evaluate.evaluator import Evaluator
from forge.kernel import TaskSpec
from forge.policy.recipes import pointwise, rowreduce
from forge.runtime.artifact import ArtifactError
from forge.tasks.cut import build_tasks

aten = torch.ops.aten


@pytest.fixture(scope="module")
def block():
    loaded = load_file(MODELS / "conv_groupnorm.py")
    return loaded, layout.channels_last(capture(loaded.model, loaded.inputs), loaded.inputs)


def test_the_channels_last_graph_computes_what_eager_does_and_its_tasks_are_nhwc(block):
    loaded, cl = block
    assert cl.layout == "channels-last"
    x = torch.randn(2, 32, 17, 19)
    with torch.no_grad():
        (got,) = cl.graph_module(*cl.flat_args([x]))
        want = loaded.model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert got.is_contiguous()  # the graph's output is row-major again, as eager's
    nodes = list(cl.graph_module.graph.nodes)
    convs = [n for n in nodes if n.target is aten.convolution.default]
    assert convs and all(n.meta["val"].is_contiguous(memory_format=torch.channels_last) for n in convs)
    # both GroupNorms read a row-major copy (as on CUDA, where native_group_norm takes nothing else); the one
    # whose input was channels-last has its output copied back to channels-last, the transposed one's not
    norms = [n for n in nodes if n.target is aten.native_group_norm.default]
    copied = [n for n in norms if n.args[0].target is aten.clone.default and n.args[0].meta["val"].is_contiguous()]
    assert len(norms) == 2 and len(copied) == 2
    backs = [u for n in norms for g in n.users for u in g.users if u.target is aten.clone.default]
    assert len(backs) == 1 and backs[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
    assert not backs[0].meta["val"].is_contiguous() and backs[0].args[0].meta["val"].is_contiguous()
    tasks = {t.key.split("-")[0]: t for t in build_tasks(cl.graph_module.graph)}
    first_norm = next(t for t in build_tasks(cl.graph_module.graph) if t.key.startswith("native_group_norm"))
    assert first_norm.inputs[0].channels_last and first_norm.outputs[0].channels_last  # written NHWC, not copied
    assert tasks["add"].inputs[0].channels_last and tasks["add"].outputs[0].contiguous
    # the same model captured as it is has none of this
    plain = build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph)
    assert not any(m.channels_last for t in plain for m in (*t.inputs, *t.outputs))


def test_written_layouts_are_row_major_except_channels_last():
    cl = TensorMeta((2, 8, 5, 7), "float32", (280, 1, 56, 8))
    assert cl.channels_last and cl.written() == cl
    permuted = TensorMeta((2, 8, 5, 7), "float32", (280, 1, 8, 40))  # NWHC: dense, not channels-last
    assert not permuted.channels_last and permuted.written().contiguous
    one_channel = TensorMeta((2, 1, 5, 7), "float32", (35, 1, 7, 1))  # channels-last and row-major at once
    assert not one_channel.channels_last and one_channel.written() == one_channel


def test_recipe_kernels_for_channels_last_tasks_verify(block):
    _, cl = block
    tasks = build_tasks(cl.graph_module.graph)
    found = lowerable(tasks, pointwise.lower) + lowerable(tasks, rowreduce.lower)
    assert {t.key.split("-")[0] for t, _ in found} == {"native_group_norm", "add"}
    with Evaluator("cpu", timeout_s=60) as ev:
        for task, low in found:
            cand = (pointwise.candidate(low, pointwise.Knobs()) if isinstance(low, pointwise.Lowered)
                    else rowreduce.candidate(low, rowreduce.RowKnobs()))
            res = ev.evaluate(TaskSpec.of(task), cand)
            assert res.status.value == "ok", (task.key, res.message, res.build_log[-400:])
    add = next(low for t, low in found if t.key.startswith("add"))
    assert add.order == ()  # its output is the graph's row-major one: the loop runs in that order


def test_a_pointwise_task_with_a_channels_last_output_loops_in_memory_order():
    class Scale(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x * 2 + y)

    x = torch.randn(2, 6, 5, 3).contiguous(memory_format=torch.channels_last)
    y = torch.randn(6, 1, 1)
    (task,) = build_tasks(capture(Scale(), [x, y]).graph_module.graph)
    assert task.outputs[0].channels_last
    low = pointwise.lower(TaskSpec.of(task))
    assert low.order == (0, 2, 3, 1) and low.inner == 6 * 5 * 3 * 2  # one unit-stride block: all of it
    with Evaluator("cpu", timeout_s=60) as ev:
        res = ev.evaluate(TaskSpec.of(task), pointwise.candidate(low, pointwise.Knobs()))
    assert res.status.value == "ok", (res.message, res.build_log[-400:])


def test_no_convolution_no_layout_to_choose():
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py")
    cap = capture(loaded.model, loaded.inputs)
    assert layout.conv_weights(cap) == [] and layout.choose(cap, loaded.inputs, "cpu") == ""
    with pytest.raises(ValueError, match="Invalid layout 'nhwc'"):
        layout.apply(cap, "nhwc", loaded.inputs)


def test_optimize_in_channels_last_records_the_layout_and_load_rebuilds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.json"
    code = main(["optimize", str(MODELS / "conv_groupnorm.py"), "--layout", "channels-last", "--seconds", "40",
                 "--no-inductor", "--db", str(tmp_path / "f.db"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["outputs_match"] is True and report["layout"] == "channels-last"
    manifest = json.loads((tmp_path / report["artifact"] / "manifest.json").read_text())
    assert manifest["layout"] == "channels-last"
    kernels = [m for m in report["variants"] if m["variant"]["kernels"] and not m["variant"]["rewrites"]]
    assert kernels and all(m["match"] and not m["error"] for m in kernels)  # no kernel fell back on a layout
    loaded = load_file(MODELS / "conv_groupnorm.py")
    opt = forge.load(tmp_path / report["artifact"], loaded.model, loaded.inputs)
    x = torch.randn(2, 32, 17, 19)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), loaded.model(x), rtol=1e-4, atol=1e-5)
    if report["variant"] and report["variant"]["kernels"]:
        assert opt.counters() and all(c.hits == 1 and not c.fallbacks for c in opt.counters().values())
    manifest["layout"] = "nhwc"
    (tmp_path / report["artifact"] / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="layout 'nhwc'"):
        forge.load(tmp_path / report["artifact"], loaded.model, loaded.inputs)


def test_a_normalization_read_back_permuted_is_not_a_row_recipe():
    """The row statistics describe the loop's own row (group): an epilogue that reads the GroupNorm's result at
    another one (here transposed, H == C, so the shapes agree) would be normalized with the wrong statistics."""
    from forge.policy.recipes import cuda, cuda_nhwc
    from forge.policy.recipes.emit import NotMine

    class Permuted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.gn = torch.nn.Conv2d(8, 8, 1), torch.nn.GroupNorm(4, 8)

        def forward(self, x):
            h = torch.nn.functional.silu(self.gn(self.conv(x)))
            return self.conv(h.transpose(1, 2).contiguous(memory_format=torch.channels_last))

    x = torch.randn(1, 8, 8, 4).contiguous(memory_format=torch.channels_last)
    cap = layout.channels_last(capture(Permuted(), [x]), [x])
    (norm,) = [TaskSpec.of(t) for t in build_tasks(cap.graph_module.graph) if t.key.startswith("native_group_norm")]
    with pytest.raises(NotMine, match="another row"):
        rowreduce.lower(norm)
    low = rowreduce.RowLowered("native_group_norm", 4, 64, (), "", (), (), (), "", 1, 1, "0", "", 1e-5)
    with pytest.raises(NotMine, match="another channel"):
        cuda_nhwc.nhwc_norm_source(norm, cuda.CudaRowKnobs(), low)


def test_layouts_are_timed_with_groupnorms_stood_in_for_by_one_pass_in_their_layout(block):
    loaded, cl = block
    plain = capture(loaded.model, loaded.inputs)
    for cap, fmt in ((plain, torch.contiguous_format), (cl, torch.channels_last)):
        gm = layout.without_norms(cap.graph_module)
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        assert not any(n.target is aten.native_group_norm.default for n in nodes)
        clones = [n for n in nodes if n.target is aten.clone.default]
        first = clones[0]  # the first GroupNorm's stand-in: the convolution's output, read and written as is
        assert first.args[0].target is aten.convolution.default and first.kwargs["memory_format"] is fmt
        assert first.args[0].meta["val"].is_contiguous(memory_format=fmt)  # the copies around it are gone
        # the attention block's GroupNorm (a transposed input) and, channels-last, the graph's row-major output
        assert len(clones) == 2 + (fmt is torch.channels_last)
        (out,) = gm(*cap.flat_args([torch.randn(2, 32, 17, 19)]))
        assert out.shape == (2, 32, 17, 19)
    assert layout.choose(plain, loaded.inputs, "cpu") in layout.LAYOUTS


class _NormOut(torch.nn.Module):
    """A GroupNorm's output is the graph's output: made row-major again without a copy to channels-last first."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.norm(self.conv(x))


def test_a_groupnorm_output_that_is_the_graph_output_is_copied_once():
    m, x = _NormOut().eval(), torch.randn(2, 8, 5, 7)
    cl = layout.channels_last(capture(m, [x]), [x])
    nodes = [n for n in cl.graph_module.graph.nodes if n.op == "call_function"]
    (out,) = next(n for n in cl.graph_module.graph.nodes if n.op == "output").args[0]
    assert out.target is operator.getitem and out.meta["val"].is_contiguous()  # the norm's own output
    assert sum(n.target is aten.clone.default for n in nodes) == 1  # only the row-major copy of its input
    with torch.no_grad():
        torch.testing.assert_close(cl.graph_module(*cl.flat_args([x]))[0], m(x), rtol=1e-5, atol=1e-5)
