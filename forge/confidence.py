"""How sure a timing is: the confidence interval of a median, speedup intervals, noise, and who beats whom.

Method (distribution-free, no resampling):
- the interval of a median is a pair of order statistics: with n sorted samples, [x_(k), x_(n+1-k)] where k is
  the largest rank with P(Binomial(n, 1/2) < k) <= (1 - level) / 2; it covers the true median with probability
  at least `level` whatever the distribution (below 6 samples no pair reaches 95%: the whole range is given);
- a speedup's interval divides the baseline's interval by the candidate's, end against end
  ([base_lo / cand_hi, base_hi / cand_lo]): it holds whenever both medians' intervals do;
- one timing beats another only when the intervals do not overlap (its upper end below the other's lower end);
- a timing is noisy when p90 / p10 > `NOISY_SPREAD` or the median's interval is wider than `NOISY_WIDTH` of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from forge.kernel import Timing

LEVEL = 0.95
NOISY_SPREAD = 1.5  # p90 / p10 above this: the samples spread too far to trust one number
NOISY_WIDTH = 0.2  # (hi - lo) / median above this: the median itself is unsure


def median_ci(samples: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The distribution-free interval of the median of `samples` at `level` (module doc)."""
    s = sorted(samples)
    n = len(s)
    if n == 0:
        raise ValueError("Invalid samples: none")
    tail, total, k = (1.0 - level) / 2.0, 2**n, 0
    cum = 0  # P(B < k) * 2**n, exact in integers
    while k < n // 2:
        nxt = cum + math.comb(n, k)  # P(B < k + 1) * 2**n
        if nxt / total > tail:
            break
        cum, k = nxt, k + 1
    # P(B < k) <= tail: [x_(k), x_(n+1-k)] (1-based) covers the median with 1 - 2 P(B < k); k = 0: none does,
    # the whole range is the widest there is
    cut = max(k - 1, 0)
    return s[cut], s[n - 1 - cut]


def interval(t: Timing) -> tuple[float, float]:
    """The interval of a timing's median (its stored one; the p10-p90 range for a timing stored without)."""
    if t.ci_lo_us is not None and t.ci_hi_us is not None:
        return t.ci_lo_us, t.ci_hi_us
    return t.p10_us, t.p90_us


def speedup(baseline: Timing | None, timing: Timing | None) -> float | None:
    """Baseline median over candidate median, when both were measured: the one speedup forge reports."""
    if timing is None or baseline is None or timing.median_us <= 0:
        return None
    return baseline.median_us / timing.median_us


def speedup_ci(baseline: Timing | None, timing: Timing | None) -> tuple[float, float] | None:
    """The interval of `speedup(baseline, timing)` (module doc), or None without both."""
    if timing is None or baseline is None:
        return None
    (b_lo, b_hi), (t_lo, t_hi) = interval(baseline), interval(timing)
    if t_lo <= 0 or t_hi <= 0:
        return None
    return b_lo / t_hi, b_hi / t_lo


def faster(a: Timing, b: Timing) -> bool:
    """Whether `a` is faster than `b` beyond noise: a's upper end below b's lower end."""
    return interval(a)[1] < interval(b)[0]


def noisy(t: Timing | None) -> bool:
    """Whether a timing spreads too much to be trusted (module doc)."""
    if t is None or t.median_us <= 0:
        return False
    lo, hi = interval(t)
    return (t.p10_us > 0 and t.p90_us / t.p10_us > NOISY_SPREAD) or (hi - lo) / t.median_us > NOISY_WIDTH


@dataclass(frozen=True)
class Contender:
    """A candidate to decide on: its key (a node id), its time and the eager time measured alongside it."""

    key: int
    timing: Timing
    baseline: Timing


@dataclass(frozen=True)
class Decision:
    """Which contender wins (None: eager) and why: "improved", "no gain" or "no gain (within noise)"."""

    winner: Contender | None
    best: Contender | None  # the one reported: the winner, else the fastest by median
    status: str


def decide(contenders: Sequence[Contender], gain: float = 1.0) -> Decision:
    """The winner among contenders, in the order found: eager is the first incumbent; a contender takes over
    only when it is `faster` than the incumbent (than its own eager, for eager) and at least `gain` times
    faster by the medians. Overlapping intervals: no winner between them, the incumbent stays."""
    best = min(contenders, key=lambda c: c.timing.median_us, default=None)
    winner: Contender | None = None
    for c in contenders:
        against = winner.timing if winner else c.baseline
        if faster(c.timing, against) and against.median_us >= gain * c.timing.median_us:
            winner = c
    if winner is not None:
        return Decision(winner, winner, "improved")
    if best is None:
        return Decision(None, None, "no gain")
    apart = faster(best.timing, best.baseline) or faster(best.baseline, best.timing)
    return Decision(None, best, "no gain" if apart else "no gain (within noise)")


def fmt(value: float | None, ci: tuple[float, float] | None = None, is_noisy: bool = False) -> str:
    """A speedup as `2.35x [2.20-2.51]`, `~` appended when noisy; "-" without one."""
    if value is None:
        return "-"
    text = f"{value:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")
    return text + (" ~" if is_noisy else "")
