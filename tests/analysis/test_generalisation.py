"""Does flatness predict generalisation: Kendall's tau over trained models, pooled and per arm, against the
test metric and the generalisation gap, checked against scipy; the granulated tau of a grid study by hand."""

import pandas as pd
import pytest
from scipy import stats

from flatlab.analysis.generalisation import GAP, POOLED, flatness_correlations, to_markdown
from flatlab.analysis.sample import Sample, StudyInfo

FLAT = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
ACC = [0.95, 0.93, 0.94, 0.90, 0.91, 0.88]
GAPS = [0.10, 0.12, 0.11, 0.20, 0.15, 0.25]


def models(searcher="optuna"):
    rows = []
    for i, (f, a, g) in enumerate(zip(FLAT, ACC, GAPS)):
        rows.append(
            {"arm": "sgd" if i % 2 else "sam", "seed": i, "stage": "search" if i < 4 else "final"}
            | {"outcome": "completed", "flat/fisher_trace": f, "test/accuracy": a}
            | {"train/loss": 0.3, "test/loss": 0.3 + g, "param.lr": [0.1, 0.2][i % 2], "param.wd": [1, 2, 3][i // 2]}
        )
    rows.append({"arm": "sgd", "seed": 99, "stage": "search", "outcome": "pruned", "flat/fisher_trace": 0.1})
    return Sample.of(pd.DataFrame(rows), StudyInfo(name="corr", searcher=searcher))


def test_pooled_tau_against_scipy_and_per_arm_and_the_pruned_trial_left_out():
    p = flatness_correlations(models(), resamples=200)
    assert p.models == 6 and p.test_metric == "test/accuracy"
    pooled = {r.target: r.correlation for r in p.rows if r.scope == POOLED}
    assert pooled["test/accuracy"].tau == pytest.approx(stats.kendalltau(FLAT, ACC).statistic)
    assert pooled[GAP].tau == pytest.approx(stats.kendalltau(FLAT, GAPS).statistic)
    assert pooled[GAP].low <= pooled[GAP].tau <= pooled[GAP].high and pooled[GAP].n == 6
    sam = next(r.correlation for r in p.rows if r.scope == "sam" and r.target == "test/accuracy")
    assert sam.tau == pytest.approx(stats.kendalltau(FLAT[::2], ACC[::2]).statistic) and sam.n == 3
    assert p.granulated == {}  # not a grid
    assert "does flatness predict generalisation" in to_markdown(p)


def grid_models():
    """One arm on a 2 x 3 grid (lr, wd) x 2 seeds: flatness grows with lr and wd, accuracy grows with lr and
    falls with wd (a small seed offset keeps every value distinct)."""
    rows = []
    for lr in (0.1, 0.2):
        for wd in (1, 2, 3):
            for seed in (0, 1):
                rows.append(
                    {"arm": "sgd", "seed": seed, "stage": "search", "outcome": "completed", "param.lr": lr}
                    | {"param.wd": wd, "flat/fisher_trace": 10 * lr + wd + 0.01 * seed}
                    | {"test/accuracy": lr - 0.01 * wd + 0.001 * seed}
                )
    return Sample.of(pd.DataFrame(rows), StudyInfo(name="grid", searcher="grid"))


def test_granulated_tau_of_a_grid_by_hand():
    p = flatness_correlations(grid_models(), resamples=50)
    g = p.granulated[("flat/fisher_trace", "test/accuracy")]
    # lr's groups (wd, seed fixed): 6 pairs, flatter <-> less accurate in each: tau = +1 (both grow with lr);
    # wd's groups (lr, seed fixed): 4 triples, flatness grows and accuracy falls with wd: tau = -1
    assert g.per_axis == {"param.lr": 1.0, "param.wd": -1.0} and g.groups == {"param.lr": 6, "param.wd": 4}
    assert g.psi == 0.0  # the mean over the two hyperparameter axes; the seed is held fixed, never averaged
    assert any(r.target == GAP for r in p.rows) is False  # no test/train loss recorded: no gap
    assert "no generalisation gap" in " ".join(p.notes)
