"""The end-to-end output check: eager's own rounding noise is not held against forge."""

import torch

from forge.runtime.endtoend import outputs_match


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
