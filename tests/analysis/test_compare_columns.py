"""A statistic of ``flatlab compare``'s table is one registered column: registered here in one place, it
shows in the markdown, LaTeX and rich tables and in the CSV, computed from the rows' per-seed values."""

import io
import statistics

import pandas as pd
import pytest
from rich.console import Console

from flatlab.analysis.compare import columns, compare_table, text
from flatlab.analysis.compare.columns import Column, register_column
from flatlab.errors import ConfigError

# seed: test/accuracy; the per-seed differences arm - ref are -0.10, -0.07, -0.16 (median -0.10)
SEEDS = {"ref": {1: 0.90, 2: 0.92, 3: 0.97}, "arm": {1: 0.80, 2: 0.85, 3: 0.81}}


def frame():
    rows = [
        {
            "arm": arm,
            "seed": seed,
            "outcome": "completed",
            "stage": "final",
            "test/accuracy": acc,
            "best/val/accuracy": acc,
            "epochs": 5,
            "run_id": f"{arm}{seed}",
            "start_time": seed,
        }
        for arm, seeds in SEEDS.items()
        for seed, acc in seeds.items()
    ]
    df = pd.DataFrame(rows)
    df.attrs.update(metric="val/accuracy", mode="max", reference_arm="ref")
    return df


def _median_diff(row):
    common = sorted(set(row.values) & set(row.reference_values))
    if row.diff is None or not common:  # the reference's own row: no difference
        return float("nan")
    return statistics.median(row.values[s] - row.reference_values[s] for s in common)


@pytest.fixture
def median_diff():
    column = register_column(
        Column(
            "median_diff",
            lambda c: f"median Δ vs {c.reference}",
            lambda c, r: columns.number(_median_diff(r), signed=True),
            lambda c, r: {"median_diff": _median_diff(r)},
        ),
        after="diff",
    )
    yield column
    columns.COLUMNS.remove(column)


def test_a_registered_statistic_shows_in_every_output(median_diff):
    c = compare_table(frame(), metric="test/accuracy", reference="ref")
    head = text.headers(c)
    assert head[head.index("Δ vs ref") + 1] == "median Δ vs ref"  # after the column it names
    by_arm = {row[1]: row[head.index("median Δ vs ref")] for row in text.cells(c)}
    assert by_arm == {"ref": "-", "arm": "-0.1"}
    assert "| median Δ vs ref |" in text.to_markdown(c) and "| -0.1 |" in text.to_markdown(c)
    assert r"median $\Delta$ vs ref" in text.to_latex(c)
    csv = pd.read_csv(io.StringIO(text.to_csv(c)))
    assert list(csv.columns).index("median_diff") == list(csv.columns).index("diff_std") + 1
    got = dict(zip(csv["arm"], csv["median_diff"]))
    assert got["arm"] == pytest.approx(-0.10, abs=1e-12) and pd.isna(got["ref"])
    console = Console(file=io.StringIO(), width=250, record=True)
    text.render(c, console)
    assert "median Δ vs ref" in console.export_text()


def test_the_built_in_columns_give_the_documented_frame_and_cells():
    c = compare_table(frame(), metric="test/accuracy", reference="ref")
    assert list(c.frame().columns) == [
        "quantity", "arm", "higher_is_better", "runs", "n", "mean", "std", "ci_low", "ci_high", "diff_n",
        "diff_mean", "diff_std", "diff_low", "diff_high", "d_z", "p", "p_holm", "tests", "significant",
        "arm_better", "ref_better", "ties",
    ]  # fmt: skip
    row = dict(zip(text.headers(c), text.cells(c)[1]))
    diffs = [-0.10, -0.07, -0.16]
    assert row["arm"] == "arm" and row["seeds"] == "3/3" and row["seeds better arm:ref:tie"] == "0:3:0"
    assert row["Δ vs ref"] == columns.number(statistics.mean(diffs), signed=True) == "-0.11"
    assert row["mean ± std"] == f"{columns.number(0.82)} ± {columns.number(statistics.stdev([0.80, 0.85, 0.81]))}"


def test_a_column_name_is_registered_once():
    with pytest.raises(ConfigError, match="a column named 'd_z' is registered already; columns: seeds, mean"):
        register_column(Column("d_z", lambda c: "d_z", lambda c, r: "-"))
    with pytest.raises(ConfigError, match="after='nope' names no column; columns: seeds"):
        register_column(Column("new", lambda c: "new", lambda c, r: "-"), after="nope")
