"""How close is close enough: the one error metric and the one tolerance table forge judges outputs by.

Error: max |out - ref| / (|ref| + mean |ref|) over the judged elements (float64 when either side is, else
float32: the tolerances are far above float32's rounding of the reference; `rel_errors`, the judge's, in
float64 only when an output is). The scale term `mean |ref|`
keeps tiny outputs from passing as zeros and large ones from failing on rounding.

Tolerances per dtype: `kernel`, one region against its reference in higher precision (forge.evaluate.verify; above
it, up to `low_precision`, an error looks like arithmetic in a lower precision than asked), and `model`, a
whole forward against eager's (forge.runtime.endtoend: many regions' rounding adds up, and eager is not exact;
float16's for a float32 forward whose convolutions the user's settings let cuDNN run in TF32: model_tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """The errors allowed for one dtype."""

    kernel: float
    model: float
    low_precision: float


TOLERANCES = {"float32": Tolerance(1e-4, 1e-3, 5e-2), "float64": Tolerance(1e-9, 1e-6, 1e-3),
              "bfloat16": Tolerance(2e-2, 3e-2, 0.15), "float16": Tolerance(5e-3, 1e-2, 0.15)}
DEFAULT = TOLERANCES["float32"]  # for a dtype without a row of its own


def tolerance(dtype: str | torch.dtype) -> Tolerance:
    """The row of a dtype (its name, or the torch dtype)."""
    return TOLERANCES.get(str(dtype).removeprefix("torch."), DEFAULT)


def model_tolerance(dtype: str | torch.dtype, tf32: bool = False) -> float:
    """A whole forward's allowed error against eager's: the dtype's `model`, or, for a float32 forward whose
    convolutions cuDNN may run in TF32 (`tf32`, see tf32_convolutions), float16's: TF32 keeps float16's
    10-bit mantissa. The layout decides whether cuDNN does: on the H200, KernelBench level 2's conv + sigmoid +
    GroupNorm ran eager's NCHW convolution in float32 (error 2e-6 against float64) and torch.compile's NHWC one
    in TF32 (2.3e-3, the GroupNorm amplifying it), both under PyTorch's default settings."""
    row = tolerance(dtype)
    if tf32 and str(dtype).removeprefix("torch.") == "float32":
        return max(row.model, TOLERANCES["float16"].model)
    return row.model


def tf32_convolutions(model: torch.nn.Module) -> bool:
    """Whether the user's settings let cuDNN run this model's convolutions in TF32: a convolution module on a
    CUDA device and `torch.backends.cudnn.allow_tf32` (PyTorch's default: True). Convolutions called as
    functions are not seen: such a model keeps the float32 tolerance."""
    if not torch.backends.cudnn.allow_tf32:
        return False
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) and any(p.is_cuda for p in m.parameters())
               for m in model.modules())


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in `t`, told by its sum (one cheap pass: a NaN or an Inf makes the sum one; a sum that
    overflows says False, and the caller then looks element by element, as it would have)."""
    wide = torch.float64 if t.dtype == torch.float64 else torch.float32
    return bool(torch.isfinite(t.sum(dtype=wide)))


def everywhere(like: torch.Tensor) -> torch.Tensor:
    """A mask of `like`'s shape that holds everywhere, one element expanded (made at no cost; `every` tells
    it at once)."""
    return torch.ones((), dtype=torch.bool, device=like.device).expand(like.shape)


def every(mask: torch.Tensor) -> bool:
    """Whether a mask holds everywhere: at once for `everywhere`'s, else by a pass."""
    if mask.numel() > 1 and not any(mask.stride()):
        return bool(mask[(0,) * mask.dim()])
    return bool(mask.all())


def rel_errors(outs: list[torch.Tensor], ref: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """`rel_error` of each of `outs` against one `ref` over `mask`: the denominator made once, one sync. In
    float64 only when an output is: a float64 reference of lower-precision outputs is compared in float32 (half
    the bytes of every pass; its rounding there, 6e-8, is far below any tolerance but float64's)."""
    whole = every(mask)  # the usual case: no element left out, no masking passes
    n = mask.numel() if whole else int(mask.sum())
    if n == 0:
        return [0.0] * len(outs)
    wide = torch.float64 if any(o.dtype == torch.float64 for o in outs) else torch.float32
    r = ref.to(wide)
    ra = r.abs() if whole else torch.where(mask, r.abs(), 0.0)
    # summed in float64 whatever `wide` is: a float32 sum's last digits follow the thread count (stored errors
    # would differ between one worker and several); the elementwise steps and the max do not
    scale = (ra.sum(dtype=torch.float64) / n).clamp_min(1e-30)
    # in units of the scale: |r| + scale would overflow float32 near its largest values (an error of 0)
    inv = (1.0 / scale).to(wide)
    # 1 / (|r| + scale), made without |r| + scale (at most n + 1 in its units), in ra's place
    per = torch.div(inv, ra.mul_(inv).add_(1.0), out=ra)
    diffs = [torch.sub(o, r).abs_().mul_(per) for o in outs]
    errs = [(d if whole else torch.where(mask, d, 0.0)).amax() for d in diffs]
    return torch.stack(errs).tolist()


def rel_error(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """max |out - ref| / (|ref| + mean |ref|) over `mask` (every element without one); 0 when none."""
    if mask is not None:
        return rel_errors([out], ref, mask)[0]
    n = out.numel()
    if n == 0:
        return 0.0
    wide = torch.float64 if torch.float64 in (out.dtype, ref.dtype) else torch.float32
    o, r = out.to(wide), ref.to(wide)
    ra = r.abs()
    scale = (ra.sum() / n).clamp_min(1e-30)
    return float(((o - r).abs() / (ra + scale)).max())
