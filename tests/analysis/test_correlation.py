"""Kendall's tau and the granulated coefficient (Jiang et al. 2020) against scipy, hand computations on
a constructed grid, and the bootstrap interval against scipy's own and the null variance of tau."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from flatlab.analysis.correlation import granulated_tau, kendall_tau
from flatlab.errors import ConfigError

MEASURE = [3.1, 1.2, None, 4.4, 2.0, 2.0, 5.3, float("nan"), 0.7, 3.9]
TARGET = [0.30, 0.10, 0.50, 0.35, 0.22, 0.18, 0.40, 0.20, 0.10, 0.28]


def test_tau_against_scipy_with_ties_and_missing_values():
    keep = [i for i, m in enumerate(MEASURE) if m is not None and not math.isnan(m)]
    x = [MEASURE[i] for i in keep]
    y = [TARGET[i] for i in keep]
    expected = stats.kendalltau(x, y, variant="b")
    got = kendall_tau(MEASURE, TARGET, n_resamples=200, seed=1)
    assert got.n == 8 and got.reason == ""
    assert got.tau == pytest.approx(expected.statistic) and got.p == pytest.approx(expected.pvalue)
    # tau-b by hand. By measure: 0.7, 1.2, 2.0, 2.0, 3.1, 3.9, 4.4, 5.3 with targets
    # 0.10, 0.10, 0.22, 0.18, 0.30, 0.28, 0.35, 0.40: 28 pairs, 1 tied in the measure (2.0), 1 tied in the
    # target (0.10), 1 discordant (3.1 -> 0.30 vs 3.9 -> 0.28), so 25 concordant: (25 - 1) / sqrt(27 * 27)
    assert got.tau == pytest.approx(24 / 27)
    assert got.low <= got.tau <= got.high and got.resamples <= 200


def test_bootstrap_interval_is_scipys_percentile_interval():
    rng = np.random.default_rng(11)
    x = rng.normal(size=25)
    y = x + rng.normal(size=25)
    got = kendall_tau(x, y, n_resamples=300, confidence=0.9, seed=4)
    direct = stats.bootstrap(
        (x, y),
        lambda a, b: stats.kendalltau(a, b).statistic,
        paired=True,
        vectorized=False,
        n_resamples=300,
        method="percentile",
        confidence_level=0.9,
        random_state=np.random.default_rng(4),
    )
    assert got.resamples == 300  # 25 distinct models: no constant resample
    assert (got.low, got.high) == pytest.approx(tuple(direct.confidence_interval))
    assert kendall_tau(x, y, n_resamples=300, confidence=0.9, seed=4) == got  # the seed fixes it
    assert kendall_tau(x, y, n_resamples=300, confidence=0.9, seed=5).low != got.low


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
