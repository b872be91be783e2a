"""Loops as tasks (forge.capture.scans): the gated delta rule's chunk loop captured as one op, a task of its own."""

from __future__ import annotations

import contextlib

import pytest
import torch

from forge.capture import export
from forge.capture.export import capture
from forge.capture.scans import IMPORT, as_ops, is_scan, library_source, precise
from forge.tasks.cut import build_tasks, compile_source

pytest.importorskip("transformers")

RULE = "transformers.models.qwen3_5.modeling_qwen3_5.torch_chunk_gated_delta_rule"


def qwen(layers: int = 2, seq: int = 80, seed: int = 0):
    """A small Qwen 3.5 cut (layers 0-2 are Gated DeltaNet): 80 tokens are two chunks of 64, the second padded."""
    from forge.capture import zoo

    torch.manual_seed(seed)
    return zoo.build("qwen35", device="cpu", batch=1, layers=layers, seq=seq)


def delta_inputs(b: int = 2, t: int = 80, hk: int = 2, hv: int = 4, dk: int = 16, dv: int = 8, seed: int = 0):
    """The rule's inputs in its domain: g a log decay (<= 0), beta in (0, 1); two key heads serve four value heads."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, t, hk, dk, generator=gen) for _ in range(2))
    v = torch.randn(b, t, hv, dv, generator=gen)
    g = -torch.rand(b, t, hv, generator=gen)
    beta = torch.rand(b, t, hv, generator=gen)
    return q, k, v, g, beta


def graph_targets(cap) -> list:
    return [n.target for n in cap.graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.slow
def test_the_chunk_loop_is_one_node_a_layer_and_the_graph_runs_as_eager():
    model, inputs = qwen()
    cap = capture(model, inputs)
    targets = graph_targets(cap)
    assert sum(is_scan(t) for t in targets) == 2  # one per Gated DeltaNet layer
    assert torch.ops.aten.linalg_solve_triangular.default not in targets  # nothing of the loop's body
    with torch.no_grad():
        want = model(*inputs)
        got = cap.graph_module(*cap.flat_args(inputs))
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_without_the_op_the_loop_is_unrolled_into_far_more_nodes(monkeypatch):
    model, inputs = qwen(layers=1, seq=200)  # four chunks
    scans = len(graph_targets(capture(model, inputs)))
    monkeypatch.setattr(export, "as_ops", contextlib.nullcontext)
    unrolled = len(graph_targets(capture(model, inputs)))
    assert unrolled > scans + 100, (unrolled, scans)


@pytest.mark.slow
def test_the_scan_is_one_task_of_family_scan_counted_per_layer_and_its_source_runs_the_library():
    model, inputs = qwen()
    tasks = [t for t in build_tasks(capture(model, inputs).graph_module.graph) if t.family == "scan"]
    assert len(tasks) == 1 and tasks[0].count == 2  # both layers share the key
    (task,) = tasks
    assert task.key.startswith("chunk_gated_delta_rule-") and IMPORT in task.source and RULE in task.source
    assert "for i in range(num_chunks)" in task.module_source  # the loop a policy replaces, for prompts
    assert RULE in task.module and "Qwen3_5GatedDeltaNet" in task.module
    # the reference, compiled from its text alone, is the library's own computation
    q, k, v, g, beta = (strided(m, i) for i, m in enumerate(task.inputs))
    g, beta = -g.abs(), beta.sigmoid()  # the rule's domain: g <= 0, beta in (0, 1)
    (got,) = compile_source(task.source)(q, k, v, g, beta)
    shape = (1, 80, 16, 128)  # the split and the heads, as the region's views make them
    want, _ = lib_rule()(*(x.reshape(shape) for x in (q, k, v)), g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(got, want)


def strided(meta, seed: int) -> torch.Tensor:
    """Random values laid out as `meta` says (every element its strides reach)."""
    span = 1 + sum((s - 1) * st for s, st in zip(meta.shape, meta.stride, strict=True))
    flat = torch.randn(span, generator=torch.Generator().manual_seed(seed), dtype=meta.torch_dtype)
    return flat.as_strided(meta.shape, meta.stride)


def lib_rule():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as lib

    return lib.torch_chunk_gated_delta_rule


def test_the_op_computes_what_the_library_function_does_final_state_and_all():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as lib

    q, k, v, g, beta = delta_inputs()
    state = torch.randn(2, 4, 16, 8)
    kw = dict(g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want = lib.torch_chunk_gated_delta_rule(q, k, v, **kw)
    with as_ops():
        routed = lib.torch_chunk_gated_delta_rule
        with torch.no_grad():
            got = routed(q, k, v, **kw)
            unasked = routed(q, k, v, g=g, beta=beta)
    assert routed is not lib.torch_chunk_gated_delta_rule  # put back
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert unasked[1] is None and unasked[0].shape == (2, 80, 4, 8)  # no final state unless asked, as the library


def test_calls_the_op_does_not_cover_go_to_the_library():
    """Packed sequences (`cu_seqlens`) are the library's own business (it refuses them without FLA): the op never
    sees them; a fake call through export shows the op where it covers the call."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as lib

    q, k, v, g, beta = delta_inputs(b=1)
    with as_ops(), pytest.raises(ValueError, match="packed sequences"):
        lib.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, cu_seqlens=torch.tensor([0, 40, 80]))

    class Rule(torch.nn.Module):
        def forward(self, q, k, v, g, beta):
            return lib.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]

    cap = capture(Rule(), [q, k, v, g, beta])
    assert sum(is_scan(t) for t in graph_targets(cap)) == 1
    with torch.no_grad():
        torch.testing.assert_close(cap.graph_module(*cap.flat_args([q, k, v, g, beta]))[0], Rule()(q, k, v, g, beta))


def test_only_the_functions_forge_routes_are_called_back_by_name():
    """The op's last argument names the library function it runs (and a confined worker imports its module before
    its filter): a name forge never routes is refused, not imported."""
    from forge.capture.scans import libraries, library_function

    assert library_function(RULE) is lib_rule()
    with pytest.raises(ValueError, match="Invalid scan function"):
        library_function("os.system")
    call = "v0 = torch.ops.forge_scan.chunk_gated_delta_rule.default(in0, in1, in2, in3, in4, None, 64, True, '{}')"
    assert libraries(call.format(RULE)) == ("transformers.models.qwen3_5.modeling_qwen3_5",)
    assert libraries(call.format("os.path.join")) == ()


def chunked_in_float64():
    """The library's own chunked algorithm with its float32 made float64 (its source, run in its module)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as lib

    namespace = dict(vars(lib))
    exec(library_source(RULE).replace("torch.float32", "torch.float64"), namespace)  # noqa: S102 - the library's
    return namespace["torch_chunk_gated_delta_rule"]


@pytest.mark.parametrize("state, l2norm, t", [(True, True, 80), (False, False, 37)])
def test_under_precise_the_op_computes_the_rule_in_float64(state: bool, l2norm: bool, t: int):
    """Verification's higher-precision reference of a scan (forge.capture.scans.precise): token by token in float64,
    it equals the library's chunked algorithm run in float64 to 1e-10; the library as it is (float32 inside, whatever
    it is given) is what the op computes without it."""
    q, k, v, g, beta = (x.double() for x in delta_inputs(t=t))
    s0 = torch.randn(2, 4, 16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) if state else None
    kw = dict(g=g, beta=beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    want = chunked_in_float64()(q, k, v, **kw)
    op = torch.ops.forge_scan.chunk_gated_delta_rule
    with precise():
        got = op(q, k, v, g, beta, s0, 64, l2norm, RULE)
    plain = op(q, k, v, g, beta, s0, 64, l2norm, RULE)
    library = lib_rule()(q, k, v, **kw)
    for mine, truth, lib32, off in zip(got, want, library, plain, strict=True):
        assert mine.dtype == torch.float64
        torch.testing.assert_close(mine, truth, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(off.to(lib32.dtype), lib32, rtol=0, atol=0)  # without precise(): the library
        assert (lib32.double() - truth).abs().max() > 1e-9  # which rounds in float32
