"""TSAM Table 2's tables from a trials frame, against means and standard deviations computed by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from flatlab.analysis.objectives import format_objective_table, objective_tables


def frame(stage=("search",) * 4):
    return pd.DataFrame(
        {
            "arm": ["erm", "erm", "tsam", "tsam"],
            "outcome": ["completed"] * 4,
            "stage": list(stage),
            "flat/erm_objective": [0.1, 0.3, 0.2, 0.2],
            "flat/sam_objective": [0.5, 0.7, 0.3, float("nan")],
            "flat_test/erm_objective": [1.0, 2.0, 1.5, 1.7],
        }
    )


def test_cells_are_means_over_an_arms_trials_per_split():
    train, test = objective_tables(frame(), [("train", "flat"), ("test", "flat_test")])
    assert train.arms == ("erm", "tsam") and train.objectives == ("ERM", "SAM", "TSAM")
    assert train.cells[("erm", "ERM")] == pytest.approx((0.2, math.sqrt(0.02), 2))
    assert train.cells[("tsam", "SAM")][0] == 0.3 and train.cells[("tsam", "SAM")][2] == 1  # the nan is left out
    assert ("erm", "TSAM") not in train.cells  # not measured
    assert test.prefix == "flat_test" and test.cells[("tsam", "ERM")] == pytest.approx((1.6, math.sqrt(0.02), 2))
    lines = format_objective_table(train)
    assert lines[0].startswith("train split: rows = trained model (arm), columns = objective")
    assert lines[2] == "| trained by | ERM | SAM | TSAM |"
    assert lines[4] == "| erm | 0.2 ± 0.14 (2) | 0.6 ± 0.14 (2) | - |"
    assert lines[5] == "| tsam | 0.2 ± 0 (2) | 0.3 (1) | - |"


def test_final_stage_trials_are_used_where_there_are_some_and_empty_splits_are_skipped():
    (train,) = objective_tables(frame(("search", "final", "search", "final")), [("train", "flat"), ("val", "flat_val")])
    assert train.cells[("erm", "ERM")] == (0.3, pytest.approx(float("nan"), nan_ok=True), 1)
    assert objective_tables(frame().iloc[0:0], [("train", "flat")]) == []
