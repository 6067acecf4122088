"""The claim's error rates, by simulation through flatlab's own functions (flatlab.analysis.calibration):
identical arms get a directional claim at most alpha + 0.01 of the time at every tuning/seed SD ratio and number of
tunings, 7 identical arms under Holm at most alpha + 0.01 family-wise, and a large uniform effect is found."""

import pytest

from flatlab.analysis.calibration import directional_rate, family_rate, power_curve
from flatlab.analysis.design import power

ALPHA = 0.05


@pytest.mark.parametrize("tunings", [3, 5, 10])
@pytest.mark.parametrize("ratio", [0.0, 0.5, 1.0, 3.0, 10.0])
def test_identical_arms_get_a_directional_claim_at_most_alpha(tunings, ratio):
    rate = directional_rate(
        tunings=tunings, seeds=4, ratio=ratio, effect=0.0, reps=6000, seed=tunings * 100 + int(ratio)
    )
    assert rate <= ALPHA + 0.01
    assert rate >= ALPHA - 0.015  # calibrated, not merely conservative (6,000 draws: SE 0.003)


@pytest.mark.parametrize("ratio", [0.0, 3.0, 10.0])
def test_seven_identical_arms_under_holm_keep_the_family_wise_rate(ratio):
    got = family_rate(arms=7, tunings=5, seeds=2, ratio=ratio, reps=4000, seed=7)
    assert got.any_directional <= ALPHA + 0.01
    assert got.any_equivalent_beside_nonzero_interval == 0.0


def test_a_uniform_real_effect_is_found_as_the_t_power_says():
    # effect in units of the SD of d_k: the t over S = 6 tunings at alpha has power ~0.8 at 1.4 SD
    curve = power_curve(tunings=6, seeds=2, ratio=1.0, effects=(0.0, 1.4, 3.0), reps=3000, seed=11)
    assert curve[0.0] <= ALPHA + 0.01
    assert curve[1.4] == pytest.approx(power(1.4, 1.0, 6, ALPHA), abs=0.03)
    assert curve[3.0] >= 0.99
