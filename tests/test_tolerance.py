"""The one error metric: rel_errors against a float64 reference in the outputs' precision."""

import torch

from forge.tolerance import rel_error, rel_errors, tolerance


def test_lower_precision_outputs_are_judged_in_float32_as_in_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(4096, generator=gen, dtype=torch.float64) * 100
    mask = torch.rand(4096, generator=gen) > 0.1
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = (ref * (1 + 1e-3 * torch.randn(4096, generator=gen, dtype=torch.float64))).to(dtype)
        (err,) = rel_errors([out], ref, mask)
        wide = rel_error(out.double(), ref, mask)  # a float64 output: in float64
        assert abs(err - wide) <= 1e-3 * tolerance("float32").kernel, (dtype, err, wide)  # far below any tolerance


def test_an_error_just_over_the_tolerance_is_seen_in_float32() -> None:
    ref = torch.linspace(1, 2, 1000, dtype=torch.float64)
    mask = torch.ones(1000, dtype=torch.bool)
    tol = tolerance("float32").kernel
    out = ref.to(torch.float32).clone()
    out[500] += 1.2 * tol * (ref[500] + ref.abs().mean()).item()
    (err,) = rel_errors([out], ref, mask)
    assert tol < err < 1.3 * tol
    assert rel_errors([ref.to(torch.float32)], ref, mask)[0] < 1e-7


def test_outputs_wrong_near_float32s_largest_values_are_seen() -> None:
    """|ref| + mean |ref| overflows float32 there: the error is taken in units of the mean, not found 0."""
    ref = torch.full((64,), 2.5e38, dtype=torch.float64)
    ref[0] = 1.0
    out = torch.zeros(64)
    out[1] = 1.0
    mask = torch.ones(64, dtype=torch.bool)
    (err,) = rel_errors([out], ref, mask)
    assert abs(err - rel_error(out.double(), ref, mask)) < 1e-6 and err > 0.4
