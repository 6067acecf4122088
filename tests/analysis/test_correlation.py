"""Kendall's tau and the granulated coefficient (Jiang et al. 2020) against scipy, hand computations on
a constructed grid; the cluster bootstrap's resampled tau against scipy on the expanded resample, its
distribution by hand on a small clustered case, its width against the null variance of tau, and its error
rate against the naive p-value's on simulated clustered models."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from flatlab.analysis.correlation import bootstrap_p, granulated_tau, kendall_tau, resample_counts, weighted_tau
from flatlab.errors import ConfigError

MEASURE = [3.1, 1.2, None, 4.4, 2.0, 2.0, 5.3, float("nan"), 0.7, 3.9]
TARGET = [0.30, 0.10, 0.50, 0.35, 0.22, 0.18, 0.40, 0.20, 0.10, 0.28]


def test_tau_against_scipy_with_ties_and_missing_values():
    keep = [i for i, m in enumerate(MEASURE) if m is not None and not math.isnan(m)]
    x = [MEASURE[i] for i in keep]
    y = [TARGET[i] for i in keep]
    expected = stats.kendalltau(x, y, variant="b")
    got = kendall_tau(MEASURE, TARGET, n_resamples=200, seed=1)
    assert got.n == 8 and got.reason == "" and got.units == ()
    assert got.tau == pytest.approx(expected.statistic)
    # tau-b by hand. By measure: 0.7, 1.2, 2.0, 2.0, 3.1, 3.9, 4.4, 5.3 with targets
    # 0.10, 0.10, 0.22, 0.18, 0.30, 0.28, 0.35, 0.40: 28 pairs, 1 tied in the measure (2.0), 1 tied in the
    # target (0.10), 1 discordant (3.1 -> 0.30 vs 3.9 -> 0.28), so 25 concordant: (25 - 1) / sqrt(27 * 27)
    assert got.tau == pytest.approx(24 / 27)
    assert got.low <= got.tau <= got.high and got.resamples <= 200 and 0 < got.p < 0.05


def test_resampled_tau_is_scipys_tau_of_the_expanded_resample():
    rng = np.random.default_rng(11)
    x = np.round(rng.normal(size=18), 1)  # ties in the measure
    y = np.round(x + rng.normal(size=18), 0)  # and many in the target
    paths = [(k // 6, k // 2) for k in range(18)]  # 3 tunings of 3 configurations of 2 models
    counts = resample_counts(paths, 50, rng)
    taus = weighted_tau(x, y, counts)
    for row, tau in zip(counts, taus):
        expanded = np.repeat(np.arange(18), row)
        assert tau == pytest.approx(stats.kendalltau(x[expanded], y[expanded], variant="b").statistic, abs=1e-12)
    assert weighted_tau(x, y, np.ones((1, 18)))[0] == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
    # every resample draws 3 tunings; each drawn tuning draws 3 configurations and each of those 2 models,
    # so every resample has 18 models, and a configuration's models are drawn only with it
    assert (counts.sum(axis=1) == 18).all()
    got = kendall_tau(x, y, clusters=paths, n_resamples=300, confidence=0.9, seed=4)
    assert got.units == (3, 9) and got == kendall_tau(x, y, clusters=paths, n_resamples=300, confidence=0.9, seed=4)
    assert kendall_tau(x, y, clusters=paths, n_resamples=300, confidence=0.9, seed=5).low != got.low


def test_cluster_bootstrap_distribution_by_hand():
    # 3 tunings, each one configuration whose 2 seeds gave the same values: the seeds add no information, and
    # a resample's tau depends only on how often it drew each tuning, (M1, M2, M3) ~ Multinomial(3, 1/3)
    x = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    y = [1.0, 1.0, 3.0, 3.0, 2.0, 2.0]
    paths = [(1, "a"), (1, "a"), (2, "b"), (2, "b"), (3, "c"), (3, "c")]
    # tau-b of the data: 12 pairs untied in both (the 3 within a tuning are tied in both); between tunings
    # 1-2 and 1-3 concordant (4 pairs each), 2-3 discordant (4 pairs): (8 - 4) / 12
    got = kendall_tau(x, y, clusters=paths, n_resamples=4000, confidence=0.9, seed=0)
    assert got.tau == pytest.approx(1 / 3) and got.units == (3, 3)
    # of the 27 equally likely tuning draws: 3 draw one tuning three times (no tau); 18 draw one tuning twice
    # and another once, tau = the sign of that pair: +1 for {1, 2} and {1, 3} (12 draws), -1 for {2, 3} (6);
    # 6 draw each tuning once, tau = 1/3. So P(no tau) = 1/9 and, among the rest, P(+1) = 1/2,
    # P(-1) = 1/4, P(1/3) = 1/4: the 90% interval is [-1, +1], and p = 2 P(tau* <= 0) = 1/2
    assert got.resamples / 4000 == pytest.approx(8 / 9, abs=4 * math.sqrt(8 / 81 / 4000))
    assert (got.low, got.high) == (-1.0, 1.0)
    assert got.p == pytest.approx(0.5, abs=4 * 2 * math.sqrt(3 / 16 / got.resamples))
    # the naive bootstrap over the 6 models as independent almost never draws a single tuning (3 / 3**6)
    naive = kendall_tau(x, y, n_resamples=4000, confidence=0.9, seed=0)
    assert naive.resamples / 4000 > 0.99 and naive.p < got.p


def test_bootstrap_p_is_where_the_percentile_interval_excludes_zero():
    # 199 replicates: 4 at or below 0 -> p = 2 (1 + 4) / 200 = 0.05; no replicate on one side -> 2 / 200
    taus = np.r_[np.full(4, -0.1), np.full(195, 0.3)]
    assert bootstrap_p(taus) == pytest.approx(0.05)
    assert bootstrap_p(np.full(199, 0.2)) == pytest.approx(0.01)
    assert bootstrap_p(np.r_[np.zeros(10), np.full(189, 0.2)]) == pytest.approx(2 * 11 / 200)  # ties at 0 count
    assert bootstrap_p(np.linspace(-1, 1, 199)) == 1.0 and math.isnan(bootstrap_p(np.array([])))


def test_cluster_bootstrap_holds_its_error_rate_where_the_naive_p_does_not():
    # 5 tunings x 4 configurations x 3 seeds; measure and target are independent at every level (tau = 0),
    # each with a tuning and a configuration effect 3x the seed noise. scipy's p-value treats the 60 models
    # as independent and rejects far more often than 5%; the cluster bootstrap's stays at or below it
    rng = np.random.default_rng(2024)
    S, C, M, runs = 5, 4, 3, 200
    paths = [(k, c) for k in range(S) for c in range(C) for _ in range(M)]

    def draw():
        tuning = rng.normal(0, 3, (S, 1, 1))
        config = rng.normal(0, 3, (S, C, 1))
        return (tuning + config + rng.normal(size=(S, C, M))).ravel()

    naive = cluster = 0
    for run in range(runs):
        x, y = draw(), draw()
        naive += stats.kendalltau(x, y).pvalue < 0.05
        cluster += kendall_tau(x, y, clusters=paths, n_resamples=200, seed=run).p < 0.05
    assert naive / runs > 0.25
    assert cluster / runs <= 0.05


def test_bootstrap_width_matches_the_variance_of_tau_under_independence():
    # Var(tau) = 2 (2n + 5) / (9 n (n - 1)) for independent continuous variables (Kendall 1938)
    rng = np.random.default_rng(2)
    n = 60
    got = kendall_tau(rng.normal(size=n), rng.normal(size=n), n_resamples=1000, seed=0)
    width = 2 * stats.norm.ppf(0.975) * math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))
    assert width == pytest.approx(0.347, abs=1e-3)
    assert got.high - got.low == pytest.approx(width, rel=0.25)


def test_perfect_order_and_degenerate_resamples():
    got = kendall_tau([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60], n_resamples=200)
    assert got.tau == pytest.approx(1.0) and (got.low, got.high) == pytest.approx((1.0, 1.0))
    assert got.p == pytest.approx(2 / 201)  # no replicate at or below 0: the smallest p of 200 resamples
    # 3 models: a resample drawing one model 3 times has no tau (probability 3 / 27) and is dropped
    small = kendall_tau([1.0, 2.0, 3.0], [3.0, 1.0, 2.0], n_resamples=400, seed=3)
    assert small.tau == pytest.approx(-1 / 3)
    assert 0.8 * 400 < small.resamples < 400 and math.isfinite(small.low) and math.isfinite(small.high)


def test_undefined_tau_is_nan_with_a_reason():
    constant = kendall_tau([2.0, 2.0, 2.0, 2.0], [0.1, 0.2, 0.3, 0.4])
    assert math.isnan(constant.tau) and math.isnan(constant.low) and constant.n == 4
    assert constant.reason == "the measure is constant over the models"
    assert kendall_tau([1.0, 2.0], [0.3, 0.3]).reason == "the target is constant over the models"
    one = kendall_tau([1.0, None, 3.0], [0.5, 0.2, float("nan")])
    assert one.n == 1 and math.isnan(one.p) and one.reason == "fewer than 2 models with both values (1)"
    assert kendall_tau([], []).reason == "fewer than 2 models with both values (0)"


# a 2 x 3 grid: learning rate x batch size, one model each
GRID = [
    ({"lr": 0.1, "bs": 32}, 1.0, 1.0),
    ({"lr": 0.1, "bs": 64}, 2.0, 3.0),
    ({"lr": 0.1, "bs": 128}, 3.0, 2.0),
    ({"lr": 0.01, "bs": 32}, 4.0, 6.0),
    ({"lr": 0.01, "bs": 64}, 5.0, 5.0),
    ({"lr": 0.01, "bs": 128}, 6.0, 4.0),
]


def test_granulated_tau_on_a_grid_by_hand():
    # axis lr, groups by bs (2 models each, both concordant):
    #   bs=32: (1, 1), (4, 6) -> +1;  bs=64: (2, 3), (5, 5) -> +1;  bs=128: (3, 2), (6, 4) -> +1;  psi_lr = 1
    # axis bs, groups by lr (3 models, 3 pairs each):
    #   lr=0.1: (1, 1), (2, 3), (3, 2): pairs 12 concordant, 13 concordant, 23 discordant -> (2 - 1) / 3 = 1/3
    #   lr=0.01: (4, 6), (5, 5), (6, 4): all discordant -> -1;               psi_bs = (1/3 - 1) / 2 = -1/3
    # Psi = (1 - 1/3) / 2 = 1/3
    axes, measure, target = zip(*GRID)
    got = granulated_tau(axes, measure, target)
    assert got.per_axis == pytest.approx({"lr": 1.0, "bs": -1 / 3})
    assert got.psi == pytest.approx(1 / 3)
    assert got.groups == {"lr": 3, "bs": 2} and got.models == 6
    assert got.skipped == () and got.reason == ""
    # each group's tau is scipy's
    assert stats.kendalltau([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]).statistic == pytest.approx(1 / 3)
    # the plain tau over all six models differs: by measure the targets are 1, 3, 2, 6, 5, 4, with 4
    # discordant pairs (3-2, 6-5, 6-4, 5-4) of 15: (11 - 4) / 15
    assert kendall_tau(measure, target, n_resamples=50).tau == pytest.approx(7 / 15)


def test_granulated_tau_skips_groups_and_says_why():
    extra = [
        ({"lr": 0.5, "bs": 32}, 7.0, 7.0),  # lr = 0.5 has one batch size: its bs group has 1 model
        ({"lr": 0.001, "bs": 64}, 2.5, None),  # target missing: dropped
        ({"lr": 0.001, "bs": 32}, 8.0, 9.0),  # alone in lr = 0.001 once the missing one is dropped
    ]
    axes, measure, target = zip(*(GRID + extra))
    got = granulated_tau(axes, measure, target)
    # lr groups: bs=32 now (1,1), (4,6), (7,7), (8,9): all concordant -> 1; bs=64 and bs=128 as before
    assert got.per_axis == pytest.approx({"lr": 1.0, "bs": -1 / 3}) and got.models == 8
    assert [(s.axis, s.fixed, s.models, s.reason) for s in got.skipped] == [
        ("bs", (("lr", 0.5),), 1, "only one value of bs in the group"),
        ("bs", (("lr", 0.001),), 1, "only one value of bs in the group"),
    ]
    # a group with a constant measure is skipped with the reason
    flat = [(a, 9.0 if a["lr"] == 0.01 else m, t) for a, m, t in GRID]
    axes, measure, target = zip(*flat)
    got = granulated_tau(axes, measure, target)
    assert got.per_axis["bs"] == pytest.approx(1 / 3) and got.groups["bs"] == 1
    assert [s.reason for s in got.skipped] == ["the measure is constant over the models"]
    # one value per axis: nothing to correlate
    none = granulated_tau([{"lr": 0.1, "bs": 32}] * 3, [1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
    assert math.isnan(none.psi) and none.per_axis == {"lr": none.per_axis["lr"], "bs": none.per_axis["bs"]}
    assert all(math.isnan(v) for v in none.per_axis.values())
    assert none.reason == "no axis has a group of models in which only it varies"


def test_one_axis_is_plain_tau():
    got = granulated_tau([{"rho": r} for r in (0.01, 0.05, 0.1, 0.2)], [1.0, 3.0, 2.0, 4.0], [0.1, 0.2, 0.3, 0.4])
    assert got.psi == pytest.approx(stats.kendalltau([1, 3, 2, 4], [1, 2, 3, 4]).statistic) == pytest.approx(4 / 6)


def test_bad_input_is_named():
    with pytest.raises(ConfigError, match=r"one value per model; got shapes \(2,\) and \(3,\)"):
        kendall_tau([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ConfigError, match="n_resamples must be a positive integer"):
        kendall_tau([1.0, 2.0], [1.0, 2.0], n_resamples=0)
    with pytest.raises(ConfigError, match=r"confidence must be a number in \(0, 1\)"):
        kendall_tau([1.0, 2.0], [1.0, 2.0], confidence=0)
    with pytest.raises(ConfigError, match=r"clusters must have one path per model \(2\)"):
        kendall_tau([1.0, 2.0], [1.0, 2.0], clusters=[(1,)])
    with pytest.raises(ConfigError, match=r"clusters\[1\] must be a sequence such as \(tuning, configuration\)"):
        kendall_tau([1.0, 2.0], [1.0, 2.0], clusters=[(1,), 2])
    with pytest.raises(ConfigError, match=r"clusters\[0\] must hold hashable values"):
        kendall_tau([1.0, 2.0], [1.0, 2.0], clusters=[([1],), (2,)])
    with pytest.raises(ConfigError, match=r"the same depth; got \[1, 2\]"):
        kendall_tau([1.0, 2.0], [1.0, 2.0], clusters=[(1,), (1, "a")])
    with pytest.raises(ConfigError, match="one entry per model; got 1 and 2"):
        granulated_tau([{"lr": 1}], [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(
        ConfigError, match=r"every model must have the same axes \['bs', 'lr'\]; axes\[1\] has \['lr'\]"
    ):
        granulated_tau([{"lr": 1, "bs": 2}, {"lr": 2}], [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ConfigError, match=r"axes\[0\]\['lr'\] must be hashable"):
        granulated_tau([{"lr": [1]}], [1.0], [1.0])
    with pytest.raises(ConfigError, match=r"axes\[0\] must be a mapping"):
        granulated_tau([("lr", 1)], [1.0], [1.0])


def test_a_handful_of_models_never_gets_a_p_below_kendalls_exact_test():
    # four seeds of one configuration in perfect reverse order: every resample has tau = -1 (or none),
    # so the bootstrap alone would give p = 2 / (B + 1); the exact test allows no less than 2 / 4! = 1/12
    got = kendall_tau([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0], clusters=[(0, "c")] * 4, n_resamples=1000)
    assert got.tau == -1.0 and got.p == pytest.approx(1 / 12)
    assert stats.kendalltau([1, 2, 3, 4], [4, 3, 2, 1], method="exact").pvalue == pytest.approx(1 / 12)


@pytest.mark.parametrize("n", [4, 6, 10])
def test_independent_models_are_called_associated_at_most_alpha_of_the_time(n):
    rng = np.random.default_rng(n)
    runs = 300
    claims = sum(
        kendall_tau(rng.normal(size=n), rng.normal(size=n), n_resamples=200, seed=r).p < 0.05 for r in range(runs)
    )
    assert claims / runs <= 0.05 + 0.02  # binomial sd at 5 % over 300 draws: 1.3 points
