"""The results table: cells as recorded (ids are text), and the columns a study's metrics call for."""

import pandas as pd
import pytest
from rich.console import Console

from flatlab.tracking.results import render


def _table(df) -> str:
    console = Console(record=True, width=250)
    render(df, console)
    return console.export_text()


def test_ids_stay_text_and_float_params_are_shortened():
    df = pd.DataFrame(
        {"arm": ["sgd"], "trial_id": ["11879e00"], "status": ["FINISHED"], "outcome": ["completed"], "epochs": [3],
         "val/accuracy": [0.912345], "best/val/accuracy": [0.93], "test/accuracy": [0.9], "param.lr": ["0.08560000001"]}
    )
    df.attrs["metric"] = "val/accuracy"
    text = _table(df)
    assert "11879e00" in text and "1.188e+04" not in text  # a hex-like id is not a number
    assert "lr=0.0856" in text and "0.9123" in text


def test_language_model_and_speedup_columns_appear_when_recorded():
    df = pd.DataFrame(
        {"arm": ["adamw", "adamw_ire"], "trial_id": ["a1", "b2"], "status": ["FINISHED"] * 2, "outcome": ["completed"] * 2,
         "epochs": [1, 1], "val/loss": [5.6, 5.5], "best/val/loss": [5.6, 5.5], "test/accuracy": [0.21, 0.22],
         "test/perplexity": [270.4, 244.7], "train/steps_to_target": [24576.0, 12352.0], "train/speedup": [1.0, 1.9896]}
    )
    df.attrs["metric"] = "val/loss"
    header = _table(df).splitlines()[1]
    for col in ("test/perplexity", "train/steps_to_target", "train/speedup"):
        assert col in header
    assert "test/accuracy" not in header  # a language model's perplexity is shown instead
    assert "24576" in _table(df) and "12352" in _table(df) and "1.99" in _table(df)  # step counts in full
    df2 = df.drop(columns=["train/steps_to_target", "train/speedup"])
    df2.attrs["metric"] = "val/loss"
    assert "speedup" not in _table(df2)


def _seeded_trials():
    """Two SAM configurations over 3 seeds (one seed of rho=0.1 diverged) and one SGD configuration."""
    rows = []
    for rho, accs in ((0.05, [0.90, 0.92, 0.94]), (0.1, [0.95, 0.97, None])):
        for seed, acc in enumerate(accs):
            rows.append({"arm": "sam", "seed": seed, "outcome": "completed" if acc else "diverged",
                         "val/accuracy": acc, "best/val/accuracy": acc, "test/accuracy": acc and acc - 0.01,
                         "param.lr": 0.1, "param.rho": rho, "trial_id": f"s{rho}{seed}"})
    for seed, acc in enumerate([0.91, 0.89, 0.90]):
        rows.append({"arm": "sgd", "seed": seed, "outcome": "completed", "val/accuracy": acc, "best/val/accuracy": acc,
                     "test/accuracy": acc - 0.02, "param.lr": 0.1, "param.rho": None, "trial_id": f"g{seed}"})
    df = pd.DataFrame(rows)
    df.attrs["metric"], df.attrs["mode"] = "val/accuracy", "max"
    return df


def test_by_config_pools_seeds_of_completed_trials_best_first():
    from flatlab.tracking.results import best_per_arm, by_config

    out = by_config(_seeded_trials())
    assert list(out["arm"]) == ["sam", "sam", "sgd"] and list(out["param.rho"][:2]) == [0.1, 0.05]
    assert list(out["seeds"]) == [2, 3, 3] and list(out["trials"]) == [3, 3, 3]  # the diverged seed is left out
    assert out["val/accuracy mean"].tolist() == pytest.approx([0.96, 0.92, 0.90])
    assert out["val/accuracy std"].tolist() == pytest.approx([0.0141421, 0.02, 0.01], abs=1e-6)  # sample std
    assert out["test/accuracy mean"].tolist() == pytest.approx([0.95, 0.91, 0.88])
    best = best_per_arm(out)
    assert list(best["arm"]) == ["sam", "sgd"] and best["param.rho"][0] == 0.1
    text = _table(out)
    header = text.splitlines()[1]
    assert "seeds" in header and "val/accuracy mean" in header and "test/accuracy std" in header
    assert "rho=0.1" in text and "0.96" in text


def test_by_config_of_one_seed_has_no_std():
    from flatlab.tracking.results import by_config

    df = _seeded_trials()
    one = df[df["seed"] == 0].reset_index(drop=True)
    one.attrs.update(df.attrs)
    out = by_config(one)
    assert list(out["seeds"]) == [1, 1, 1] and out["val/accuracy std"].isna().all()
