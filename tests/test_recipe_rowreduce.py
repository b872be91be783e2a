"""The row-reduction recipe: generated C kernels for norms and softmaxes, verified by the real worker."""

import pytest
import torch
from conftest import EXAMPLES, MODELS, lowerable

from forge.capture.export import capture
from forge.capture.model_input import load_file
from forge.evaluate.evaluator import Evaluator
from forge.kernel import TaskSpec
from forge.policy.recipes import rowreduce
from forge.policy.recipes.emit import NotMine
from forge.tasks.cut import build_tasks


class Reductions(torch.nn.Module):
    """log_softmax, logsumexp, a row mean and amax: rows whose length is no multiple of a vector."""

    def forward(self, x):
        return (torch.log_softmax(x * 2, -1), torch.logsumexp(x, -1), x.mean(-1, keepdim=True) + 1,
                x.amax(-1).sigmoid())


def row_tasks():
    tasks = []
    for f in (EXAMPLES / "rmsnorm_swiglu.py", EXAMPLES / "groupnorm_silu_conv.py",
              EXAMPLES / "masked_softmax_attention.py", MODELS / "stacked_blocks.py"):
        loaded = load_file(f)
        tasks += build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph)
    loaded = load_file(EXAMPLES / "rmsnorm_swiglu.py", "cpu", "bf16")
    tasks += build_tasks(capture(loaded.model, loaded.inputs).graph_module.graph)
    tasks += build_tasks(capture(Reductions(), [torch.randn(37, 1001)]).graph_module.graph)
    return lowerable(tasks, rowreduce.lower)


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator("cpu", timeout_s=60) as ev:
        yield ev


def test_norms_and_softmaxes_verify_with_every_schedule(evaluator):
    found = row_tasks()
    ops = {low.op for _, low in found}
    assert {"mean", "native_group_norm", "_softmax", "native_layer_norm", "_log_softmax", "logsumexp",
            "amax"} <= ops, ops
    for task, low in found:
        spec = TaskSpec.of(task)
        for knobs in (rowreduce.RowKnobs(), rowreduce.RowKnobs(online=False, welford=True, simd=False, chunk=2)):
            res = evaluator.evaluate(spec, rowreduce.candidate(low, knobs))
            assert res.status.value == "ok", (task.key, knobs, res.message, res.build_log[-400:])


def test_pointwise_tasks_and_column_reductions_are_not_mine():
    class Columns(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=0), x.sum(0)

    for t in build_tasks(capture(Columns(), [torch.randn(8, 16)]).graph_module.graph):
        with pytest.raises(NotMine, match="not the last|not the trailing"):
            rowreduce.lower(TaskSpec.of(t))
    t = build_tasks(capture(torch.nn.SiLU(), [torch.randn(8, 16)]).graph_module.graph)[0]
    with pytest.raises(NotMine, match="not one reduction"):
        rowreduce.lower(TaskSpec.of(t))


def test_rows_in_parallel_only_when_the_work_is_worth_threads(evaluator):
    """A softmax over 8 x 100 elements runs its rows on the calling thread; over PARALLEL_MIN or more, in
    parallel (forge.policy.recipes.pointwise.PARALLEL_MIN); both verify."""
    from forge.policy.recipes.pointwise import PARALLEL_MIN

    class Softmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)

    for rows, threads in ((8, False), (PARALLEL_MIN // 100 + 1, True)):
        (task,) = build_tasks(capture(Softmax(), [torch.randn(rows, 100)]).graph_module.graph)
        spec = TaskSpec.of(task)
        cand = rowreduce.candidate(rowreduce.lower(spec), rowreduce.RowKnobs())
        assert ("#pragma omp parallel for" in cand.source) is threads, rows
        res = evaluator.evaluate(spec, cand)
        assert res.status.value == "ok", (rows, res.message, res.build_log[-400:])
