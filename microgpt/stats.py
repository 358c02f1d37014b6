"""How sure a difference between runs is: Student's t, intervals of a mean, the paired and Welch
t-tests, Holm's correction. Pure Python (math only), for the handful of seeds a sweep has.

    interval([1.93, 1.95, 1.94])    # the mean and its t-based 95% confidence interval
    paired_t(later, earlier)        # the mean of per-seed differences, its 95% CI, two-sided p
    holm([p1, p2, p3])              # each p corrected for the 3 comparisons made
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
T_CI, MIN_MAX, NO_INTERVAL = "t 95% CI", "min-max", "none"  # Interval.kind: n >= 3, 2, 1


def betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function (its continued fraction, evaluated by
    Lentz's method as in Numerical Recipes 6.4; the symmetry I_x(a, b) = 1 - I_(1-x)(b, a) where
    that converges faster)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(log_front + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    f = d = 1 / (d if abs(d) > tiny else tiny)
    for m in range(1, 500):
        # the even step, then the odd one
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            c = 1 + num / c
            d = 1 / (d if abs(d) > tiny else tiny)
            c = c if abs(c) > tiny else tiny
            f *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return f


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom (df > 0, not necessarily whole)."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1 - tail if t > 0 else tail


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|)."""
    return 1.0 if t == 0 else min(1.0, 2 * t_cdf(-abs(t), df))


def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided quantile: t with P(|T| <= t) = confidence (12.706 for df 1 at 95%)."""
    alpha, low, high = 1 - confidence, 0.0, 1.0
    while two_sided_p(high, df) > alpha:
        low, high = high, 2 * high
    for _ in range(200):  # bisection: p falls as t grows
        mid = (low + high) / 2
        low, high = (mid, high) if two_sided_p(mid, df) > alpha else (low, mid)
        if high - low < 1e-12 * high:
            break
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """A mean and how far it may be off: `kind` T_CI (n >= 3), MIN_MAX (n = 2) or NO_INTERVAL
    (n = 1; low = high = the value)."""

    mean: float
    low: float
    high: float
    kind: str
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2  # both kinds are symmetric about the mean


def interval(values: list[float]) -> Interval:
    """The mean of `values` (n >= 1) and its interval: the t-based 95% confidence interval of the
    mean for n >= 3, the min-max range for n = 2 (a t interval on 1 df is 12.7 sd wide: no
    guide), none for n = 1."""
    n, mean = len(values), statistics.fmean(values)
    if n == 1:
        return Interval(mean, mean, mean, NO_INTERVAL, 1)
    if n == 2:
        return Interval(mean, min(values), max(values), MIN_MAX, 2)
    half = t_quantile(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, T_CI, n)


@dataclass(frozen=True)
class TTest:
    """A difference of means, its 95% confidence interval, and the two-sided p that it is 0."""

    test: str  # "paired t" or "Welch t"
    difference: float
    low: float
    high: float
    df: float
    p: float


def _t_test(test: str, difference: float, se: float, df: float) -> TTest:
    if se == 0:  # no spread at all: any difference is certain, none is none
        return TTest(test, difference, difference, difference, df, float(difference == 0))
    half = t_quantile(df) * se
    p = two_sided_p(difference / se, df)
    return TTest(test, difference, difference - half, difference + half, df, p)


def paired_t(x: list[float], y: list[float]) -> TTest:
    """The mean of x[i] - y[i] (pairs: the same seed), tested against 0 on n - 1 df (n >= 2)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"a paired t-test needs 2 or more pairs, not {len(x)} and {len(y)} values")
    diffs = [a - b for a, b in zip(x, y)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return _t_test("paired t", statistics.fmean(diffs), se, len(diffs) - 1)


def welch_t(x: list[float], y: list[float]) -> TTest:
    """mean(x) - mean(y) for unpaired samples of unequal variance (2 or more values each), on the
    Welch-Satterthwaite df."""
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"Welch's t-test needs 2 or more values each, not {len(x)} and {len(y)}")
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    se = math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1)) if se else 1.0
    return _t_test("Welch t", statistics.fmean(x) - statistics.fmean(y), se, df)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down correction for len(p_values) comparisons: each p as corrected (compare it
    with alpha as if it were the only one), in the order given."""
    m, corrected, running = len(p_values), [0.0] * len(p_values), 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        corrected[i] = running
    return corrected
