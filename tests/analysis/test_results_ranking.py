"""Results tables rank completed trials first, never pick a failed trial, never show a sentinel, and
count target misses next to target means."""

import pandas as pd
import pytest
from rich.console import Console

from flatlab.analysis.results import by_config, chosen_configurations, render, sort_trials
from flatlab.analysis.selection import best_trial_rows


def frame():
    rows = [
        # arm sgd: a pruned trial whose partial value beats the completed one; a diverged one
        {"arm": "sgd", "trial_id": "p", "outcome": "pruned", "epochs": 1, "val/accuracy": 0.99, "stage": "search"},
        {"arm": "sgd", "trial_id": "c", "outcome": "completed", "epochs": 9, "val/accuracy": 0.90, "stage": "search"},
        {
            "arm": "sgd",
            "trial_id": "d",
            "outcome": "diverged",
            "epochs": 2,
            "val/accuracy": float("nan"),
            "stage": "search",
        },
        {"arm": "sgd", "trial_id": "f", "outcome": "completed", "epochs": 9, "val/accuracy": 0.999, "stage": "final"},
        # arm tsam: nothing completed, one errored with the best value, one pruned
        {"arm": "tsam", "trial_id": "e", "outcome": "error", "epochs": 1, "val/accuracy": 0.95, "stage": "search"},
        {"arm": "tsam", "trial_id": "q", "outcome": "pruned", "epochs": 3, "val/accuracy": 0.50, "stage": "search"},
    ]
    df = pd.DataFrame(rows)
    df["best/val/accuracy"] = df["val/accuracy"]
    df.attrs.update(metric="val/accuracy", mode="max")
    return df


def test_sort_ranks_outcomes_before_values():
    order = list(sort_trials(frame(), "val/accuracy", "max")["trial_id"])
    assert order == ["f", "c", "p", "q", "d", "e"]
    order_min = list(sort_trials(frame(), "val/accuracy", "min")["trial_id"])
    assert order_min[:2] == ["c", "f"]  # completed first in either direction


def test_exact_ties_are_ordered_by_start_time_then_run_id_whatever_order_mlflow_returned():
    rows = [
        {
            "arm": "sgd",
            "trial_id": t,
            "run_id": r,
            "start_time": pd.Timestamp(s),
            "outcome": "completed",
            "epochs": 9,
            "val/accuracy": 0.9,
            "best/val/accuracy": 0.9,
        }
        for t, r, s in (
            ("late", "r1", "2026-12-05 10:00"),
            ("early_b", "r3", "2026-12-05 09:00"),
            ("early_a", "r2", "2026-12-05 09:00"),
        )
    ]
    df = pd.DataFrame(rows)
    for shuffled in (df, df.iloc[::-1], df.iloc[[1, 2, 0]]):
        assert list(sort_trials(shuffled, "val/accuracy", "max")["trial_id"]) == ["early_a", "early_b", "late"]


def test_the_best_trial_is_a_completed_search_trial_never_a_pruned_failed_or_final_one():
    best = best_trial_rows(sort_trials(frame(), "val/accuracy", "max"))
    assert dict(zip(best["arm"], best["trial_id"])) == {"sgd": "c"}  # tsam: nothing completed, no best trial


def test_by_config_counts_target_misses():
    rows = []
    for seed, steps in enumerate([100.0, None, 140.0]):
        rows.append(
            {
                "arm": "sgd_ire",
                "seed": seed,
                "outcome": "completed",
                "val/accuracy": 0.9,
                "best/val/accuracy": 0.9,
                "train/steps_to_target": steps,
                "train/speedup": None if steps is None else 200.0 / steps,
                "param.kappa": 2.0,
            }
        )
    df = pd.DataFrame(rows)
    df.attrs.update(metric="val/accuracy", mode="max")
    out = by_config(df)
    assert out.loc[0, "seeds"] == 3 and out.loc[0, "reached"] == "2/3"
    assert out.loc[0, "train/speedup mean"] == pytest.approx((2.0 + 200.0 / 140.0) / 2)
    console = Console(record=True, width=250)
    render(out, console)
    assert "2/3" in console.export_text()


def test_trials_frame_masks_sentinels(tmp_path):
    from mlflow.entities import Metric

    from flatlab.tracking import runs
    from flatlab.tracking.trials import trials_frame

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = runs.client(uri)
    exp = runs.get_or_create_experiment(uri, "s", str(tmp_path / "art"))
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_param(parent, "metric", "val/accuracy")
    child = c.create_run(exp, tags={runs.PARENT: parent, runs.TAG_ARM: "sgd", runs.TAG_OUTCOME: "diverged"}).info.run_id
    c.log_batch(child, metrics=[Metric("val/accuracy", -1.7976931348623157e308, 0, 1), Metric("epoch", 1, 0, 1)])
    df = trials_frame(uri, "s")
    assert df["val/accuracy"].isna().all()


def test_by_config_best_is_the_final_stage_row_where_an_arm_has_one():
    rows = []
    for stage, lr, seeds, acc in (
        ("search", 0.1, [0], [0.95]),
        ("search", 0.2, [0], [0.97]),
        ("final", 0.1, [1, 2, 3], [0.93, 0.94, 0.95]),
    ):
        for seed, a in zip(seeds, acc):
            rows.append(
                {
                    "arm": "sgd",
                    "stage": stage,
                    "seed": seed,
                    "outcome": "completed",
                    "val/accuracy": a,
                    "best/val/accuracy": a,
                    "param.lr": lr,
                }
            )
    df = pd.DataFrame(rows)
    df.attrs.update(metric="val/accuracy", mode="max")
    pooled = by_config(df)
    assert list(pooled["param.lr"]) == [0.2, 0.1, 0.1]  # by the final metric's mean
    best = chosen_configurations(pooled, df)
    assert (best.loc[0, "stage"], best.loc[0, "seeds"], best.loc[0, "param.lr"]) == ("final", 3, 0.1)
    assert best.loc[0, "val/accuracy mean"] == pytest.approx(0.94)


def grid_with_a_final_stage():
    """Two arms, 2 seeds per configuration, each arm's chosen configuration re-run on 2 final seeds:
    sgd wins the search (mean 0.92 against 0.91), tsam's final seeds do better (0.96 against 0.90)."""
    rows = []
    for arm, stage, lr, values in (
        ("tsam", "search", 0.1, [0.90, 0.92]),
        ("tsam", "search", 0.2, [0.95, 0.80]),
        ("tsam", "final", 0.1, [0.96, 0.96]),
        ("sgd", "search", 0.1, [0.93, 0.91]),
        ("sgd", "final", 0.1, [0.90, 0.90]),
    ):
        for seed, v in enumerate(values, start=0 if stage == "search" else 5):
            rows.append(
                {
                    "arm": arm,
                    "stage": stage,
                    "seed": seed,
                    "trial_id": f"{arm}{lr}{seed}",
                    "outcome": "completed",
                    "epochs": 9,
                    "val/accuracy": v,
                    "best/val/accuracy": v,
                    "param.lr": lr,
                }
            )
    df = sort_trials(pd.DataFrame(rows), "val/accuracy", "max")
    df.attrs.update(metric="val/accuracy", mode="max")
    return df


def test_by_config_best_lists_arms_by_the_search_score_and_shows_it():
    df = grid_with_a_final_stage()
    best = chosen_configurations(by_config(df), df)
    assert best["arm"].tolist() == ["sgd", "tsam"] and best["stage"].tolist() == ["final", "final"]
    assert best["val/accuracy mean"].tolist() == pytest.approx([0.90, 0.96])  # the final seeds' mean
    assert best["search val/accuracy mean"].tolist() == pytest.approx([0.92, 0.91])  # the score that chose
    assert best["search seeds"].tolist() == [2, 2] and best.attrs["best"] == "config"


def test_by_config_best_takes_the_final_rows_of_the_chosen_configuration_across_launches():
    # --all: an earlier launch chose tsam's lr 0.2 and re-ran it on final seeds; over both launches' search
    # trials lr 0.1 is chosen (mean 0.91 against 0.875), so its final rows are the answer, not lr 0.2's
    df = grid_with_a_final_stage()
    rows = [
        {
            "arm": "tsam",
            "stage": "final",
            "seed": 7 + i,
            "trial_id": f"old{i}",
            "outcome": "completed",
            "epochs": 9,
            "val/accuracy": 0.99,
            "best/val/accuracy": 0.99,
            "param.lr": 0.2,
        }
        for i in range(2)
    ]
    both = sort_trials(pd.concat([pd.DataFrame(rows), df], ignore_index=True), "val/accuracy", "max")
    both.attrs.update(df.attrs)
    pooled = by_config(both)
    assert (
        pooled[(pooled["arm"] == "tsam") & (pooled["stage"] == "final")]["param.lr"].tolist()[0] == 0.2
    )  # listed first
    best = chosen_configurations(pooled, both)
    assert best["arm"].tolist() == ["sgd", "tsam"] and best["param.lr"].tolist() == [0.1, 0.1]
    assert best["stage"].tolist() == ["final", "final"] and best["val/accuracy mean"].tolist() == pytest.approx(
        [0.90, 0.96]
    )


def test_best_tables_show_the_score_and_say_which_trials_chose():
    df = grid_with_a_final_stage()
    best = best_trial_rows(df)
    assert best["trial_id"].tolist() == ["sgd0.10", "tsam0.11"]  # by the mean: sgd first, though tsam's 0.92 is higher
    console = Console(record=True, width=250)
    render(best, console)
    text = console.export_text()
    header = text.splitlines()[1]
    assert "search val/accuracy mean" in header and "search seeds" in header  # several seeds: the mean is shown
    assert [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")] == ["sgd", "tsam"]
    caption = " ".join(text.split())
    assert (
        "each arm's best trial of its best configuration, chosen on completed search trials by the mean "
        "final-epoch val/accuracy over seeds (higher is better); arms best first by that mean. Final-stage "
        "trials are not candidates: `flatlab results --by-config --best` and `flatlab compare` report them"
    ) in caption
    one = df[df["seed"] != 1].reset_index(drop=True)  # one search seed (an Optuna search): the mean is the value
    one.attrs.update(df.attrs)
    console = Console(record=True, width=250)
    render(best_trial_rows(one), console)
    text = console.export_text()
    assert "search" not in text.splitlines()[1] and "chosen on completed search trials" in text
    assert [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")] == [
        "tsam",
        "sgd",
    ]  # 0.95, 0.93
