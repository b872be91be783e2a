"""The checks of one output against its reference, one function a check (forge.evaluate.verify runs them on
every input set, forge.evaluate.judge on repeated and kept timed calls): written wholly and inside its buffer,
no NaN/Inf where the reference is finite, not the previous set's result, not constant, within tolerance (the
one error metric and tolerance table of forge.tolerance); a wrong value carries where it is wrong."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from forge.capture.export import TensorMeta
from forge.evaluate.mismatch import Mismatch, mismatch
from forge.kernel import Status
from forge.tolerance import all_finite, every, everywhere, rel_errors, tolerance

if TYPE_CHECKING:
    from forge.evaluate.guarded import Guarded

log = logging.getLogger(__name__)


@dataclass
class Verdict:
    """The outcome of verification: a status, a message and per-set detail."""

    status: Status
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    mismatch: Mismatch | None = None  # where a wrong output is wrong (forge.evaluate.mismatch)


def judge_output(name: str, o: Guarded, eager: torch.Tensor, high: torch.Tensor, meta: TensorMeta,
                  finite: torch.Tensor, prev: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
                  row: dict[str, Any], where: str, i: int) -> Verdict | None:
    """The first check output i fails on one set, else None: written inside its buffer only, and wholly; no
    NaN/Inf where judged; not the previous set's output (`prev`: that output, eager's and its judged mask);
    not constant; within tolerance (the error and tolerance go into `row`)."""
    if not o.guards_intact():
        return Verdict(Status.OUT_OF_BOUNDS, f"{name}: wrote outside the output buffer")
    out = o.tensor
    left = o.poisoned() if every(finite) else o.poisoned() & finite
    if left.any():
        return Verdict(Status.PARTIAL_WRITE, f"{name}: {int(left.sum())} of {meta.numel} elements never written")
    bad = nonfinite(name, out, finite)
    if bad is not None:
        return with_mismatch(bad, i, out, high, finite, tolerance(meta.dtype).kernel)
    if prev is not None and stale(out, eager, finite, *prev):
        return Verdict(Status.STALE_RESULT, f"{name}: same output as for the previous, different inputs "
                       "(a cached result)")
    if constant(out, eager, finite):
        return Verdict(Status.CONSTANT_OUTPUT, f"{name}: every judged element is {_span(out, finite)[0].item()}")
    bad = within_tolerance(name, out, eager, high, finite, meta.dtype, row, where, i)
    return with_mismatch(bad, i, out, high if out.is_floating_point() else eager, finite, row.get(f"tol{i}"))


def with_mismatch(bad: Verdict | None, i: int, out: torch.Tensor, ref: torch.Tensor, finite: torch.Tensor,
                   tol: float | None) -> Verdict | None:
    """A wrong-value verdict with where the output is wrong; any other verdict as it is."""
    if bad is None or bad.status not in (Status.NONFINITE, Status.WRONG_RESULT, Status.LOW_PRECISION):
        return bad
    try:
        return replace(bad, mismatch=mismatch(i, out, ref, finite, tol if out.is_floating_point() else None))
    except Exception:  # noqa: BLE001 - the summary is a help for the next prompt, never a reason to fail
        log.exception("mismatch summary failed")
        return bad


def stale(out: torch.Tensor, eager: torch.Tensor, finite: torch.Tensor, out_prev: torch.Tensor,
           eager_prev: torch.Tensor, finite_prev: torch.Tensor) -> bool:
    """The output equals the previous set's where both sets are judged, while eager's differ there."""
    if every(finite) and every(finite_prev):  # the usual case: every element judged in both sets
        return torch.equal(out, out_prev) and not torch.equal(eager, eager_prev)
    both = finite & finite_prev
    if not both.any() or ((out != out_prev) & both).any():
        return False
    return bool(((eager != eager_prev) & both).any())


def _span(t: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of t over mask (integer and boolean outputs are judged everywhere)."""
    if t.is_floating_point():
        if every(mask):  # the usual case: one pass
            lo, hi = torch.aminmax(t)
            return lo, hi
        return torch.where(mask, t, float("inf")).min(), torch.where(mask, t, float("-inf")).max()
    t = t.to(torch.int64)
    return t.min(), t.max()


def constant(out: torch.Tensor, eager: torch.Tensor, finite: torch.Tensor) -> bool:
    """Every judged element of the output is the same value, and eager's are not."""
    if finite.numel() <= 1 or (not every(finite) and int(finite.sum()) <= 1):
        return False
    lo, hi = _span(out, finite)
    if bool(lo != hi):
        return False
    lo, hi = _span(eager, finite)
    return bool(lo != hi)


def judged(eager: torch.Tensor, high: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where an output is judged: where the higher-precision reference (in the output dtype) and eager's
    own result are finite (a kernel as exact as eager passes even where eager overflows)."""
    if not high.is_floating_point():
        return everywhere(high)
    hi = high.to(dtype) if high.dtype != dtype else high
    if all_finite(hi) and all_finite(eager):  # the usual case: told by two sums, the mask made at no cost
        return everywhere(high)
    return torch.isfinite(hi) & torch.isfinite(eager)


def nonfinite(name: str, out: torch.Tensor, finite: torch.Tensor) -> Verdict | None:
    """A `nonfinite` verdict where the output has NaN/Inf at a judged element, else None."""
    if out.is_floating_point():
        if all_finite(out):  # the usual case: by its sum
            return None
        bad = ~torch.isfinite(out) & finite
        if bad.any():
            return Verdict(Status.NONFINITE, f"{name}: {int(bad.sum())} NaN/Inf where the reference is finite")
    return None


def off_reference(name: str, out: torch.Tensor, eager: torch.Tensor, high: torch.Tensor, dtype: str, where: str,
                  i: int) -> tuple[Verdict | None, torch.Tensor]:
    """An output judged against the reference where it is judged (`judged`): NaN/Inf there, else out of
    tolerance (or unequal, integers); the verdict or None, and that mask."""
    finite = judged(eager, high, out.dtype)
    return nonfinite(name, out, finite) or within_tolerance(name, out, eager, high, finite, dtype, {}, where, i), finite


def within_tolerance(name: str, out: torch.Tensor, eager: torch.Tensor, high: torch.Tensor,
                     finite: torch.Tensor, dtype: str, row: dict[str, Any], where: str, i: int) -> Verdict | None:
    """None when the output is equal (integers) or within tolerance of `high` (floats; the error and
    tolerance go into `row`), else the `wrong_result` or `low_precision` verdict."""
    if not out.is_floating_point():
        if torch.equal(out, eager):
            return None
        return Verdict(Status.WRONG_RESULT, f"{name}: {int((out != eager).sum())} elements differ ({where})")
    err, eager_err = rel_errors([out, eager], high, finite)
    tol = max(tolerance(dtype).kernel, 2 * eager_err)
    row.update({f"err{i}": err, f"eager_err{i}": eager_err, f"tol{i}": tol})
    if err <= tol:
        return None
    band = max(tolerance(dtype).low_precision, 2 * tol)
    status = Status.LOW_PRECISION if err <= band else Status.WRONG_RESULT
    kind = "looks computed in a lower precision than asked: " if status is Status.LOW_PRECISION else ""
    return Verdict(status, f"{name}: {kind}error {err:.3g} > tolerance {tol:.3g} ({where}, eager's error "
                   f"{eager_err:.3g})")
