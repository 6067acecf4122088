"""Tuning curves of a pool of i.i.d. trials against brute-force enumeration of every subset, exact
fractions, and opda called directly."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from opda.nonparametric import EmpiricalDistribution

from flatlab.analysis.tuning_curves import (
    chosen_trial,
    expected_best,
    median_tuning_curve,
    rank_weights,
    selection_probabilities,
    win_probability,
)
from flatlab.errors import ConfigError

POOL7 = [0.71, 0.64, 0.80, 0.64, 0.55, 0.77, 0.69]  # a tie at 0.64


def brute_expected_best(values, n, higher):
    best = max if higher else min
    subsets = list(combinations(values, n))
    return sum(best(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("higher", [True, False])
def test_expected_best_against_every_subset_of_a_7_trial_pool(higher):
    got = expected_best(POOL7, higher_is_better=higher)
    assert got.shape == (7,)
    for n in range(1, 8):
        assert got[n - 1] == pytest.approx(brute_expected_best(POOL7, n, higher), abs=1e-12)
    assert got[0] == pytest.approx(np.mean(POOL7))
    assert got[-1] == (0.80 if higher else 0.55)
    diffs = np.diff(got)
    assert np.all(diffs >= -1e-12) if higher else np.all(diffs <= 1e-12)
    # opda's u-statistic tuning curve is the same estimator
    opda = EmpiricalDistribution(POOL7).u_tuning_curve(np.arange(1, 8), minimize=not higher)
    np.testing.assert_allclose(got, opda, atol=1e-12)


def test_expected_best_is_exact_and_finite_for_large_pools():
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 1000, 400).tolist()  # integers: the exact sum is a fraction
    got = expected_best(pool)
    ordered = sorted(pool)
    for n in (1, 2, 37, 200, 399, 400):
        exact = sum(Fraction(v * math.comb(i - 1, n - 1), math.comb(400, n)) for i, v in enumerate(ordered, 1))
        assert got[n - 1] == pytest.approx(float(exact), rel=1e-11)
    big = rng.normal(size=1500)
    got = expected_best(big, higher_is_better=False)
    assert np.all(np.isfinite(got)) and got[0] == pytest.approx(big.mean()) and got[-1] == pytest.approx(big.min())
    np.testing.assert_allclose(rank_weights(1500, [1, 750, 1500]).sum(axis=1), 1.0, atol=1e-12)


def brute_selection(validation, n, higher):
    """P(trial t picked) over every subset of n; a tie among a subset's best split equally."""
    size = len(validation)
    subsets = list(combinations(range(size), n))
    probs = [Fraction(0)] * size
    for subset in subsets:
        best = (max if higher else min)(validation[t] for t in subset)
        tied = [t for t in subset if validation[t] == best]
        for t in tied:
            probs[t] += Fraction(1, len(subsets) * len(tied))
    return probs


def exact_quantile(values, probs, level):
    cumulative = Fraction(0)
    for v, p in sorted(zip(values, probs)):
        cumulative += p
        if cumulative >= level:
            return v


VAL_A = [0.60, 0.75, 0.75, 0.50, 0.70]  # a tie at the top
TEST_A = [0.58, 0.70, 0.74, 0.52, 0.68]
VAL_B = [0.72, 0.65, 0.74, 0.55]
TEST_B = [0.70, 0.68, 0.69, 0.56]


@pytest.mark.parametrize("higher", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_chosen_trial_against_every_subset(n, higher):
    exact = brute_selection(VAL_A, n, higher)
    got = chosen_trial(VAL_A, TEST_A, n, validation_higher_is_better=higher, confidence=0.9)
    np.testing.assert_allclose(got.probabilities, [float(p) for p in exact], atol=1e-12)
    np.testing.assert_allclose(selection_probabilities(VAL_A, n, higher_is_better=higher), got.probabilities)
    mean = sum(p * Fraction(str(v)) for p, v in zip(exact, TEST_A))
    assert got.mean == pytest.approx(float(mean), abs=1e-12)
    var = sum(p * (Fraction(str(v)) - mean) ** 2 for p, v in zip(exact, TEST_A))
    assert got.std == pytest.approx(math.sqrt(var), abs=1e-12)
    assert got.median == exact_quantile(TEST_A, exact, Fraction(1, 2))
    assert got.low == exact_quantile(TEST_A, exact, Fraction(1, 20))
    assert got.high == exact_quantile(TEST_A, exact, Fraction(19, 20))
    assert got.n == n and got.values == tuple(TEST_A)


def test_chosen_trial_by_hand():
    # n = 2 of 5, higher is better: the tied best pair (trials 1, 2) holds rank weights
    # C(4,1)/C(5,2) = 4/10 and C(3,1)/10 = 3/10, shared: 7/20 each; then 0.70 (2/10), 0.60 (1/10), 0.50 (0)
    got = chosen_trial(VAL_A, TEST_A, 2)
    np.testing.assert_allclose(got.probabilities, [0.1, 0.35, 0.35, 0.0, 0.2])
    assert got.mean == pytest.approx(0.1 * 0.58 + 0.35 * 0.70 + 0.35 * 0.74 + 0.2 * 0.68)
    # sorted test values 0.58 (0.1), 0.68 (0.2), 0.70 (0.35), 0.74 (0.35): cumulative 0.1, 0.3, 0.65, 1
    assert (got.low, got.median, got.high) == (0.58, 0.70, 0.74)
    # n = 1: every trial equally likely; n = N: the tied best two only
    np.testing.assert_allclose(chosen_trial(VAL_A, TEST_A, 1).probabilities, [0.2] * 5)
    np.testing.assert_allclose(chosen_trial(VAL_A, TEST_A, 5).probabilities, [0, 0.5, 0.5, 0, 0])


def brute_win(n_a, n_b, higher_val, higher_q):
    """P(A's chosen test value beats B's), every pair of subsets, ties in validation and in the
    quantity split equally."""
    total, count = Fraction(0), 0
    for sa in combinations(range(len(VAL_A)), n_a):
        for sb in combinations(range(len(VAL_B)), n_b):
            count += 1
            pick = max if higher_val else min
            best_a = pick(VAL_A[t] for t in sa)
            best_b = pick(VAL_B[t] for t in sb)
            tied_a = [t for t in sa if VAL_A[t] == best_a]
            tied_b = [t for t in sb if VAL_B[t] == best_b]
            for ta in tied_a:
                for tb in tied_b:
                    x, y = TEST_A[ta], TEST_B[tb]
                    score = Fraction(1, 2) if x == y else Fraction(int((x > y) == higher_q))
                    total += score / (len(tied_a) * len(tied_b))
    return total / count


@pytest.mark.parametrize("n_a, n_b", [(1, 1), (2, 2), (3, 3), (4, 4), (3, 2), (5, 1)])
@pytest.mark.parametrize("higher_val, higher_q", [(True, True), (True, False), (False, True)])
def test_win_probability_against_every_pair_of_subsets(n_a, n_b, higher_val, higher_q):
    a = chosen_trial(VAL_A, TEST_A, n_a, validation_higher_is_better=higher_val)
    b = chosen_trial(VAL_B, TEST_B, n_b, validation_higher_is_better=higher_val)
    got = win_probability(a, b, higher_is_better=higher_q)
    assert got == pytest.approx(float(brute_win(n_a, n_b, higher_val, higher_q)), abs=1e-12)
    assert got + win_probability(b, a, higher_is_better=higher_q) == pytest.approx(1.0)


def test_win_probability_counts_ties_half():
    a = chosen_trial([1.0, 2.0], [5.0, 7.0], 1)
    b = chosen_trial([3.0], [7.0], 1)
    # A's trial: 5 or 7, each 1/2; B's: 7. Higher is better: 0 + 1/2 * 1/2 = 1/4
    assert win_probability(a, b, higher_is_better=True) == pytest.approx(0.25)
    assert win_probability(a, b, higher_is_better=False) == pytest.approx(0.75)


POOL9 = [0.61, 0.72, 0.55, 0.80, 0.67, 0.74, 0.58, 0.70, 0.64]


@pytest.mark.parametrize("higher", [True, False])
def test_median_tuning_curve_sanity_and_agreement_with_opda(higher):
    ns = list(range(1, 10)) + [20, 100]
    got = median_tuning_curve(
        POOL9, higher_is_better=higher, support=(0.0, 1.0), confidence=0.8, ns=ns, method="ld_equal_tailed", seed=5
    )
    assert got.ns == tuple(ns) and got.confidence == 0.8 and got.method == "ld_equal_tailed"
    median, lower, upper = map(np.asarray, (got.median, got.lower, got.upper))
    assert median[0] == np.median(POOL9) == 0.67  # n = 1: the pool's median (odd pool)
    assert np.all(lower <= median) and np.all(median <= upper)
    step = np.diff(median), np.diff(lower), np.diff(upper)
    assert all(np.all(s >= 0) if higher else np.all(s <= 0) for s in step)
    assert median[-1] == (0.80 if higher else 0.55)  # the pool's best, for n large
    assert (upper[-1] if higher else lower[-1]) == (1.0 if higher else 0.0)  # the support's end
    lo_cdf, point, hi_cdf = EmpiricalDistribution.confidence_bands(
        POOL9, 0.8, 0.0, 1.0, generator=np.random.default_rng(5), method="ld_equal_tailed", n_jobs=1
    )
    np.testing.assert_array_equal(median, point.quantile_tuning_curve(ns, minimize=not higher))
    np.testing.assert_array_equal(lower, hi_cdf.quantile_tuning_curve(ns, minimize=not higher))
    np.testing.assert_array_equal(upper, lo_cdf.quantile_tuning_curve(ns, minimize=not higher))


def test_median_tuning_curve_defaults_unbounded_and_even_pool():
    got = median_tuning_curve(POOL9[:8])  # highest-density band, n = 1..8, support unbounded
    assert got.ns == tuple(range(1, 9)) and got.method == "ld_highest_density"
    assert got.median[0] == sorted(POOL9[:8])[3] == 0.67  # even pool: opda's lower median (not 0.685)
    assert got.upper[-1] == math.inf and math.isfinite(got.lower[-1])
    assert all(lo <= m <= up for lo, m, up in zip(got.lower, got.median, got.upper))
    # the band is calibrated by simulation: the seed fixes it
    assert median_tuning_curve(POOL9[:8]) == got


def test_bad_pools_and_budgets_are_named():
    with pytest.raises(ConfigError, match=r"n must be an integer in 1\.\.5 \(the pool's trials\); got 6"):
        chosen_trial(VAL_A, TEST_A, 6)
    with pytest.raises(ConfigError, match=r"n must be an integer in 1\.\.5 .* got 0"):
        selection_probabilities(VAL_A, 0)
    with pytest.raises(ConfigError, match="values must be a non-empty 1-D sequence"):
        expected_best([])
    with pytest.raises(ConfigError, match="validation must be a non-empty 1-D sequence"):
        chosen_trial([], [], 1)
    with pytest.raises(ConfigError, match=r"quantity must be finite; trial\(s\) 1 are not"):
        chosen_trial(VAL_A, [0.5, float("nan"), 0.5, 0.5, 0.5], 1)
    with pytest.raises(ConfigError, match="one value per trial; got 5 and 4"):
        chosen_trial(VAL_A, TEST_B, 2)
    with pytest.raises(ConfigError, match="support must satisfy low < high and hold every value"):
        median_tuning_curve(POOL9, support=(0.6, 1.0))
    with pytest.raises(ConfigError, match="support must be a pair"):
        median_tuning_curve(POOL9, support=1.0)
    with pytest.raises(ConfigError, match="method must be one of ld_highest_density, ld_equal_tailed, ks, dkw"):
        median_tuning_curve(POOL9, method="bootstrap")
    with pytest.raises(ConfigError, match="ns must be positive integers"):
        median_tuning_curve(POOL9, ns=[0, 1])
    with pytest.raises(ConfigError, match=r"confidence must be a number in \(0, 1\)"):
        chosen_trial(VAL_A, TEST_A, 1, confidence=1.0)
