"""microgpt.stats against textbook values and examples worked by hand."""

from __future__ import annotations

import math

import pytest

from microgpt import stats


@pytest.mark.parametrize(
    "df, quantile",  # a t table's two-sided 95% column; df 1e6: the normal's 1.960
    [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042), (1e6, 1.960)],
)
def test_t_quantiles_match_the_table(df, quantile):
    assert stats.t_quantile(df) == pytest.approx(quantile, abs=5e-4)


def test_t_cdf_in_closed_form():
    # df 1 is Cauchy: 1/2 + atan(t)/pi; df 2: 1/2 + t / (2 sqrt(t^2 + 2))
    for t in (-3.0, -0.5, 0.0, 1.0, 7.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-12)
    assert stats.t_cdf(2.015, 5) == pytest.approx(0.95, abs=1e-4)  # the table's one-sided 5%, df 5
    # I_x(1, 1) = x; I_x(a, 1) = x^a
    assert stats.betainc(1, 1, 0.3) == pytest.approx(0.3)
    assert stats.betainc(3, 1, 0.5) == pytest.approx(1 / 8)


def test_interval_kind_follows_n():
    # n 3: [1, 2, 3], sd 1, t(2) 4.303: 2 +- 4.303 / sqrt(3) = 2 +- 2.4843
    three = stats.interval([1.0, 2.0, 3.0])
    assert (three.kind, three.mean) == (stats.T_CI, 2.0)
    assert three.half_width == pytest.approx(2.4843, 1e-4)
    two = stats.interval([1.0, 3.0])
    assert (two.kind, two.low, two.high, two.half_width) == (stats.MIN_MAX, 1.0, 3.0, 1.0)
    one = stats.interval([1.5])
    assert (one.kind, one.mean, one.half_width) == (stats.NO_INTERVAL, 1.5, 0.0)


def test_paired_t_worked_by_hand():
    """x = 2.0 2.1 2.3, y = 1.9 2.0 2.1: differences 0.1 0.1 0.2, mean 0.1333, sd 0.057735,
    se 0.057735 / sqrt 3 = 0.033333, t = 4.0 on df 2; p = 1 - 4 / sqrt(4^2 + 2) = 0.057191
    (df 2's closed form); CI 0.1333 +- 4.303 * 0.033333 = +-0.14343."""
    r = stats.paired_t([2.0, 2.1, 2.3], [1.9, 2.0, 2.1])
    assert (r.test, r.df) == ("paired t", 2)
    assert r.difference == pytest.approx(0.13333, abs=1e-5)
    assert r.p == pytest.approx(0.057191, abs=1e-6)
    assert (r.high - r.low) / 2 == pytest.approx(0.14343, abs=1e-4)
    # a constant difference: no spread, certain
    assert stats.paired_t([2.0, 2.1], [1.9, 2.0]).p == 0.0
    with pytest.raises(ValueError, match="2 or more pairs"):
        stats.paired_t([1.0], [2.0])


def test_welch_worked_by_hand():
    """x = 0 2, y = 3 5: means 1 and 4, variances 2 and 2, se sqrt(2/2 + 2/2) = 1.41421,
    t = -2.1213; df (1 + 1)^2 / (1/1 + 1/1) = 2; p = 1 - 2.1213 / sqrt(4.5 + 2) = 0.16795;
    CI -3 +- 4.303 * 1.41421 = +-6.0852. Unequal: x = 1 2 3, y = 4 6 8: se^2 1/3 + 4/3,
    df (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = 2.9412."""
    r = stats.welch_t([0.0, 2.0], [3.0, 5.0])
    assert (r.test, r.difference, r.df) == ("Welch t", -3.0, pytest.approx(2.0))
    assert r.p == pytest.approx(0.16795, abs=1e-5)
    assert (r.high - r.low) / 2 == pytest.approx(6.0852, abs=1e-3)
    assert stats.welch_t([1.0, 2.0, 3.0], [4.0, 6.0, 8.0]).df == pytest.approx(2.9412, abs=1e-4)


def test_holm_steps_down_and_keeps_the_order():
    # sorted 0.01, 0.03, 0.04: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> 0.06 (never below the one before)
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0] and stats.holm([]) == []
