"""Power, detectable effect and the cheapest (S, m) of a study of tunings (flatlab.analysis.design), against
scipy, a brute-force search and the classical nested-design allocation; and ``--design`` from a sample."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from flatlab.analysis.design import allocate, detectable_effect, power
from flatlab.analysis.design_table import run_costs, study_design
from flatlab.analysis.sample import Sample
from flatlab.analysis.tunings import compare_tunings
from flatlab.errors import ConfigError


def test_power_is_the_noncentral_t_tail_and_matches_a_simulation():
    crit = stats.t.ppf(0.975, 5)
    nc = 1.2 * math.sqrt(6) / 1.0
    by_hand = stats.nct.sf(crit, 5, nc) + stats.nct.cdf(-crit, 5, nc)
    assert power(1.2, 1.0, 6, 0.05) == pytest.approx(by_hand)
    rng = np.random.default_rng(0)
    x = rng.normal(1.2, 1.0, (20000, 6))
    simulated = np.mean(stats.ttest_1samp(x, 0.0, axis=1).pvalue < 0.05)
    assert power(1.2, 1.0, 6, 0.05) == pytest.approx(simulated, abs=0.01)
    assert power(0.0, 1.0, 6, 0.05) == pytest.approx(0.05)  # no effect: the level
    assert 0.3 < power(5.0, 1.0, 3, 0.05 / 7) < 0.5 and np.isfinite(
        power(40.0, 1.0, 3, 0.05 / 7)
    )  # far tail underflows


def test_the_detectable_effect_inverts_the_power():
    d = detectable_effect(2.0, 6, 0.05)
    assert power(d, 2.0, 6, 0.05) == pytest.approx(0.8, abs=1e-8)
    assert detectable_effect(2.0, 6, 0.05) == pytest.approx(2 * detectable_effect(1.0, 6, 0.05))  # linear in the SD
    assert detectable_effect(1.0, 10, 0.05) < detectable_effect(1.0, 6, 0.05) < detectable_effect(1.0, 3, 0.05)
    assert detectable_effect(0.0, 4, 0.05) == 0.0 and math.isnan(detectable_effect(1.0, 1, 0.05))
    with pytest.raises(ConfigError, match=r"alpha must be a number in \(0, 1\)"):
        detectable_effect(1.0, 5, 0.0)


def test_allocation_is_the_cheapest_design_found_by_brute_force_and_near_the_classical_m_star():
    s_t, s_s, c_t, c_s, effect = 1.0, 4.0, 8.0, 1.0, 1.5
    got = allocate(effect, s_t, s_s, c_t, c_s, alpha=0.05)
    assert got.m_star == pytest.approx(math.sqrt(c_t * s_s / (c_s * s_t)))  # sqrt(32) = 5.66
    best = None
    for m in range(1, 21):
        for s in range(2, 501):
            if power(effect, math.sqrt(s_t + s_s / m), s, 0.05) >= 0.8:
                cost = s * (c_t + m * c_s)
                best = min(best or (math.inf,), (cost, s, m))
                break
    assert (got.cost, got.tunings, got.seeds) == best
    assert abs(got.seeds - got.m_star) <= 3 and got.power >= 0.8
    # no tuning variance: seeds are the cheap way to power, capped at the bound
    assert allocate(1.0, 0.0, 1.0, 10.0, 1.0, alpha=0.05).m_star == math.inf
    # tuning variance dominating: one final seed a tuning
    assert allocate(1.0, 1.0, 0.01, 1.0, 1.0, alpha=0.05).seeds == 1
    assert allocate(1e-6, 1.0, 1.0, 1.0, 1.0, alpha=0.05, max_tunings=10) is None  # unreachable within bounds
    with pytest.raises(ConfigError, match="effect must be a positive number"):
        allocate(0.0, 1.0, 1.0, 1.0, 1.0, alpha=0.05)


def _timed_study():
    rows = []
    rng = np.random.default_rng(5)
    for k in range(1, 5):
        for arm, offset, secs in (("sgd", 0.0, 10.0), ("sam", -3.0, 20.0)):
            u = rng.normal(0, 1.0)
            for i in range(3):  # search trials
                rows.append(dict(arm=arm, tuning=k, seed=i, stage="search", start_time=0, end_time=secs * 1000))
            for s in (1, 2):
                flat = 50 + offset + u + rng.normal(0, 0.5)
                rows.append(
                    dict(
                        arm=arm, tuning=k, seed=s, stage="final", start_time=0, end_time=secs * 2000, **{"flat/x": flat}
                    )
                )
    df = pd.DataFrame(rows).assign(outcome="completed", **{"test/accuracy": 0.9, "val/accuracy": 0.9})
    df.attrs.update(metric="val/accuracy", mode="max")
    return df


def test_the_design_table_reads_components_from_the_claims_and_costs_from_the_run_times():
    df = _timed_study()
    sample = Sample.of(df)
    assert run_costs(sample, "sam") == (60.0, 40.0)  # 3 search trials of 20 s a tuning; a final seed 40 s
    c = compare_tunings(sample)
    (row,) = [r for r in study_design(c, sample, effects={"flat/x": 2.0}) if r.quantity == "flat/x"]
    comp = c.row("flat/x", "sam").paired.across.components
    assert (row.sigma2_tuning, row.sigma2_seed) == (comp.tuning, comp.seed)
    assert (row.tunings, row.seeds, row.cost_tuning, row.cost_seed) == (4, 2, 90.0, 60.0)
    sd = math.sqrt(comp.tuning + comp.seed / 2)
    assert row.detectable == pytest.approx(detectable_effect(sd, 4, 0.05))  # one arm: alpha / 1
    assert row.allocation == allocate(2.0, comp.tuning, comp.seed, 90.0, 60.0, alpha=0.05)
    planned = study_design(c, sample, planned=(8, 1))[-1]
    assert (planned.tunings, planned.seeds) == (8, 1)


def test_the_dry_runs_lines_say_what_a_planned_design_detects():
    from flatlab.analysis.design_table import planned_lines

    sample = Sample.of(_timed_study())
    c = compare_tunings(sample)
    lines = planned_lines(c, sample, (12, 1))
    assert lines[0].startswith(
        "with 12 tunings x 1 final seeds, the variance components of the last launch (4 tunings)"
    )
    comp = c.row("flat/x", "sam").paired.across.components
    expected = detectable_effect(math.sqrt(comp.tuning + comp.seed), 12, 0.05)
    (flat,) = [line for line in lines if line.strip().startswith("flat/x:")]
    assert flat.strip() == f"flat/x: sam ±{expected:.4g}"
