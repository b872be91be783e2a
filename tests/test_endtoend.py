"""The end-to-end output check: eager's own rounding noise is not held against forge."""

import pytest
import torch

from forge.runtime.endtoend import outputs_match
from forge.tolerance import model_tolerance, tf32_convolutions


def test_outputs_are_judged_against_float64_when_eager_is_rounding_noise():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GroupNorm(32, 32)).eval()  # 1-element groups
    x = torch.rand(8, 64)
    with torch.no_grad():
        eager = model(x)
        exact = model.double()(x.double()).float()  # ~0: every group normalises a single value
        model.float()
    assert eager.abs().max() > 1e3 * exact.abs().max()  # eager is nothing but rounding error here
    assert outputs_match(model, lambda *a: exact, [x])[0]  # closer to the truth than eager: a match
    assert not outputs_match(model, lambda *a: exact + 1e-3, [x])[0]  # further from it: not a match
    assert not outputs_match(torch.nn.Linear(64, 32), lambda *a: torch.zeros(8, 32), [x])[0]


class ConvNorm(torch.nn.Module):
    """A convolution, a sigmoid and a GroupNorm: the norm amplifies a convolution's rounding (KernelBench L2 21)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.sigmoid(self.conv(x)))


def _off_by(model: torch.nn.Module, x: torch.Tensor, rel: float):
    """`model`'s output with an error of `rel` against eager's scale at one element."""
    def fn(a):
        y = model(a).clone()
        y.view(-1)[0] += rel * 2 * y.abs().mean()
        return y
    return fn


def test_a_float32_model_is_judged_at_float32_unless_cudnn_may_run_its_convolutions_in_tf32(monkeypatch):
    torch.manual_seed(1)
    model, x = ConvNorm().eval(), torch.randn(2, 3, 9, 9)
    assert model_tolerance(torch.float32) == 1e-3 and model_tolerance(torch.float32, tf32=True) == 1e-2
    assert model_tolerance(torch.bfloat16, tf32=True) == model_tolerance(torch.bfloat16)  # TF32 is float32's only
    assert not tf32_convolutions(model)  # on the CPU cuDNN runs nothing
    assert outputs_match(model, _off_by(model, x, 2e-4), [x])[0]
    assert not outputs_match(model, _off_by(model, x, 3e-3), [x])[0]  # TF32's error in float32: not a match


@pytest.mark.cuda
def test_on_cuda_tf32_convolutions_widen_the_model_tolerance_as_the_users_settings_allow(monkeypatch):
    torch.manual_seed(2)
    model, x = ConvNorm().eval().cuda(), torch.randn(2, 3, 9, 9, device="cuda")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # PyTorch's default
    assert tf32_convolutions(model) and outputs_match(model, _off_by(model, x, 3e-3), [x])[0]
    assert not outputs_match(model, _off_by(model, x, 3e-2), [x])[0]
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # the user asked for float32 convolutions
    assert not tf32_convolutions(model) and not outputs_match(model, _off_by(model, x, 3e-3), [x])[0]
