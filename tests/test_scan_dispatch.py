"""A scan task's kernel dispatched (forge.apply, block-wise, forge.load): it runs in every layer, its guarded
fallback runs the library's function, and the model's outputs match eager's."""

from __future__ import annotations

import json

import pytest
import torch

import forge
from forge.capture.blocks import blockwise
from forge.capture.export import capture
from forge.evaluate.build import build
from forge.kernel import KernelArtifact, TaskSpec
from forge.policy.recipes import scan
from forge.runtime.blockwise import apply_blockwise
from forge.runtime.dispatch import GuardedKernel
from forge.tasks.cut import Task, build_tasks

lib = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

pytestmark = pytest.mark.slow


def qwen(seed: int = 0):
    """Qwen 3.5 cut to its first two layers (both Gated DeltaNet) at 80 tokens: two chunks, the second padded."""
    from forge.capture import zoo

    torch.manual_seed(seed)
    return zoo.build("qwen35", device="cpu", batch=1, layers=2, seq=80)


def kernel(task: Task) -> KernelArtifact:
    """The scan recipe's default kernel for `task`, built."""
    cand = scan.candidate(scan.lower(TaskSpec.of(task)), scan.ScanKnobs())
    built = build(cand)
    assert built.ok, built.log
    return KernelArtifact(task.key, cand.backend, built.path, cand.entry, task.inputs, task.outputs, task.source)


def scan_task(tasks: list[Task] | tuple[Task, ...]) -> Task:
    (task,) = [t for t in tasks if t.family == "scan"]
    return task


def other_ids(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.randint_like(inputs[0], 0, 1000)]


def test_applied_the_scan_kernel_runs_in_both_layers_and_the_outputs_match_eager():
    model, inputs = qwen()
    art = kernel(scan_task(build_tasks(capture(model, inputs).graph_module.graph)))
    opt = forge.apply(model, inputs, [art], strict=True)  # strict: a fallback would raise
    for x in (inputs, other_ids(inputs)):
        with torch.no_grad():
            torch.testing.assert_close(opt(*x), model(*x), rtol=1e-4, atol=1e-4)
    counters = opt.counters()
    assert counters[art.key].hits == 4 and not counters[art.key].fallbacks  # 2 layers x 2 forwards


def test_block_wise_the_scan_kernel_runs_in_every_block_of_its_kind():
    model, inputs = qwen(1)
    bw = blockwise(model, inputs)
    assert bw is not None and bw.blocks == {"lm.model.layers.0": 2}
    art = kernel(scan_task(bw.tasks))
    opt = apply_blockwise(model, inputs, [art])
    assert opt is not None
    x = other_ids(inputs)
    with torch.no_grad():
        torch.testing.assert_close(opt(*x), model(*x), rtol=1e-4, atol=1e-4)
    assert opt.counters()[art.key].hits == 2 and opt.block_fallbacks == 0


def test_the_guarded_fallback_runs_the_librarys_function():
    model, inputs = qwen(2)
    task = scan_task(build_tasks(capture(model, inputs).graph_module.graph))
    guarded = GuardedKernel(kernel(task))
    gen = torch.Generator().manual_seed(3)
    args = []
    for i, m in enumerate(task.inputs):
        span = 1 + sum((s - 1) * st for s, st in zip(m.shape, m.stride, strict=True))
        x = torch.randn(span, generator=gen).as_strided(m.shape, m.stride)
        args.append(-x.abs() if i == 3 else x.sigmoid() if i == 4 else x)
    with torch.no_grad():
        (ran,) = guarded(*args)
        (fell,) = guarded(*[a.double() for a in args])  # another dtype than verified: the library runs
        shape = task.outputs[0].shape
        want, _ = lib.torch_chunk_gated_delta_rule(*(a.reshape(shape) for a in args[:3]), g=args[3], beta=args[4],
                                                   use_qk_l2norm_in_kernel=True)
    assert guarded.counters.hits == 1 and dict(guarded.counters.fallbacks) == {"dtype": 1}
    torch.testing.assert_close(fell.float(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ran, want, rtol=1e-4, atol=1e-4)


def test_optimize_searches_the_scan_and_its_artifact_loads(tmp_path, monkeypatch):
    from forge.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.json"
    code = main(["optimize", "--zoo", "qwen35", "--layers", "2", "--seq", "80", "--device", "cpu", "--no-inductor",
                 "--seconds", "150", "--budget", "12", "--db", str(tmp_path / "f.db"), "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    (row,) = [t for t in report["tasks"] if t["family"] == "scan"]
    assert row["candidates"] >= 1 and row["best_us"], row  # the recipe's kernels verified and timed
    assert report["outputs_match"] is True
    model, inputs = qwen()
    opt = forge.load(tmp_path / report["artifact"], model, inputs)
    x = other_ids(inputs)
    with torch.no_grad():
        torch.testing.assert_close(opt(*x), model(*x), rtol=1e-4, atol=1e-4)
