"""Curves per value of a parameter (TSAM paper, Fig. 3), on a trials table and histories made by hand."""

import json

import pandas as pd
import pytest

from flatlab.analysis import param_curves as pc
from flatlab.errors import ConfigError


def table():
    # tsam: t in {1, 5} x lr in {0.1, 0.01} x seeds {0, 1}; the study metric val/accuracy (max)
    val = {(1.0, 0.1): (0.50, 0.52), (1.0, 0.01): (0.60, 0.58), (5.0, 0.1): (0.70, 0.74), (5.0, 0.01): (0.65, 0.90)}
    rows = [
        {
            "arm": "tsam",
            "seed": seed,
            "stage": "search",
            "outcome": "completed",
            "val/accuracy": v,
            "param.t": t,
            "param.lr": lr,
            "run_id": f"r{t:g}-{lr:g}-{seed}",
        }
        for (t, lr), values in val.items()
        for seed, v in enumerate(values)
    ]
    rows.append(
        {
            "arm": "erm",
            "seed": 0,
            "stage": "search",
            "outcome": "completed",
            "val/accuracy": 0.99,
            "param.lr": 0.1,
            "run_id": "e",
        }
    )
    df = pd.DataFrame(rows)
    df.attrs.update(metric="val/accuracy", mode="max")
    return df


def test_best_configuration_per_value_by_the_seeds_mean():
    curves = pc.best_per_value(table(), "tsam", "t")
    # t = 1: lr 0.01 (mean 0.59 > 0.51); t = 5: lr 0.01 (mean 0.775 > 0.72), not the best single seed's lr
    assert [(c.value, c.config["lr"]) for c in curves] == [(1.0, 0.01), (5.0, 0.01)]
    assert [c.score for c in curves] == pytest.approx([0.59, 0.775])
    df = table()
    assert sorted(df.loc[list(curves[1].runs), "run_id"]) == ["r5-0.01-0", "r5-0.01-1"]


def test_mean_curve_by_hand_over_the_epochs_every_seed_has():
    got = pc.mean_curve([{1: 0.2, 2: 0.4, 3: 0.5}, {1: 0.4, 2: 0.6}])
    # epoch 1: mean 0.3, sd sqrt(((0.1)^2 + (0.1)^2) / 1) = 0.1414; epoch 3: only one seed, left out
    assert [p[0] for p in got] == [1, 2] and [p[3] for p in got] == [2, 2]
    assert [p[1] for p in got] == pytest.approx([0.3, 0.5]) and [p[2] for p in got] == pytest.approx([0.1414214] * 2)
    assert pc.mean_curve([{1: 0.7}])[0][2] == 0.0 and pc.mean_curve([]) == ()


def test_plot_and_summary(tmp_path):
    curves = [
        pc.ValueCurve(1.0, {"lr": 0.01}, 0.59, (0,), ((1, 0.3, 0.1, 2), (2, 0.5, 0.1, 2))),
        pc.ValueCurve(5.0, {"lr": 0.01}, 0.775, (1,), ()),
    ]
    path = pc.plot_value_curves(curves, "t", "test/accuracy", "fig", tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads(json.dumps(pc.curves_summary(curves, "t", "test/accuracy")))
    assert summary["values"][0] == {
        "value": 1.0,
        "config": {"lr": 0.01},
        "score": 0.59,
        "points": [[1, 0.3, 0.1, 2], [2, 0.5, 0.1, 2]],
    }
    with pytest.raises(ValueError, match="no curve of 'test/accuracy' to draw"):
        pc.plot_value_curves(curves[1:], "t", "test/accuracy", "fig", tmp_path / "d.png")


def test_unknown_arm_or_parameter():
    with pytest.raises(ConfigError, match=r"no trial of arm 'sam'; arms: erm, tsam"):
        pc.best_per_value(table(), "sam", "t")
    with pytest.raises(ConfigError, match=r"arm 'tsam' has no parameter 's'; its parameters: lr, t"):
        pc.best_per_value(table(), "tsam", "s")


def test_the_summary_leaves_out_pandas_missing_parameters_and_writes_plain_numbers():
    import json

    import numpy as np
    import pandas as pd

    from flatlab.analysis.param_curves import ValueCurve, curves_summary

    c = ValueCurve(value=1.0, config={"k": pd.NA, "rho": np.float64(0.1), "s": np.int64(3), "t": float("nan")},
                   score=0.5, runs=(0,), points=((1, 0.9, 0.0, 1),))  # fmt: skip
    out = json.loads(json.dumps(curves_summary([c], "t", "test/accuracy")))
    assert out["values"][0]["config"] == {"rho": 0.1, "s": 3}
