"""The selection rules (flatlab.analysis.selection) on hand-made trials: completed, the best configuration
(mean final value over seeds, ties to more seeds then the smaller configuration), the best trial, the
trial for a seed, the reference arm, and tables as trials_frame gives them."""

import math

import pandas as pd
import pytest

from flatlab.analysis import selection as sel
from flatlab.errors import ConfigError


def T(arm, value, seed=0, ref=None, **params):
    return sel.Trial(arm, sel.config_key(params), seed, value, ref)


def test_the_best_configuration_is_the_best_mean_over_seeds():
    trials = [
        T("sam", 0.90, 0, rho=0.05),
        T("sam", 0.80, 1, rho=0.05),  # mean 0.85, best single trial
        T("sam", 0.88, 0, rho=0.1),
        T("sam", 0.86, 1, rho=0.1),  # mean 0.87
        T("sam", None, 2, rho=0.1),
        T("sam", None, 0, rho=0.2),
    ]  # not completed: no part, rho 0.2 absent
    ranked = sel.rank_configurations(trials, "max")["sam"]
    assert [dict(c.config)["rho"] for c in ranked] == [(0, 0.1), (0, 0.05)]
    assert ranked[0].mean == pytest.approx(0.87) and ranked[0].seeds == 2 and ranked[1].mean == pytest.approx(0.85)
    assert sel.best_trial(ranked[0]).value == 0.88
    low = sel.rank_configurations(trials, "min")["sam"]  # a loss: the smaller mean wins
    assert dict(low[0].config)["rho"] == (0, 0.05) and sel.best_trial(low[0]).value == 0.80


def test_ties_go_to_more_seeds_then_the_smaller_configuration_whatever_the_order():
    trials = [T("a", 0.5, 0, lr=0.3), T("a", 0.5, 0, lr=0.2), T("a", 0.5, 1, lr=0.2), T("a", 0.5, 0, lr=0.1)]
    for order in (trials, trials[::-1]):
        ranked = sel.rank_configurations(order, "max")["a"]
        assert [dict(c.config)["lr"][1] for c in ranked] == [0.2, 0.1, 0.3]  # 2 seeds first; then 0.1 < 0.3
        assert sel.best_trial(ranked[0]).seed == 0  # equal values: the smaller seed
    # numbers compare as numbers (0.05 < 0.1, though "0.1" < "0.05" as text), text after numbers
    keys = sorted([sel.config_key({"x": "0.1"}), sel.config_key({"x": 0.05}), sel.config_key({"x": "adam"})])
    assert keys == [(("x", (0, 0.05)),), (("x", (0, 0.1)),), (("x", (1, "adam")),)]


def test_a_configuration_is_the_same_from_tune_mlflow_and_a_table():
    tune = sel.config_key({"lr": 0.1, "depth": 3, "opt": "sgd", "nesterov": True, "wd": None})
    mlflow = sel.config_key({"lr": "0.1", "depth": "3", "opt": "sgd", "nesterov": "True", "wd": "None"})
    table = sel.config_key(
        {
            "lr": 0.1,
            "depth": pd.array([3], dtype="Int64")[0],
            "opt": "sgd",
            "nesterov": "True",
            "wd": "None",
            "rho": float("nan"),
            "s": pd.NA,
        }
    )  # NaN/NA: a param this trial has not
    assert tune == mlflow == table


def test_the_trial_for_a_seed_comes_from_the_best_ranked_configuration_that_has_it():
    trials = [
        T("r", 0.9, 0, ref="a0", lr=1),
        T("r", 0.9, 1, ref="a1", lr=1),
        T("r", 0.7, 2, ref="b2", lr=2),
        T("r", 0.6, "1", ref="b1", lr=2),
    ]
    ranked = sel.rank_configurations(trials, "max")["r"]
    assert sel.trial_for_seed(ranked, 1).ref == "a1" and sel.trial_for_seed(ranked, "0").ref == "a0"
    assert sel.trial_for_seed(ranked, 2).ref == "b2" and sel.trial_for_seed(ranked, 3) is None


def test_completed_and_the_outcome_rule():
    df = pd.DataFrame(
        {
            "outcome": ["completed", "pruned", None, None, "", "diverged"],
            "status": ["FINISHED", "KILLED", "FINISHED", "RUNNING", "FINISHED", "FAILED"],
        }
    )
    assert sel.completed(df).tolist() == [True, False, True, False, True, False]  # untagged FINISHED counts
    assert sel.trial_outcome({"completed": 1, "val/loss": 0.3}, False, "val/loss") == "completed"
    assert sel.trial_outcome({"completed": 1, "val/loss": math.inf}, False, "val/loss") == "diverged"
    assert sel.trial_outcome({"val/loss": 0.3}, False, "val/loss") == "pruned"


def test_reference_arm_and_ranking_names():
    assert sel.reference_arm(["tsam", "sgd"], "tsam") == "tsam" and sel.reference_arm(["tsam", "sgd"]) == "sgd"
    assert sel.reference_arm(["tsam", "adamw"], "sgd") == "adamw"
    assert sel.value_column("val/accuracy") == "val/accuracy"
    assert sel.value_column("val/accuracy", "best-epoch") == "best/val/accuracy"
    with pytest.raises(ConfigError, match=r"rank_by='peak' is not supported; expected one of final, best-epoch"):
        sel.value_column("val/accuracy", "peak")
    with pytest.raises(ConfigError, match=r"mode='up'; expected 'max' or 'min'"):
        sel.rank_configurations([], "up")


def frame():
    rows = [  # arm, stage, seed, outcome, lr, final, best
        ("sgd", "search", 0, "completed", 0.1, 0.80, 0.95),
        ("sgd", "search", 1, "completed", 0.1, 0.84, 0.96),
        ("sgd", "search", 0, "completed", 0.2, 0.83, 0.83),
        ("sgd", "search", 1, "diverged", 0.2, None, 0.5),
        ("sgd", "final", 5, "completed", 0.2, 0.99, 0.99),  # a re-run: never a candidate
        ("tsam", "search", 0, "pruned", 0.1, 0.99, 0.99),
    ]
    df = pd.DataFrame(
        rows, columns=["arm", "stage", "seed", "outcome", "param.lr", "val/accuracy", "best/val/accuracy"]
    )
    df.attrs.update(metric="val/accuracy", mode="max")
    return df


def test_tables_best_configuration_rows_and_best_trial_rows():
    rows = sel.best_configuration_rows(frame())
    # lr 0.2: one completed seed (0.83) beats lr 0.1's mean 0.82; its diverged seed comes along (it was run)
    assert rows.index.tolist() == [2, 3] and rows.attrs["metric"] == "val/accuracy"
    best = sel.best_trial_rows(frame())
    assert best[["arm", "param.lr", "seed"]].values.tolist() == [["sgd", 0.2, 0]]  # tsam: nothing completed
    by_best_epoch = sel.best_trial_rows(frame(), "best-epoch")
    assert by_best_epoch[["param.lr", "seed"]].values.tolist() == [[0.1, 1]]
    with pytest.raises(ConfigError, match=r"--rank-by best-epoch: these trials recorded no best/val/accuracy"):
        sel.best_trial_rows(frame().drop(columns="best/val/accuracy"), "best-epoch")


def reported():
    """The demo's report: each arm's search trials (one seed each, as Optuna runs them) and its final-stage
    re-runs of the chosen configuration, whose values differ from the search trial's."""
    rows = [  # arm, stage, seed, lr, final value
        ("sam", "search", 0, 0.1, 0.9526),
        ("sam", "search", 0, 0.3, 0.9400),
        ("sam", "final", 1, 0.1, 0.9700),
        ("sgd_ire", "search", 0, 0.1, 0.9582),
        ("sgd_ire", "final", 1, 0.1, 0.9500),
        ("tsam", "search", 0, 0.1, 0.9499),
        ("tsam", "final", 1, 0.1, 0.9554),
        ("tsam", "final", 2, 0.1, 0.9560),
        ("sgd", "search", 0, 0.1, 0.9554),
        ("sgd", "final", 1, 0.1, 0.9300),
    ]
    df = pd.DataFrame(rows, columns=["arm", "stage", "seed", "param.lr", "val/accuracy"])
    df["outcome"], df["best/val/accuracy"] = "completed", df["val/accuracy"]
    df.attrs.update(metric="val/accuracy", mode="max")
    return df


@pytest.mark.parametrize(
    "mode, arms", [("max", ["sgd_ire", "sgd", "sam", "tsam"]), ("min", ["sam", "tsam", "sgd", "sgd_ire"])]
)  # sam: lr 0.3
def test_best_trial_rows_list_arms_best_first_by_the_rule_whatever_the_final_stage_and_row_order(mode, arms):
    from flatlab.analysis.results import sort_trials

    for order in (sort_trials(reported(), "val/accuracy", mode), reported().iloc[::-1]):
        df = order.reset_index(drop=True)
        df.attrs.update(metric="val/accuracy", mode=mode)
        best = sel.best_trial_rows(df)
        assert best["arm"].tolist() == arms and set(best["stage"]) == {"search"}
        # the score the rule chose by, beside the trial: one seed each, so the trial's own value
        assert best["search val/accuracy mean"].tolist() == best["val/accuracy"].tolist()
        assert best["search seeds"].tolist() == [1, 1, 1, 1]
        assert best.attrs["best"] == "trial" and best.attrs["rank_by"] == "final"
    assert sel.best_trial_rows(reported()).loc[3, "val/accuracy"] == 0.9499  # tsam: its search trial, not 0.9554


def test_arms_rank_by_the_mean_then_more_seeds_then_the_best_trial_then_the_name():
    trials = [
        T("b", 0.9, 0, lr=1),
        T("b", 0.7, 1, lr=1),  # mean 0.8 over 2 seeds, best trial 0.9
        T("a", 0.8, 0, lr=1),  # mean 0.8 over 1 seed
        T("d", 0.85, 0, lr=1),
        T("d", 0.75, 1, lr=1),  # mean 0.8 over 2 seeds, best trial 0.85
        T("c", 0.8, 0, lr=1),  # as a: the name decides
        T("e", 0.81, 0, lr=2),
        T("e", 0.99, 0, lr=3),
        T("e", 0.1, 1, lr=3),
    ]  # chosen lr 2 by its mean 0.81
    for order in (trials, trials[::-1]):
        best = sel.best_configurations(order, "max")
        assert sel.rank_arms(best, "max") == ["e", "b", "d", "a", "c"]
        low = sel.best_configurations(order, "min")  # e: lr 3 (mean 0.545); b, d: best trials 0.7, 0.75
        assert sel.rank_arms(low, "min") == ["e", "b", "d", "a", "c"]
