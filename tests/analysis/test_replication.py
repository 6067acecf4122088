"""The tuning as the unit of replication: the two-level interval and the variance components against a
hand-written one-way ANOVA, their coverage on simulated studies, and the verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from flatlab.analysis.compare.statistics import holm, t_estimate
from flatlab.analysis.replication import across_tunings, paired_across_tunings, variance_components, verdict
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
    assert "tuning(s) 1 without a finite value" in empty.note


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


def _arms(offsets, noise=((0.1, -0.1, 0.0), (0.05, 0.0, -0.05), (0.0, 0.1, -0.1))):
    """Per tuning {seed: value} of a reference and an arm = reference + offsets[k] + noise."""
    reference, arm = [], []
    for k, offset in enumerate(offsets):
        ref = {seed: 50.0 + 3 * k + seed for seed in range(3)}
        reference.append(ref)
        arm.append({seed: ref[seed] + offset + noise[k][seed] for seed in range(3)})
    return arm, reference


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


def test_verdicts():
    flip = verdict([0.01, 0.02, 0.03], [-1.0, -2.0, 0.5], across=-0.83)
    assert (flip.kind, flip.agree, flip.tunings, flip.direction) == ("depends", 2, 3, -1)
    assert flip.text == "depends on the tuning (2 of 3 agree; 1 against)"  # the third significant the other way
    holds = verdict([0.01, 0.001, 0.049], [2.0, 1.0, 3.0], across=2.0)
    assert (holds.kind, holds.agree, holds.text) == ("holds", 3, "holds in every tuning")
    none = verdict([0.2, 0.06, float("nan")], [1.0, -1.0, 2.0], across=0.7)
    assert (none.kind, none.agree, none.text) == ("none", 0, "no difference found")
    one_weak = verdict([0.01, 0.01, 0.4], [1.0, 1.0, 1.0], across=1.0)
    assert (one_weak.kind, one_weak.text) == ("depends", "depends on the tuning (2 of 3 agree)")
    against = verdict([0.01, 0.3, 0.4], [-1.0, 0.5, 2.0], across=0.5)  # the only significant tuning opposes the mean
    assert (against.kind, against.agree, against.text) == (
        "depends",
        0,
        "depends on the tuning (0 of 3 agree; 1 against)",
    )
    at_alpha = verdict([0.05, 0.01], [1.0, 1.0], across=1.0, alpha=0.05)  # p < alpha, not <=
    assert at_alpha.kind == "depends" and at_alpha.agree == 1
    single = verdict([0.01], [1.0], across=1.0)
    assert single.kind == "holds" and "only tuning" in single.text
    nan_across = verdict([0.01, 0.01, 0.01], [-1.0, -1.0, 1.0], across=float("nan"))
    assert nan_across.direction == -1 and nan_across.agree == 2


def test_verdict_from_a_constructed_multi_tuning_comparison():
    """Two arms against one reference over 3 tunings; Holm within each tuning's family of 2 arms."""
    arms = {
        "steady": _arms([-2.0, -1.5, -2.5]),  # lower in every tuning
        "flips": _arms([-2.0, -1.5, +2.0]),  # tuning 3 reverses the sign
    }
    paired = {name: paired_across_tunings(a, r, higher_is_better=False) for name, (a, r) in arms.items()}
    adjusted = {name: [] for name in arms}
    for k in range(3):
        family = holm([paired[name].per_tuning[k].p for name in arms])
        for name, p in zip(arms, family):
            adjusted[name].append(p)
    got = {
        name: verdict(
            adjusted[name],
            [t.estimate.mean for t in paired[name].per_tuning],
            across=paired[name].across.estimate.mean,
        )
        for name in arms
    }
    assert all(p < 0.05 for p in adjusted["steady"]) and all(p < 0.05 for p in adjusted["flips"])
    assert got["steady"].text == "holds in every tuning" and got["steady"].direction == -1
    assert got["flips"].text == "depends on the tuning (2 of 3 agree; 1 against)"
    assert paired["flips"].across.components.share > 0.99  # the differences vary by tuning, barely by seed


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
    with pytest.raises(ConfigError, match="one value per tuning .* got 2 and 1"):
        verdict([0.1, 0.2], [1.0], across=1.0)
    with pytest.raises(ConfigError, match=r"alpha must be a number in \(0, 1\)"):
        verdict([0.1], [1.0], across=1.0, alpha=5)
