"""The claim tested at the level of the tuning (flatlab.analysis.claims): the t over the per-tuning differences,
TOST, the heterogeneity F-test and Holm across arms against hand computations and scipy, the exact handling of
equal differences, and the rows of the earlier launch whose labels contradicted their own intervals."""

import math

import numpy as np
import pytest
from scipy import stats

from flatlab.analysis.claims import EQUIVALENT, INCONCLUSIVE, SHOWN, claims, heterogeneity, tost, tuning_t_test
from flatlab.analysis.compare.statistics import holm
from flatlab.analysis.design import detectable_effect
from flatlab.errors import ConfigError


def test_the_tuning_level_t_test_is_scipys_one_sample_t_over_the_per_tuning_means():
    d = [-2.0, -3.0, -2.5, -1.0]
    n, mean, sd, (low, high), p = tuning_t_test(d)
    assert n == 4 and mean == pytest.approx(-2.125) and sd == pytest.approx(np.std(d, ddof=1))
    assert p == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue)
    half = stats.t.ppf(0.975, 3) * np.std(d, ddof=1) / 2
    assert (low, high) == pytest.approx((-2.125 - half, -2.125 + half))
    # vectorised over leading axes, NaN left out
    n2, mean2, _, _, p2 = tuning_t_test(np.array([d, [1.0, 2.0, float("nan"), 3.0]]))
    assert list(n2) == [4, 3] and mean2[1] == pytest.approx(2.0)
    assert p2[1] == pytest.approx(stats.ttest_1samp([1.0, 2.0, 3.0], 0.0).pvalue)


def test_equal_differences_are_handled_exactly_not_as_nan():
    n, mean, sd, (low, high), p = tuning_t_test([-1.0, -1.0, -1.0])
    assert (n, mean, sd, low, high, p) == (3, -1.0, 0.0, -1.0, -1.0, 0.0)  # t = -inf: the limit, p = 0
    assert tuning_t_test([0.0, 0.0, 0.0])[4] == 1.0  # 0/0: no evidence of a difference
    assert tost([0.2, 0.2, 0.2], 0.5) == 0.0 and tost([0.7, 0.7, 0.7], 0.5) == 1.0
    assert math.isnan(tuning_t_test([1.0])[4]) and math.isnan(tost([1.0], 0.5))


def test_tost_is_the_larger_of_two_one_sided_t_tests():
    d, m = np.array([0.1, -0.3, 0.2, 0.05, -0.1]), 0.5
    se = d.std(ddof=1) / math.sqrt(5)
    lower = stats.t.sf((d.mean() + m) / se, 4)  # H0: delta <= -m
    upper = stats.t.cdf((d.mean() - m) / se, 4)  # H0: delta >= m
    assert tost(d, m) == pytest.approx(max(lower, upper))
    # passing at alpha is the (1 - 2 alpha) interval inside (-m, m)
    half = stats.t.ppf(0.95, 4) * se
    assert (tost(d, m) < 0.05) == (d.mean() - half > -m and d.mean() + half < m)
    assert math.isnan(tost(d, float("nan"))) and math.isnan(tost(d, -1.0))


def test_heterogeneity_is_the_one_way_anova_of_the_per_seed_differences():
    per_seed = [[-1.0, -1.2, -0.8], [-3.0, -2.9, -3.1], [0.5, 0.4, 0.6]]
    h = heterogeneity(per_seed, estimate=-1.17)
    f, p = stats.f_oneway(*per_seed)
    assert h.f == pytest.approx(f) and h.p == pytest.approx(p) and (h.df_between, h.df_within) == (2, 6)
    ms_between, ms_within = 3 * np.var([-1.0, -3.0, 0.5], ddof=1), 0.02
    assert h.sd == pytest.approx(math.sqrt((ms_between - ms_within) / 3))
    assert h.disagree == 1  # the third tuning is against the negative estimate
    same = heterogeneity([[-1.0, -1.0], [-1.0, -1.0]], estimate=-1.0)
    assert same.p == 1.0 and same.sd == 0.0  # nothing varies: no heterogeneity, not NaN
    exact = heterogeneity([[-1.0, -1.0], [-2.0, -2.0]], estimate=-1.5)
    assert exact.p == 0.0 and exact.f == math.inf  # the seeds agree exactly and the tunings differ
    assert math.isnan(heterogeneity([[1.0], [2.0]], estimate=1.5).p)  # one seed a tuning: no within-tuning noise


def _family(d_by_arm, spread=0.01):
    """Per-seed differences (2 seeds a tuning) whose tuning means are ``d_by_arm[arm][k]``."""
    return {a: [[x - spread, x + spread] for x in d] for a, d in d_by_arm.items()}


def test_holm_runs_across_the_arms_of_one_quantity():
    d = {"sam": [-5.8, -6.2, -4.3], "tsam": [0.8, 14.5, 3.5], "asam": [-1.0, 2.0, -0.5]}
    got = claims("flat/fisher_trace", "sgd", _family(d), higher_is_better=False, margin=1.0)
    raw = [stats.ttest_1samp(v, 0.0).pvalue for v in d.values()]
    assert [c.p for c in got] == pytest.approx(raw)
    assert [c.p_holm for c in got] == pytest.approx(holm(raw))
    sam = got[0]
    assert sam.label == SHOWN and sam.text == "flatter than sgd" and sam.direction == -1
    assert sam.estimate.high < 0  # a directional label's interval lies on its side of 0
    # the detectable effect: the t-test over S = 3 at alpha / 3 arms, power 0.8
    assert sam.detectable == pytest.approx(detectable_effect(np.std(d["sam"], ddof=1), 3, 0.05 / 3))
    assert got[1].label == INCONCLUSIVE and got[1].text.startswith("inconclusive (detects ±")


def test_an_equivalence_needs_the_tost_to_pass_after_holm_and_an_interval_through_zero():
    d = {"sam": [0.001, -0.002, 0.0005, 0.0015, -0.001, 0.0], "ire": [0.001, 0.002, 0.0015, 0.003, 0.002, 0.0025]}
    got = {c.arm: c for c in claims("test/accuracy", "sgd", _family(d, 0.0005), higher_is_better=True, margin=0.01)}
    assert got["sam"].label == EQUIVALENT and got["sam"].text == "no difference larger than ±0.01"
    assert got["sam"].p_equivalence_holm == pytest.approx(holm([got["sam"].p_equivalence, got["ire"].p_equivalence])[0])
    assert got["ire"].label == SHOWN and got["ire"].text == "more accurate than sgd"  # shown beats equivalent


@pytest.mark.parametrize(
    "quantity, d, higher, text",
    [
        # docs/results.md's SAM test/accuracy, labelled "depends on the tuning (1 of 3 agree)" beside [-0.012, -0.004]
        ("test/accuracy", [-0.006275, -0.0095, -0.0073], True, "less accurate than sgd"),
        # AdmIRE's epochs to the target, "no difference found" beside [-1.28, -0.56]: two tunings' seeds all -1
        ("train/epochs_to_target", [-1.0, -1.0, -0.75], False, "faster to the target than sgd"),
        # SAM-IRE test/accuracy, "no difference found" beside [+0.0005, +0.0071]
        ("test/accuracy", [0.00535, 0.003, 0.003075], True, "more accurate than sgd"),
    ],
)
def test_the_rows_that_contradicted_their_intervals_now_agree_with_them(quantity, d, higher, text):
    per_seed = {"arm": [[x] * 4 for x in d]}  # every seed of a tuning at its mean: the old per-tuning t was NaN
    (c,) = claims(quantity, "sgd", per_seed, higher_is_better=higher, margin=0.01 if higher else 0.5)
    assert c.label == SHOWN and c.text == text
    assert c.estimate.low * c.estimate.high > 0  # the interval excludes 0, on the claimed side
    assert math.isfinite(c.p) and math.isfinite(c.heterogeneity.p)


def test_an_interval_that_excludes_zero_never_reads_as_no_difference():
    """SAM-IRE's row in a family of 7 arms: after Holm it is not shown, and although its TOST passes,
    its interval excludes 0, so the label is inconclusive, not an equivalence (margin 2 points)."""
    d = {"sam_ire": [0.00535, 0.003, 0.003075]}
    d.update({f"null{i}": [0.002, -0.003, 0.0015 * (-1) ** i] for i in range(6)})
    got = {c.arm: c for c in claims("test/accuracy", "sgd", _family(d, 0.0), higher_is_better=True, margin=0.02)}
    c = got["sam_ire"]
    assert c.p < 0.05 < c.p_holm and c.estimate.low > 0
    assert c.p_equivalence_holm < 0.05 and c.label == INCONCLUSIVE
    rng = np.random.default_rng(3)
    for _ in range(60):  # no label contradicts its interval, whatever the data
        fam = {a: [[rng.normal(0.002, 0.004)] * 2 for _ in range(4)] for a in "abc"}
        for c in claims("test/accuracy", "sgd", fam, higher_is_better=True, margin=0.01):
            if c.label == EQUIVALENT:
                assert c.estimate.low <= 0 <= c.estimate.high
            if c.label == SHOWN:
                assert c.estimate.low > 0 or c.estimate.high < 0


def test_bad_alpha_and_margins_are_named():
    with pytest.raises(ConfigError, match=r"alpha must be a number in \(0, 1\)"):
        claims("q", "sgd", {"a": [[1.0]]}, higher_is_better=True, alpha=2)
    with pytest.raises(ConfigError, match="the equivalence margin of flat/x must be a positive number; got -1"):
        claims("flat/x", "sgd", {"a": [[1.0]]}, higher_is_better=False, margin=-1)
