"""The worker's launcher: the run-time guard against PyTorch compute in Python (Triton) launchers."""

import inspect

import pytest
import torch

from forge.evaluate.checks import check_python
from forge.evaluate.launch import ForbiddenTorch, Launcher, NoTorchCompute
from forge.kernel import Status

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


def test_a_comment_cannot_show_inspect_another_kernel_than_python_runs(tmp_path):
    """str.splitlines splits at a form feed (and \\x85, \\u2028...) where Python's tokenizer does not: lines cached
    so, a comment holding `\\x0cdef kernel...` would be the source inspect gives Helion to compile."""
    source = ("def launch(inputs, outputs):\n    return 0\n\n\n"
              "#\x0cdef kernel(x): return 'hidden'\ndef kernel(x):\n    return x + 1\n")
    path = tmp_path / "staged-2.py"
    path.write_text(source)
    launcher = Launcher("triton", str(path), "launch")
    path.unlink()
    assert inspect.getsource(launcher.module.kernel) == "def kernel(x):\n    return x + 1\n"
    assert [s for s, _ in check_python(source)] == [Status.BAD_FORMAT]  # refused before it is ever built
