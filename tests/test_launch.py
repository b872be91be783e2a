"""The worker's launcher: the run-time guard against PyTorch compute in Python (Triton) launchers."""

import inspect

import pytest
import torch

from forge.evaluate.launch import ForbiddenTorch, Launcher, NoTorchCompute

SNEAKY = '''
import torch
import triton
import triton.language as tl


@triton.jit
def unused(x_ptr):
    pass


def launch(inputs, outputs):
    ops = torch.ops.aten          # dodges the static checks' view of calls
    outputs[0].copy_(ops.sigmoid.default(inputs[0]))
'''


def test_guard_allows_views_and_metadata_and_rejects_compute():
    x = torch.randn(4, 6)
    with NoTorchCompute():
        assert x.view(-1).shape == (24,) and x.t().stride() == (1, 6) and x.numel() == 24
        assert x.is_contiguous() and x.data_ptr() != 0
        with pytest.raises(ForbiddenTorch, match="aten.mul.Tensor"):
            x * 2


def test_python_launcher_computing_with_torch_is_caught_at_run_time(tmp_path):
    pytest.importorskip("triton")
    path = tmp_path / "kernel.py"
    path.write_text(SNEAKY)
    launcher = Launcher("triton", str(path), "launch")
    x, y = torch.randn(8), torch.full((8,), float("nan"))
    with pytest.raises(ForbiddenTorch):
        launcher.bind([x], [y], guard=True)()
    assert y.isnan().all()
    launcher.bind([x], [y])()  # unguarded (timing) it would run: verification is where the guard matters
    torch.testing.assert_close(y, torch.sigmoid(x))


def test_a_python_module_keeps_its_source_once_its_file_is_gone(tmp_path):
    """The worker loads a staged copy and removes it at once; Helion reads a kernel's source (inspect) at its first
    call, later: the source stays readable as it was imported."""
    path = tmp_path / "staged-1.py"
    path.write_text("def launch(inputs, outputs):\n    return 0\n\n\ndef kernel(x):\n    return x + 1\n")
    launcher = Launcher("triton", str(path), "launch")
    path.unlink()
    assert inspect.getsource(launcher.module.kernel) == "def kernel(x):\n    return x + 1\n"
