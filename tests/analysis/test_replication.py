"""The tuning as the unit of replication: the two-level interval and the variance components against a
hand-written one-way ANOVA, and their coverage on simulated studies (the claims: tests/analysis/test_claims.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from flatlab.analysis.compare.statistics import t_estimate
from flatlab.analysis.replication import across_tunings, paired_across_tunings, variance_components
from flatlab.errors import ConfigError

# 3 tunings x 3 seeds; tuning means 2, 6, 7 and grand mean 5
TABLE = [[1.0, 2.0, 3.0], [4.0, 5.0, 9.0], [6.0, 7.0, 8.0]]


def test_balanced_table_by_hand():
    # SS_between = 3 * ((2-5)^2 + (6-5)^2 + (7-5)^2) = 3 * 14 = 42, on S - 1 = 2 df: MS_between = 21
    # SS_within = (1 + 0 + 1) + (4 + 1 + 9) + (1 + 0 + 1) = 18, on N - S = 6 df:   MS_within = 3
    # sigma2_seed = 3; sigma2_tuning = (21 - 3) / 3 = 6; share = 6 / (6 + 3) = 2/3
    comp = variance_components(TABLE)
    assert comp.ms_between == pytest.approx(21.0)
    assert comp.ms_within == pytest.approx(3.0)
    assert comp.m0 == pytest.approx(3.0)
    assert comp.seed == pytest.approx(3.0)
    assert comp.tuning == pytest.approx(6.0)
    assert comp.share == pytest.approx(2 / 3)

    # the tuning means' variance: ((2-5)^2 + (6-5)^2 + (7-5)^2) / 2 = 7 = MS_between / m
    # interval: 5 -+ t_{0.975, 2} * sqrt(7 / 3) = 5 -+ 4.302652729749462 * 1.5275252316519468
    got = across_tunings(TABLE)
    assert got.tuning_means == (2.0, 6.0, 7.0)
    assert got.seeds == (3, 3, 3)
    assert got.median == 6.0
    assert got.estimate.n == 3 and got.estimate.mean == pytest.approx(5.0)
    assert got.estimate.std == pytest.approx(math.sqrt(7.0))
    half = 4.302652729749462 * math.sqrt(7.0 / 3.0)
    assert half == pytest.approx(6.572410607728428)
    assert (got.estimate.low, got.estimate.high) == pytest.approx((5.0 - half, 5.0 + half))
    # the same interval from the two-level analysis of all 9 values: mean -+ t_{S-1} sqrt(MS_between / (S m))
    assert half == pytest.approx(stats.t.ppf(0.975, 2) * math.sqrt(comp.ms_between / 9))
    assert got.note == ""


def test_unbalanced_table_by_hand():
    # tuning 2 misses a seed: sizes 3, 2, 3 (N = 8), means 2, 6, 7, grand mean 39/8
    table = [[1.0, 2.0, 3.0], {"s0": 4.0, "s1": 8.0, "s2": None}, [6.0, float("nan"), 7.0, 8.0]]
    grand = 39 / 8
    ss_between = 3 * (2 - grand) ** 2 + 2 * (6 - grand) ** 2 + 3 * (7 - grand) ** 2  # 40.875
    ss_within = 2.0 + (4.0 + 4.0) + 2.0  # 12, on 8 - 3 = 5 df
    m0 = (8 - (9 + 4 + 9) / 8) / 2  # 2.625
    tuning = (ss_between / 2 - ss_within / 5) / m0
    comp = variance_components(table)
    assert comp.ms_between == pytest.approx(20.4375) == ss_between / 2
    assert comp.ms_within == pytest.approx(2.4)
    assert comp.m0 == pytest.approx(2.625)
    assert comp.tuning == pytest.approx(tuning) == pytest.approx(18.0375 / 2.625)
    assert comp.share == pytest.approx(tuning / (tuning + 2.4))
    got = across_tunings(table)
    assert got.seeds == (3, 2, 3) and got.tuning_means == (2.0, 6.0, 7.0)


def test_tuning_share_truncated_and_undefined():
    # tuning means all equal: MS_between = 0 < MS_within, so sigma2_tuning = 0 and the share is 0
    comp = variance_components([[1.0, 3.0], [0.0, 4.0], [2.0, 2.0]])
    assert comp.tuning == 0.0 and comp.share == 0.0 and comp.seed == pytest.approx((2 + 8 + 0) / 3)
    # one seed per tuning: no within-tuning variance, so neither sigma2_seed nor the share
    comp = variance_components([[1.0], [2.0], [4.0]])
    assert math.isnan(comp.seed) and math.isnan(comp.tuning) and math.isnan(comp.share)
    assert comp.ms_between == pytest.approx(7 / 3)
    # every value equal: both components 0, share undefined
    assert math.isnan(variance_components([[1.0, 1.0], [1.0, 1.0]]).share)


def test_one_tuning_has_no_interval_and_says_so():
    got = across_tunings([[1.0, 2.0, 4.0]])
    assert got.estimate.n == 1 and got.estimate.mean == pytest.approx(7 / 3)
    assert math.isnan(got.estimate.low) and math.isnan(got.estimate.high)
    assert math.isnan(got.components.tuning) and math.isnan(got.components.share)
    assert got.components.seed == pytest.approx(np.var([1.0, 2.0, 4.0], ddof=1))
    assert "one tuning: no interval" in got.note
    empty = across_tunings([[1.0, 2.0], [None, float("nan")], [3.0, 5.0]])
    assert empty.seeds == (2, 0, 2) and math.isnan(empty.tuning_means[1])
    assert empty.estimate.n == 2 and empty.estimate.mean == pytest.approx(2.75)
    assert "tuning(s) 2 without a finite value" in empty.note  # tunings are numbered 1..S, as flatlab.tuning


def test_coverage_of_the_two_level_interval_and_of_one_tunings_seeds():
    """200+ simulated studies of 3 tunings x 3 seeds, sigma_tuning = 1 and sigma_seed = 0.5 (true share
    0.8). The two-level interval covers the true mean at its level; one tuning's seed-only interval
    covers it with probability 2 F_t2(t_{0.975,2} / lam) - 1 = 0.645, lam = sqrt(1 + m s_t^2 / s_s^2)."""
    rng = np.random.default_rng(20240537)
    studies, s, m, mu, sd_tuning, sd_seed = 400, 3, 3, 10.0, 1.0, 0.5
    two_level = one_tuning = 0
    shares = []
    for _ in range(studies):
        table = mu + rng.normal(0, sd_tuning, (s, 1)) + rng.normal(0, sd_seed, (s, m))
        got = across_tunings(table.tolist())
        two_level += got.estimate.low <= mu <= got.estimate.high
        one = t_estimate(table[0].tolist())  # what a single-tuning study reports: its seeds' interval
        one_tuning += one.low <= mu <= one.high
        shares.append(got.components.share)
    cover, cover_one = two_level / studies, one_tuning / studies
    print(f"coverage over {studies} studies: two-level {cover:.3f}, one tuning's seeds {cover_one:.3f}")
    se = math.sqrt(0.95 * 0.05 / studies)
    assert 0.90 <= cover <= 0.99 and abs(cover - 0.95) < 4 * se
    lam = math.sqrt(1 + m * sd_tuning**2 / sd_seed**2)
    theory = 2 * stats.t.cdf(stats.t.ppf(0.975, m - 1) / lam, m - 1) - 1
    assert theory == pytest.approx(0.6449, abs=1e-4)
    assert abs(cover_one - theory) < 4 * math.sqrt(theory * (1 - theory) / studies)
    assert cover_one < 0.75 < 0.90 <= cover
    assert 0.6 < float(np.nanmedian(shares)) < 0.95


def test_share_estimates_the_true_share_on_many_tunings():
    rng = np.random.default_rng(7)
    table = rng.normal(0, 1.0, (300, 1)) + rng.normal(0, 0.5, (300, 4))
    table[5, 2] = np.nan  # unbalanced
    comp = variance_components(table)  # a numpy (S, m) table
    assert comp.tuning == pytest.approx(1.0, rel=0.15)
    assert comp.seed == pytest.approx(0.25, rel=0.1)
    assert comp.share == pytest.approx(0.8, abs=0.04)


def test_paired_across_tunings_by_hand():
    reference = [{s: 10.0 * s for s in range(3)} for _ in range(3)]
    arm = [{s: reference[k][s] + TABLE[k][s] for s in range(3)} for k in range(3)]
    arm[1]["extra"] = 1.0  # a seed without its reference is not matched
    got = paired_across_tunings(arm, reference, higher_is_better=False)
    assert got.across.tuning_means == (2.0, 6.0, 7.0)  # the differences are TABLE
    assert got.across.components.share == pytest.approx(2 / 3)
    assert got.across.estimate.high == pytest.approx(5.0 + 6.572410607728428)
    for k in range(3):
        a = [arm[k][s] for s in range(3)]
        r = [reference[k][s] for s in range(3)]
        assert got.per_tuning[k].p == pytest.approx(stats.ttest_rel(a, r).pvalue)
        assert got.per_tuning[k].estimate.mean == pytest.approx(np.mean(TABLE[k]))
        assert got.per_tuning[k].ref_better == 3  # lower is better and arm > reference


def test_bad_input_is_named():
    with pytest.raises(ConfigError, match="values must be a non-empty sequence of tunings"):
        across_tunings([])
    with pytest.raises(ConfigError, match=r"values\[1\] must be a sequence"):
        variance_components([[1.0], 2.0])
    with pytest.raises(ConfigError, match=r"confidence must be a number in \(0, 1\)"):
        across_tunings(TABLE, confidence=95)
    with pytest.raises(ConfigError, match="arm and reference must have the same tunings; got 2 and 1"):
        paired_across_tunings([{0: 1.0}, {0: 1.0}], [{0: 1.0}], higher_is_better=True)
    with pytest.raises(ConfigError, match=r"arm\[0\] must be a \{seed: value\}"):
        paired_across_tunings([[1.0, 2.0]], [{0: 1.0}], higher_is_better=True)
