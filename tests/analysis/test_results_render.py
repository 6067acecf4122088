"""The results table: cells as recorded (ids are text), and the columns a study's metrics call for."""

import pandas as pd
import pytest
from rich.console import Console

from flatlab.analysis.results import render


def _table(df) -> str:
    console = Console(record=True, width=250)
    render(df, console)
    return console.export_text()


def test_ids_stay_text_and_float_params_are_shortened():
    df = pd.DataFrame(
        {
            "arm": ["sgd"],
            "trial_id": ["11879e00"],
            "status": ["FINISHED"],
            "outcome": ["completed"],
            "epochs": [3],
            "val/accuracy": [0.912345],
            "best/val/accuracy": [0.93],
            "test/accuracy": [0.9],
            "param.lr": ["0.08560000001"],
        }
    )
    df.attrs["metric"] = "val/accuracy"
    text = _table(df)
    assert "11879e00" in text and "1.188e+04" not in text  # a hex-like id is not a number
    assert "lr=0.0856" in text and "0.9123" in text


def test_language_model_and_speedup_columns_appear_when_recorded():
    df = pd.DataFrame(
        {
            "arm": ["adamw", "adamw_ire"],
            "trial_id": ["a1", "b2"],
            "status": ["FINISHED"] * 2,
            "outcome": ["completed"] * 2,
            "epochs": [1, 1],
            "val/loss": [5.6, 5.5],
            "best/val/loss": [5.6, 5.5],
            "test/accuracy": [0.21, 0.22],
            "test/perplexity": [270.4, 244.7],
            "train/steps_to_target": [24576.0, 12352.0],
            "train/speedup": [1.0, 1.9896],
        }
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
            rows.append(
                {
                    "arm": "sam",
                    "seed": seed,
                    "outcome": "completed" if acc else "diverged",
                    "val/accuracy": acc,
                    "best/val/accuracy": acc,
                    "test/accuracy": acc and acc - 0.01,
                    "param.lr": 0.1,
                    "param.rho": rho,
                    "trial_id": f"s{rho}{seed}",
                }
            )
    for seed, acc in enumerate([0.91, 0.89, 0.90]):
        rows.append(
            {
                "arm": "sgd",
                "seed": seed,
                "outcome": "completed",
                "val/accuracy": acc,
                "best/val/accuracy": acc,
                "test/accuracy": acc - 0.02,
                "param.lr": 0.1,
                "param.rho": None,
                "trial_id": f"g{seed}",
            }
        )
    df = pd.DataFrame(rows)
    df.attrs["metric"], df.attrs["mode"] = "val/accuracy", "max"
    return df


def test_by_config_pools_seeds_of_completed_trials_best_first():
    from flatlab.analysis.results import by_config, chosen_configurations

    out = by_config(_seeded_trials())
    assert list(out["arm"]) == ["sam", "sam", "sgd"] and list(out["param.rho"][:2]) == [0.1, 0.05]
    assert list(out["seeds"]) == [2, 3, 3] and list(out["trials"]) == [3, 3, 3]  # the diverged seed is left out
    assert out["val/accuracy mean"].tolist() == pytest.approx([0.96, 0.92, 0.90])
    assert out["val/accuracy std"].tolist() == pytest.approx([0.0141421, 0.02, 0.01], abs=1e-6)  # sample std
    assert out["test/accuracy mean"].tolist() == pytest.approx([0.95, 0.91, 0.88])
    best = chosen_configurations(out, _seeded_trials())
    assert list(best["arm"]) == ["sam", "sgd"] and best["param.rho"][0] == 0.1
    text = _table(out)
    header = text.splitlines()[1]
    assert "seeds" in header and "val/accuracy" in header and "test/accuracy" in header and "mean" not in header
    assert "rho=0.1" in text and "0.96 ± 0.01414" in text and "mean ± sample std" in text


def test_by_config_of_one_seed_has_no_std():
    from flatlab.analysis.results import by_config

    df = _seeded_trials()
    one = df[df["seed"] == 0].reset_index(drop=True)
    one.attrs.update(df.attrs)
    out = by_config(one)
    assert list(out["seeds"]) == [1, 1, 1] and out["val/accuracy std"].isna().all()


def _wide_trials():
    """Three trials with the columns of `flatlab results`, four params each (MLflow keeps params as text)."""
    rows = [
        {
            "arm": arm,
            "trial_id": f"11879e0{i}",
            "status": "FINISHED",
            "outcome": "completed",
            "epochs": 30,
            "val/accuracy": acc,
            "best/val/accuracy": acc + 0.001,
            "test/accuracy": acc - 0.01,
            "launch": "abcdef0123456789",
            "start_time": 1.7e12,
            "param.lr": "0.08560000001",
            "param.momentum": "0.9",
            "param.weight_decay": "0.000512345",
            "param.rho": "0.05",
        }
        for i, (arm, acc) in enumerate([("sgd", 0.91234), ("sam", 0.93456), ("adamw_ire_long", 0.90125)])
    ]
    df = pd.DataFrame(rows)
    df.attrs["metric"] = "val/accuracy"
    return df


WIDER = r"the table is (\d+) columns wide; this terminal has (\d+): widen it, or use --format csv"


def _cells_of(lines):
    return [c.strip() for line in lines for c in line.strip("│┃").split("│")]


@pytest.mark.parametrize("width", [60, 100, 160])
def test_no_cell_is_split_across_lines_and_a_wider_table_says_both_widths(width):
    import re

    console = Console(record=True, width=width)
    render(_wide_trials(), console)
    lines = console.export_text().splitlines()
    cells = _cells_of(lines)
    for param in ("lr=0.0856", "momentum=0.9", "weight_decay=0.0005123", "rho=0.05"):
        assert cells.count(param) == 3, param  # one param per line, each whole, in every row
    for number in ("0.9123", "0.9133", "0.9023", "0.9346", "0.9356", "0.9246", "0.9012", "0.9022", "0.8912"):
        assert number in cells, number
    for whole in ("11879e00", "11879e01", "11879e02", "adamw_ire_long"):
        assert cells.count(whole) == 1, whole  # ids and arm names: copyable, on one line
    assert cells.count("FINISHED") == cells.count("completed") == cells.count("30") == cells.count("abcdef01") == 3
    assert len([c for c in cells if re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", c)]) == 3  # start times
    header = [c.strip() for line in lines[:5] for c in line.strip("┃").split("┃")]
    assert header.count("accuracy") == 3 and {"val/", "best/", "test/", "epochs", "trial_id"} <= set(header)
    note = [line for line in lines if line.startswith("the table is")]
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    if width < 152:  # 11 whole columns need 152: printed whole, and the note names both widths
        assert len(note) == 1 and re.fullmatch(WIDER, note[0]).groups() == ("152", str(width))
    else:
        assert note == []
    assert {len(line) for line in table} == {152}


def test_an_error_message_wraps_at_spaces_only():
    df = _wide_trials()
    df["error"] = ["", "RuntimeError: loss diverged at epoch 3 (nan in conv1.weight)", ""]
    console = Console(record=True, width=175)  # 152 for the other columns, 20 for the message's
    render(df, console)
    lines = console.export_text().splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert {len(line) for line in table} == {175} and not any(line.startswith("the table is") for line in lines)
    column = [c for c in (line.strip("│").split("│")[8].strip() for line in lines if line.startswith("│")) if c]
    assert " ".join(column) == "RuntimeError: loss diverged at epoch 3 (nan in conv1.weight)" and len(column) > 1
    words = {"RuntimeError:", "loss", "diverged", "at", "epoch", "3", "(nan", "in", "conv1.weight)"}
    assert {w for c in column for w in c.split()} == words  # no word split


def test_a_wide_enough_console_keeps_headers_on_one_line():
    console = Console(record=True, width=250)
    render(_wide_trials(), console)
    head = console.export_text().splitlines()[1]
    assert "best/val/accuracy" in head and "start_time" in head


def test_cli_by_config_table_leaves_out_configurations_no_seed_completed(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import flatlab.tracking.trials as results_mod
    from flatlab.cli.main import app

    df = _seeded_trials()
    pruned = df.iloc[:1].assign(outcome="pruned", **{"param.lr": 0.5, "trial_id": "p0"})
    trials = pd.concat([df, pruned], ignore_index=True)
    trials.attrs.update(df.attrs)
    monkeypatch.setattr(results_mod, "trials_frame", lambda uri, name, **kw: trials)
    res = CliRunner().invoke(app, ["results", "s", "--root", str(tmp_path), "--by-config"])
    assert res.exit_code == 0, res.output
    assert "s (3 configurations)" in res.output and "lr=0.5" not in res.output
    assert "1 configuration(s) with no completed trial" in res.output
    csv = CliRunner().invoke(app, ["results", "s", "--root", str(tmp_path), "--by-config", "--format", "csv"]).output
    assert len(pd.read_csv(__import__("io").StringIO(csv))) == 4  # exports keep it, with seeds 0
