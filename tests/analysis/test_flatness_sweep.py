"""TSAM Fig. 2's data and figure from a trials frame (flatlab.analysis.flatness_sweep)."""

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from flatlab.analysis.flatness_sweep import plot_sweep, sweep_table, wants_sweep
from flatlab.analysis.sample import Sample
from flatlab.reports.publish import log_flatness_sweep


def _frame():
    rows = []
    for arm, seed, stage, outcome, m1, m2, v1, v2 in (
        ("erm", 0, "search", "completed", 1.0, 2.0, 0.1, 0.5),
        ("erm", 1, "search", "completed", 3.0, 4.0, 0.3, 0.7),
        ("tsam", 0, "search", "completed", 0.5, 0.9, 0.01, 0.02),
        ("tsam", 1, "search", "error", 99.0, 99.0, 9.0, 9.0),  # failed: left out
    ):
        rows.append(
            {
                "arm": arm,
                "seed": seed,
                "stage": stage,
                "outcome": outcome,
                "flat/neighbourhood_loss/sigma_0.01": m1,
                "flat/neighbourhood_loss/sigma_0.1": m2,
                "flat/neighbourhood_loss/sigma_0.01_var": v1,
                "flat/neighbourhood_loss/sigma_0.1_var": v2,
                "flat/neighbourhood_loss/sigma_0.01_stderr": 0.0,
                "flat/neighbourhood_loss/sigma_1e-05_var": 1.0,
            }
        )
    return pd.DataFrame(rows)


def test_sweep_table_averages_each_arm_over_its_completed_seeds():
    t = sweep_table(_frame())
    assert list(t["arm"]) == ["erm", "erm", "tsam", "tsam"] and list(t["sigma"]) == [0.01, 0.1, 0.01, 0.1]
    erm = t[t["arm"] == "erm"].set_index("sigma")
    assert erm.loc[0.01, "mean"] == 2.0 and erm.loc[0.1, "mean"] == 3.0
    assert erm.loc[0.01, "mean_std"] == pytest.approx(math.sqrt(2.0))  # sample std of (1, 3)
    assert erm.loc[0.1, "var"] == pytest.approx(0.6) and erm.loc[0.1, "var_std"] == pytest.approx(math.sqrt(0.02))
    tsam = t[t["arm"] == "tsam"].set_index("sigma")
    assert tsam.loc[0.1, "mean"] == 0.9 and tsam.loc[0.1, "seeds"] == 1 and math.isnan(tsam.loc[0.1, "mean_std"])


def test_sweep_table_prefers_the_final_stage():
    df = _frame()
    final = df.iloc[[0]].assign(stage="final", **{"flat/neighbourhood_loss/sigma_0.01": 7.0})
    t = sweep_table(pd.concat([df, final], ignore_index=True))
    assert list(t["arm"].unique()) == ["erm"] and t.set_index("sigma").loc[0.01, "mean"] == 7.0
    assert sweep_table(df.drop(columns=[c for c in df if c.startswith("flat/")])).empty


def test_plot_sweep_writes_a_two_panel_png(tmp_path):
    from PIL import Image

    png = plot_sweep(sweep_table(_frame()), tmp_path / "fig.png")
    with Image.open(png) as im:
        assert im.size == (1200, 480)  # 10 x 4 inches at 120 dpi
    with pytest.raises(ValueError, match="no neighbourhood_loss sweep to plot"):
        plot_sweep(sweep_table(None), tmp_path / "none.png")


def test_only_a_sigma_sweep_triggers_the_figure(tmp_path):
    assert wants_sweep({"neighbourhood_loss": {"sigmas": [0.1]}})
    assert not wants_sweep({"neighbourhood_loss": {"sigma": 0.1}}) and not wants_sweep({}) and not wants_sweep(None)
    study = SimpleNamespace(name="s", measures={"fisher_trace": {}})
    missing = f"sqlite:///{tmp_path / 'absent.db'}"
    assert (
        log_flatness_sweep(missing, "run", study, Sample.of(_frame())) == [] and not (tmp_path / "absent.db").exists()
    )


def test_plot_sweep_draws_no_offset_text(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    closed = []
    monkeypatch.setattr(plt, "close", closed.append)  # keep the figure plot_sweep would close
    df = _frame()
    var_cols = [c for c in df if c.endswith("_var")]
    df[var_cols] = df[var_cols] * 1e-5  # variances of 1e-6..1e-5: matplotlib's default draws "1e-6" by the axis
    plot_sweep(sweep_table(df), tmp_path / "fig.png")
    (fig,) = closed
    fig.canvas.draw()
    assert [a.get_offset_text().get_text() for ax in fig.axes for a in (ax.xaxis, ax.yaxis)] == ["", "", "", ""]
