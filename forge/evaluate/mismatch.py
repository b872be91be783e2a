"""Where a wrong output is wrong: the worst elements and the pattern of the error (for the next prompt).

Computed by the judge in forge's process from the output it already compared; the candidate never sees it.
Important: the summary is small (a few elements and one line) whatever the tensor size, so it can go into
the stored verification detail and a prompt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

WORST = 5  # elements listed


@dataclass(frozen=True)
class Mismatch:
    """The wrong elements of one output: how many, the worst (index, expected, got) and the pattern."""

    output: int
    wrong: int  # elements out of tolerance (or NaN/Inf, or unequal integers)
    total: int  # judged elements
    worst: tuple[tuple[tuple[int, ...], float, float], ...]  # (index, expected, got), worst first
    pattern: str  # e.g. "all wrong", "tail only: the last 3 of every row", "one row: row 5"
    nonfinite: int = 0  # of the wrong ones, NaN or Inf

    def as_dict(self) -> dict[str, Any]:
        """The JSON form stored with the verification detail."""
        d = asdict(self)
        d["worst"] = [{"index": list(i), "expected": e, "got": g} for i, e, g in self.worst]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Mismatch:
        """Back from `as_dict` (a stored evaluation)."""
        worst = tuple((tuple(w["index"]), float(w["expected"]), float(w["got"])) for w in d.get("worst", ()))
        return cls(int(d["output"]), int(d["wrong"]), int(d["total"]), worst, str(d["pattern"]),
                   int(d.get("nonfinite", 0)))

    def describe(self) -> str:
        """One paragraph for a prompt."""
        lines = [f"output {self.output}: {self.wrong} of {self.total} judged elements wrong"
                 + (f" ({self.nonfinite} NaN/Inf)" if self.nonfinite else "") + f"; pattern: {self.pattern}"]
        lines += [f"  at {list(i)}: expected {e:.6g}, got {g:.6g}" for i, e, g in self.worst]
        return "\n".join(lines)


def mismatch(i: int, out: torch.Tensor, ref: torch.Tensor, judged: torch.Tensor, tol: float | None) -> Mismatch:
    """The wrong elements of output `i` against `ref` where `judged`: beyond `tol` (relative error as
    forge.tolerance.rel_error scales it), NaN/Inf, or unequal (integers, `tol` None)."""
    o, r = out.detach().to("cpu"), ref.detach().to("cpu")
    m = judged.detach().to("cpu").reshape(o.shape) if judged.numel() == o.numel() else torch.ones_like(o, dtype=bool)
    if o.is_floating_point():
        o64, r64 = o.double(), r.double().reshape(o.shape)
        ra = torch.where(m, r64.abs(), 0.0)
        scale = (ra.sum() / max(int(m.sum()), 1)).clamp_min(1e-30)
        err = torch.where(m, (o64 - r64).abs() / (r64.abs() + scale), 0.0)
        bad_val = ~torch.isfinite(o64) & m
        err = torch.where(bad_val, torch.inf, torch.nan_to_num(err, nan=torch.inf))
        bad = (err > (tol or 0.0)) & m
    else:
        o64, r64 = o.to(torch.int64).double(), r.to(torch.int64).double().reshape(o.shape)
        err = (o64 - r64).abs()
        bad, bad_val = (err > 0) & m, torch.zeros_like(m)
    flat = err.reshape(-1)
    k = min(WORST, int(bad.sum()))
    top = torch.topk(torch.where(bad.reshape(-1), flat, -1.0), k).indices.tolist() if k else []
    worst = tuple((_index(j, tuple(o.shape)), float(r64.reshape(-1)[j]), float(o64.reshape(-1)[j])) for j in top)
    return Mismatch(i, int(bad.sum()), int(m.sum()), worst, pattern(bad, bad_val), int(bad_val.sum()))


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat //= s if s else 1
    return tuple(reversed(out))


def pattern(bad: torch.Tensor, nonfinite: torch.Tensor) -> str:
    """What the wrong elements have in common: all, the tail of the tensor or of every row, one row, some rows,
    the first elements, NaN where; else how scattered they are."""
    n, wrong = bad.numel(), int(bad.sum())
    if wrong == 0:
        return "none wrong"
    nan = f"; NaN/Inf at {int(nonfinite.sum())} of them" if nonfinite.any() else ""
    if wrong >= 0.9 * n:
        return "all wrong (or nearly: the whole computation, not an edge case)" + nan
    flat = bad.reshape(-1)
    first = int(flat.nonzero()[0])
    if bool(flat[first:].all()):
        return f"tail only: the last {n - first} elements (from flat index {first}; a remainder loop?)" + nan
    if not bool(flat[wrong:].any()):
        return f"head only: the first {wrong} elements" + nan
    if bad.dim() >= 2:
        rows = bad.reshape(bad.shape[0], -1)
        hit = rows.any(1)
        cols = rows.shape[1]
        if int(hit.sum()) == 1:
            return f"one row: row {int(hit.nonzero()[0])} of {rows.shape[0]} (index 0)" + nan
        per_col = rows.any(0)
        c0 = int(per_col.nonzero()[0])
        if bool(per_col[c0:].all()) and c0 > 0 and bool((rows[:, c0:] == hit[:, None]).all()):
            return f"tail of every row: the last {cols - c0} of {cols} elements of each affected row" + nan
        if int(hit.sum()) < rows.shape[0]:
            return f"some rows: {int(hit.sum())} of {rows.shape[0]} rows have wrong elements" + nan
    return f"scattered: {wrong} of {n} elements ({100 * wrong / n:.1f}%)" + nan
