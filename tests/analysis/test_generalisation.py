"""Does flatness predict generalisation: Kendall's tau over trained models, pooled and per arm, against the
test metric and the generalisation gap, checked against scipy; the clusters the bootstrap resamples, Holm
over the whole table by hand, and the granulated tau of a grid study by hand, arm-specific axes held fixed."""

import math

import pandas as pd
import pytest
from scipy import stats

from flatlab.analysis.generalisation import GAP, POOLED, cells, clusters, flatness_correlations, to_markdown
from flatlab.analysis.sample import Sample, StudyInfo
from flatlab.errors import ConfigError

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
    assert pooled[GAP].units == (1, 6)  # one tuning, six configurations of one trial each
    sam = next(r.correlation for r in p.rows if r.scope == "sam" and r.target == "test/accuracy")
    assert sam.tau == pytest.approx(stats.kendalltau(FLAT[::2], ACC[::2]).statistic) and sam.n == 3
    assert p.granulated == {}  # not a grid
    text = to_markdown(p)
    assert "does flatness predict generalisation" in text and "| 6 (1, 6) |" in text
    assert "are associated with better generalisation" in text and "generalised better" not in text


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


def test_clusters_are_tuning_then_arm_and_params():
    df = pd.DataFrame(
        [
            {"arm": "sam", "tuning": 1, "stage": "search", "seed": 0, "param.lr": 0.1, "param.rho": 0.05},
            {"arm": "sam", "tuning": 1, "stage": "final", "seed": 7, "param.lr": 0.1, "param.rho": 0.05},
            {"arm": "sam", "tuning": 2, "stage": "final", "seed": 7, "param.lr": 0.1, "param.rho": 0.05},
            {"arm": "sgd", "tuning": 1, "stage": "final", "seed": 7, "param.lr": 0.1, "param.rho": None},
        ]
    )
    got = clusters(df)
    assert got[0] == got[1] == (1, ("sam", (("param.lr", (0, 0.1)), ("param.rho", (0, 0.05)))))  # a re-run
    assert got[2][0] == 2 and got[2][1] == got[0][1]  # the same configuration found by another tuning
    assert got[3] == (1, ("sgd", (("param.lr", (0, 0.1)),)))  # rho not set: not part of sgd's configuration


def test_holm_runs_over_every_tau_of_the_table():
    # one arm, so each measure has two identical rows (all arms, sgd); no test/train loss, so one target
    acc = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    rows = [
        {"arm": "sgd", "seed": 0, "param.lr": i, "test/accuracy": a, "flat/a": i, "flat/b": -i, "flat/c": 2.0}
        | {"flat/d": [4, 1, 6, 2, 8, 3, 7, 5][i]}
        for i, a in enumerate(acc)
    ]
    p = flatness_correlations(Sample.of(pd.DataFrame(rows), StudyInfo(name="holm")), resamples=199)
    raw = {(r.measure, r.scope): r.correlation.p for r in p.rows}
    holm = {(r.measure, r.scope): r.p_holm for r in p.rows}
    # flat/a and flat/b order the models perfectly (tau = +1, -1): no replicate crosses 0, p = 2 / 200
    assert [raw[("flat/a", POOLED)], raw[("flat/b", "sgd")]] == pytest.approx([0.01, 0.01])
    # flat/c is constant: no tau, no p, and not counted: m = 6 (a, b, d in two scopes each)
    assert math.isnan(raw[("flat/c", POOLED)]) and math.isnan(holm[("flat/c", "sgd")])
    p_d = raw[("flat/d", POOLED)]
    assert raw[("flat/d", "sgd")] == p_d and 0.03 < p_d < 1
    # Holm by hand: the four 0.01 come first, multiplied by 6, 5, 4, 3 with a running maximum: 0.06 each;
    # flat/d's two: max(0.06, 2 p_d), then max(that, 1 p_d)
    for key in [("flat/a", POOLED), ("flat/a", "sgd"), ("flat/b", POOLED), ("flat/b", "sgd")]:
        assert holm[key] == pytest.approx(0.06)
    assert holm[("flat/d", POOLED)] == holm[("flat/d", "sgd")] == pytest.approx(min(1.0, max(0.06, 2 * p_d)))
    head, body = cells(p)
    assert head[-2:] == ["p", "p Holm"] and body[0][-2:] == ["0.01", "0.06"]
    assert "p Holm: Holm over the 6 τ of this table" in to_markdown(p)


def test_granulated_tau_holds_an_arm_specific_axis_fixed():
    """SGD on 3 learning rates; SAM on the same 3 x 2 rho. Within every fixed rho the measure rises and the
    target falls with lr, so psi_lr = -1. Dropping rho (it is missing for SGD) would put SAM's two rho in
    one group of 6, where the measure (i + 1.5 j) and target (-i + 1.5 j) of lr index i, rho index j give
    7 concordant and 8 discordant pairs, tau = -1/15, and psi_lr = (-1 - 1/15) / 2 = -8/15 = -0.533."""
    rows = []
    for arm, rhos in (("sgd", [None]), ("sam", [0.05, 0.1])):
        for i, lr in enumerate((0.01, 0.1, 1.0)):
            for j, rho in enumerate(rhos):
                rows.append(
                    {"arm": arm, "seed": 0, "outcome": "completed", "param.lr": lr, "param.rho": rho}
                    | {"flat/fisher_trace": i + 1.5 * j, "test/accuracy": -i + 1.5 * j}
                )
    grid = Sample.of(pd.DataFrame(rows), StudyInfo(name="grid", searcher="grid"))
    g = flatness_correlations(grid, resamples=20).granulated[("flat/fisher_trace", "test/accuracy")]
    assert g.per_axis["param.lr"] == pytest.approx(-1.0) and g.groups["param.lr"] == 3  # sgd, sam rho 0.05, 0.1
    # rho: SAM's three learning rates each give one pair (+1.5, +1.5): +1; SGD's groups have one rho (missing)
    assert g.per_axis["param.rho"] == pytest.approx(1.0) and g.groups["param.rho"] == 3
    # the arm axis: SGD (rho missing) and SAM (rho set) never share every other axis's value
    assert math.isnan(g.per_axis["arm"]) and g.groups["arm"] == 0
    assert {s.reason for s in g.skipped if s.axis == "arm"} == {"only one value of arm in the group"}
    assert g.psi == pytest.approx(0.0)


def alpha_study():
    """Two fine-tuned models x four alphas, as an alpha study records them: no test metric, the study's
    metric ood/accuracy, the sharpness of every theta_alpha under the measure's flat/* name."""
    sharp = {"A": (1.0, 2.0, 3.0, 4.0), "B": (4.0, 3.0, 2.0, 1.0)}
    acc = {"A": (0.5, 0.6, 0.7, 0.65), "B": (0.1, 0.2, 0.3, 0.4)}
    rows = [
        {"arm": "unpruned", "seed": 0, "outcome": "completed", "param.finetuned": m, "param.alpha": alpha}
        | {"flat/avg_sharpness": sharp[m][i], "flat/avg_sharpness_stderr": 0.1, "ood/accuracy": acc[m][i]}
        for m in ("A", "B")
        for i, alpha in enumerate((0.0, 0.25, 0.5, 0.75))
    ]
    return Sample.of(pd.DataFrame(rows), StudyInfo(name="alpha", metric="ood/accuracy", searcher="grid")), sharp, acc


def test_an_alpha_study_gets_tau_against_its_metric_per_model_over_the_alpha_grid():
    sample, sharp, acc = alpha_study()
    p = flatness_correlations(sample, by="param.finetuned", resamples=50)
    assert p.test_metric == "ood/accuracy"  # no test metric recorded: the study's metric
    tau = {r.scope: r.correlation.tau for r in p.rows if r.target == "ood/accuracy"}
    # by hand: model A has 5 concordant pairs of 6 and one discordant ((3, 0.7), (4, 0.65)): (5 - 1) / 6
    assert tau["param.finetuned=A"] == pytest.approx(2 / 3) and tau["param.finetuned=B"] == pytest.approx(-1.0)
    pooled = stats.kendalltau(sharp["A"] + sharp["B"], acc["A"] + acc["B"]).statistic
    assert tau[POOLED] == pytest.approx(pooled)
    assert [r.measure for r in p.rows] == ["flat/avg_sharpness"] * 4  # the stderr is not a measure
    # the granulated tau's alpha axis is the mean over the models of their tau along alpha
    assert p.granulated[("flat/avg_sharpness", "ood/accuracy")].per_axis["param.alpha"] == pytest.approx(
        (2 / 3 - 1) / 2
    )
    with pytest.raises(ConfigError, match=r"by='param.model' is not a column of study 'alpha'"):
        flatness_correlations(sample, by="param.model")
