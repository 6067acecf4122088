"""The results table: cells as recorded (ids are text), and the columns a study's metrics call for."""

import pandas as pd
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
