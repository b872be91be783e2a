"""forge.confidence: intervals of medians from order statistics, and who beats whom, on real timing samples."""

import math
import random

import pytest

from forge.bench import stats
from forge.confidence import Contender, decide, faster, fmt, median_ci, noisy, speedup_ci


def samples(median: float, spread: float, n: int, seed: int) -> list[float]:
    """Log-normal timings around `median` (relative spread `spread`), as a loaded machine gives them."""
    rng = random.Random(seed)
    return [median * math.exp(rng.gauss(0.0, spread)) for _ in range(n)]


def test_the_interval_of_a_median_is_the_binomial_order_statistics():
    s = list(range(1, 21))  # n = 20: P(B(20, 1/2) <= 5) = 0.0207 <= 0.025 < P(B <= 6) = 0.0577
    assert median_ci(s) == (6, 15)
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few samples for 95%: the whole range
    with pytest.raises(ValueError):
        median_ci([])


def test_the_interval_covers_the_true_median_at_least_95_percent_of_the_time():
    covered = sum(lo <= 100.0 <= hi for lo, hi in (median_ci(samples(100.0, 0.3, 30, seed)) for seed in range(400)))
    assert covered / 400 >= 0.93  # 95% nominal (conservative: at least 95.7% for n = 30), sampling error aside


def test_overlapping_timings_name_no_winner_and_eager_stays():
    raw = samples(100.0, 0.2, 40, 1)
    eager = stats(raw)
    close = stats([0.97 * x for x in reversed(raw)])  # 3% faster by the medians, well inside the noise
    assert close.ci_lo_us is not None and close.ci_lo_us < close.median_us < close.ci_hi_us
    assert not faster(close, eager) and not faster(eager, close)
    d = decide([Contender(7, close, eager)], gain=1.0)
    assert d.winner is None and d.best is not None and d.best.key == 7 and d.status == "no gain (within noise)"


def test_a_clearly_faster_candidate_wins_and_an_overlapping_challenger_does_not_unseat_it():
    eager_a, eager_b = stats(samples(100.0, 0.05, 40, 3)), stats(samples(100.0, 0.05, 40, 4))
    first = stats(samples(50.0, 0.05, 40, 5))  # 2x: intervals far apart
    second = stats(samples(49.0, 0.05, 40, 6))  # 2% faster than the first by the median: within noise
    assert faster(first, eager_a) and not faster(second, first)
    assert second.median_us < first.median_us
    d = decide([Contender(1, first, eager_a), Contender(2, second, eager_b)], gain=1.05)
    assert d.status == "improved" and d.winner is not None and d.winner.key == 1  # the incumbent stays
    lo, hi = speedup_ci(eager_a, first) or (0.0, 0.0)
    assert lo <= eager_a.median_us / first.median_us <= hi and lo > 1.0


def test_a_clearly_slower_candidate_is_no_gain_and_noisy_timings_are_flagged():
    eager, slow = stats(samples(100.0, 0.05, 40, 7)), stats(samples(150.0, 0.05, 40, 8))
    assert decide([Contender(3, slow, eager)]).status == "no gain"
    assert decide([]).status == "no gain" and decide([]).best is None
    spread = stats([295.0] * 5 + [7066.0] * 5)  # node #13 of the issue: p10 295 us, p90 7066 us
    assert noisy(spread) and not noisy(eager)
    assert fmt(2.349, (2.2, 2.51), True) == "2.35x [2.20-2.51] ~" and fmt(None) == "-"
