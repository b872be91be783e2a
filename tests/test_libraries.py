"""forge exports what eager runs: transformers' export-only code is not traced (forge.capture.libraries)."""

from __future__ import annotations

import pytest
import torch

from forge.capture.export import capture
from forge.capture.libraries import as_eager

pytest.importorskip("transformers")


def test_the_check_is_swapped_only_inside_and_restored_after_an_error():
    import transformers.masking_utils as masking
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen
    from transformers.utils import import_utils

    original = import_utils.is_torchdynamo_exporting
    with pytest.raises(ZeroDivisionError), as_eager():
        assert masking.is_torchdynamo_exporting is not original and qwen.is_torchdynamo_exporting is not original
        assert qwen.is_torchdynamo_exporting() is False
        _ = 1 / 0
    assert masking.is_torchdynamo_exporting is original and qwen.is_torchdynamo_exporting is original


def test_modules_that_tell_compile_from_export_keep_the_real_check():
    """Mamba's scan runs eager's loop only when it sees export: "compiling and not exporting" takes the
    associative scan eager never runs, so its check is not swapped (a 1-layer MambaModel at 12 tokens captured
    160 nodes of that scan with it swapped, 281 of eager's loop without)."""
    from transformers.models.mamba import modeling_mamba as mamba
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen
    from transformers.utils import import_utils

    original = import_utils.is_torchdynamo_exporting
    with as_eager():
        assert mamba.is_torchdynamo_exporting is original and qwen.is_torchdynamo_exporting is not original


@pytest.mark.slow
def test_qwen35s_delta_rule_is_captured_as_eager_runs_it(monkeypatch):
    """Where forge traces the delta rule's body (a call the scan op does not cover, forge.capture.scans; here the
    op is turned off), it traces eager's algorithm."""
    import contextlib

    from forge.capture import export, zoo

    monkeypatch.setattr(export, "as_ops", contextlib.nullcontext)
    torch.manual_seed(0)
    model, inputs = zoo.build("qwen35", device="cpu", layers=1, seq=80)  # two chunks of 64, the second padded
    cap = capture(model, inputs)
    targets = [n.target for n in cap.graph_module.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    # eager's two triangular solves, not export's forward substitution (63 sliced updates of the system)
    assert targets.count(aten.linalg_solve_triangular.default) == 2
    assert targets.count(aten.slice_scatter.default) + targets.count(aten.copy_.default) < 20
    with torch.no_grad():
        want = model(*inputs)
        got = cap.graph_module(*cap.flat_args(inputs))
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)
