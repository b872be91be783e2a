"""Capture and task cutting: fusible regions, structural keys, reference callables against the model."""

import json

import pytest
import torch
from conftest import EXAMPLES, MODELS

from forge.capture.export import TensorMeta, capture
from forge.capture.model_input import load_file
from forge.capture.profile import Profile, profile_model
from forge.tasks.cut import Task, build_tasks, region_source
from forge.tasks.ops import FAMILIES
from forge.tasks.regions import cut, is_noop

ALL_FILES = [EXAMPLES / "groupnorm_silu_conv.py", EXAMPLES / "rmsnorm_swiglu.py",
             EXAMPLES / "masked_softmax_attention.py", MODELS / "stacked_blocks.py"]


def short_ops(task: Task) -> set[str]:
    return {o.split(".")[1] if o.startswith("aten.") else o for o in task.ops}


def tasks_of(path, device="cpu"):
    loaded = load_file(path, device)
    cap = capture(loaded.model, loaded.inputs)
    return loaded, cap, build_tasks(cap.graph_module.graph)


def run_by_regions(cap, args, tasks):
    """Evaluate the captured graph region by region, each through its task's reference callable."""
    graph = cap.graph_module.graph
    env = {n.name: a for n, a in zip(graph.find_nodes(op="placeholder"), args, strict=True)}
    pending = []
    for t in tasks:
        ref = t.reference()
        for occ in t.occurrences:
            region = [n for n in graph.nodes if n.name in set(occ)]
            pending.append((region_source(region), ref))
    while pending:
        ready = [p for p in pending if all(i in env for i in p[0].input_nodes)]
        assert ready, "regions form a cycle"
        for r, ref in ready:
            outs = ref(*[env[i] for i in r.input_nodes])
            env.update(zip(r.output_nodes, outs, strict=True))
            pending.remove((r, ref))
    (out,) = graph.find_nodes(op="output")
    return [env[a.name] for a in out.args[0]]


def test_groupnorm_silu_is_one_task():
    _, _, tasks = tasks_of(EXAMPLES / "groupnorm_silu_conv.py")
    (gn,) = [t for t in tasks if "native_group_norm" in short_ops(t)]
    assert "silu" in short_ops(gn) and gn.family == "normalization" and gn.count == 2
    (conv,) = [t for t in tasks if "convolution" in short_ops(t)]
    assert conv.family == "convolution/pooling" and conv.count == 2


def test_rmsnorm_and_swiglu_are_one_task_each():
    _, _, tasks = tasks_of(EXAMPLES / "rmsnorm_swiglu.py")
    (norm,) = [t for t in tasks if "mean" in short_ops(t)]
    assert {"pow", "rsqrt", "mul"} <= short_ops(norm) and norm.family == "normalization"
    assert norm.inputs[0].shape == (4, 256, 512) and len(norm.inputs) == 2  # x and the weight
    (swiglu,) = [t for t in tasks if "silu" in short_ops(t)]
    assert sum(o.endswith("mul.Tensor") for o in swiglu.ops) == 1 and swiglu.family == "activation"
    assert len(swiglu.inputs) == 2  # gate and up projections


def test_masked_softmax_is_one_task():
    _, _, tasks = tasks_of(EXAMPLES / "masked_softmax_attention.py")
    (sm,) = [t for t in tasks if "_softmax" in short_ops(t)]
    assert {"div", "where", "bitwise_not"} <= short_ops(sm)
    assert [t.family for t in tasks].count("matmul") == 4


def test_identical_blocks_share_tasks_with_counts():
    _, cap, tasks = tasks_of(MODELS / "stacked_blocks.py")
    by_op = {}
    for t in tasks:
        for o in short_ops(t):
            by_op.setdefault(o, []).append(t)
    # Blocks 2-4 fuse the previous block's residual add into their LayerNorm; block 1 has none.
    assert sorted(t.count for t in by_op["native_layer_norm"]) == [1, 3]
    (ln,) = [t for t in by_op["native_layer_norm"] if "add" in short_ops(t)]
    assert len(ln.occurrences) == 3 and ln.family == "normalization"
    (gelu,) = by_op["gelu"]
    assert gelu.count == 4 and gelu.family == "activation"
    assert sorted(t.count for t in by_op["addmm"]) == [4, 4]


def test_every_node_in_exactly_one_convex_region():
    for path in ALL_FILES:
        loaded = load_file(path)
        graph = capture(loaded.model, loaded.inputs).graph_module.graph
        regions = cut(graph)
        seen = [n for r in regions for n in r]
        assert len(seen) == len(set(seen))
        assert set(seen) == {n for n in graph.nodes if n.op == "call_function" and not is_noop(n)}
        for r in regions:  # convex: no input from outside depends on the region
            members = set(r)
            for n in r:
                for p in n.all_input_nodes:
                    if p in members:
                        continue
                    stack, seen_up = [p], set()
                    while stack:
                        q = stack.pop()
                        assert q not in members, f"region around {r[0].name} is not convex"
                        for a in q.all_input_nodes:
                            if a not in seen_up:
                                seen_up.add(a)
                                stack.append(a)


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.stem)
def test_references_recompute_the_model(path):
    loaded, cap, tasks = tasks_of(path)
    args = cap.flat_args(loaded.inputs)
    with torch.no_grad():
        expected = loaded.model(*loaded.inputs)
        (got,) = run_by_regions(cap, args, tasks)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_reference_on_fresh_inputs_matches_the_op_it_replaced():
    _, _, tasks = tasks_of(EXAMPLES / "rmsnorm_swiglu.py")
    (norm,) = [t for t in tasks if "mean" in short_ops(t)]
    x, w = (torch.randn(m.shape) for m in norm.inputs)
    outs = norm.reference()(x, w)
    xr = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(outs[0].view(xr.shape), xr)


def test_keys_are_stable_across_captures_and_devices():
    _, _, a = tasks_of(EXAMPLES / "masked_softmax_attention.py")
    _, _, b = tasks_of(EXAMPLES / "masked_softmax_attention.py")
    _, _, m = tasks_of(EXAMPLES / "masked_softmax_attention.py", device="meta")
    assert [t.key for t in a] == [t.key for t in b] == [t.key for t in m]
    assert len({t.key for t in a}) == len(a)


def test_key_changes_with_shape_dtype_and_stride():
    _, _, fp32 = tasks_of(EXAMPLES / "rmsnorm_swiglu.py")
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py", "cpu", "bf16")
    bf16 = build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph)
    assert not {t.key for t in fp32} & {t.key for t in bf16}
    base = torch.randn(8, 32)
    k1 = build_tasks(capture(torch.nn.ReLU(), [base]).graph_module.graph)[0].key
    k2 = build_tasks(capture(torch.nn.ReLU(), [base.t()]).graph_module.graph)[0].key
    assert k1 != k2


def test_profile_json_round_trip_and_shares(tmp_path):
    loaded = load_file(EXAMPLES / "groupnorm_silu_conv.py")
    prof, _ = profile_model(loaded, budget_s=0.2)
    assert prof.total_ms and prof.total_ms > 0 and prof.forward_ms > 0
    assert sum(t.share for t in prof.tasks) == pytest.approx(1.0)
    assert [t.ms for t in prof.tasks] == sorted((t.ms for t in prof.tasks), reverse=True)
    path = tmp_path / "p.json"
    prof.save(path)
    d = json.loads(path.read_text())
    assert {"model", "device", "dtype", "total_ms", "tasks"} <= d.keys()
    for t in d["tasks"]:
        assert {"key", "family", "ops", "inputs", "count", "ms", "share", "source"} <= t.keys()
        assert t["family"] in FAMILIES
        assert all({"shape", "dtype", "stride"} == i.keys() for i in t["inputs"])
    again = Profile.load(path)
    assert again.tasks == tuple(Task.parse(t) for t in d["tasks"])
    task = again.task(prof.tasks[0].key)
    ins = [torch.randn(m.shape) for m in task.inputs]
    assert all(o.shape == m.shape for o, m in zip(task.reference()(*ins), task.outputs, strict=True))


def test_meta_profile_has_no_times():
    prof, _ = profile_model(load_file(EXAMPLES / "rmsnorm_swiglu.py", "meta"))
    assert prof.device == "meta" and prof.total_ms is None
    assert all(t.ms is None and t.share is None for t in prof.tasks)


def test_tensor_meta_parse_rejects_bad_entries():
    assert TensorMeta.parse({"shape": [2, 3], "dtype": "bfloat16", "stride": [3, 1]}).short() == "bf16[2, 3]"
    for bad in ({"shape": [2]}, {"shape": [2], "dtype": "nope", "stride": [1]},
                {"shape": [2, 3], "dtype": "float32", "stride": [1]}):
        with pytest.raises(ValueError, match="Invalid tensor meta"):
            TensorMeta.parse(bad)


class _SinThenCos(torch.nn.Module):
    def forward(self, x, y):
        a = torch.sin(x) * 2
        b = torch.cos(y) + 1
        return a * b, torch.cos(y) * 3


class _CosThenSin(torch.nn.Module):
    def forward(self, x, y):
        b = torch.cos(y) + 1
        c = torch.cos(y) * 3  # the same subexpression twice, feeding different ops
        a = torch.sin(x) * 2
        return a * b, c


def test_a_task_key_follows_what_the_region_computes_not_the_graph_order():
    """Graphs of one model may order independent branches differently (from one process to the next): the
    tasks' sources, their inputs' order and their keys are the same."""
    x, y = torch.randn(4, 1), torch.randn(1, 8)
    one = sorted(build_tasks(capture(_SinThenCos(), [x, y]).graph_module.graph), key=lambda t: t.key)
    other = sorted(build_tasks(capture(_CosThenSin(), [x, y]).graph_module.graph), key=lambda t: t.key)
    assert [(t.key, t.source, t.inputs) for t in one] == [(t.key, t.source, t.inputs) for t in other]
    both = next(t for t in one if len(t.inputs) == 2)  # sin(x) * 2 * (cos(y) + 1), whichever came first
    ns: dict = {}
    exec(both.source, ns)  # noqa: S102 - forge's own rendering of the region
    args = [x, y] if both.inputs[0].shape == (4, 1) else [y, x]
    (got,) = ns["region"](*args)
    torch.testing.assert_close(got, _SinThenCos()(x, y)[0])
