"""The arms at equal passes and seconds, and the cost curves, on hand-made histories."""

import math

import numpy as np
import pandas as pd
import pytest

from flatlab.analysis.cost_curves import cost_curves, plot_cost_curves
from flatlab.analysis.equal_compute import at_equal, quantities_of
from flatlab.errors import ConfigError

# arm -> (passes per epoch, seconds per epoch, epochs, base accuracy, flat_curve every k epochs)
ARMS = {"sgd": (100, 1.0, 6, 0.5, 3), "sam": (200, 2.5, 2, 0.6, 2)}
OFFSET = {  # (arm, tuning, seed) -> added to the accuracy
    ("sgd", 1, 0): 0.0,
    ("sgd", 1, 1): 0.01,
    ("sgd", 2, 0): 0.02,
    ("sgd", 2, 1): 0.03,
    ("sam", 1, 0): 0.0,
    ("sam", 1, 1): 0.03,
    ("sam", 2, 0): 0.0,
    ("sam", 2, 1): 0.01,
}


def histories():
    rows = []
    for (arm, tuning, seed), off in OFFSET.items():
        passes, seconds, epochs, base, every = ARMS[arm]
        for e in range(1, epochs + 1):
            rows.append(
                {
                    "run_id": f"{arm}-{tuning}-{seed}",
                    **dict(arm=arm, tuning=tuning, seed=seed, epoch=e),
                    "compute/passes": passes * e,
                    "compute/train_s": seconds * e,
                    "val/accuracy": base + 0.1 * e + off,
                    "test/accuracy": base + 0.1 * e + off - 0.05,
                    "flat_curve/fisher": float(e) if e % every == 0 else math.nan,
                }
            )
    return pd.DataFrame(rows)


def test_at_equal_passes_by_hand():
    r = at_equal(histories(), unit="passes", metric="val/accuracy", reference="sgd")
    assert r.quantities == ("val/accuracy", "test/accuracy", "flat_curve/fisher")
    assert r.budget == 400  # sam's total, the smallest
    runs = r.per_run.set_index("run_id")
    assert runs.loc["sgd-1-0", "epoch"] == 4 and runs.loc["sam-1-0", "epoch"] == 2
    assert runs.loc["sgd-2-1", "val/accuracy"] == pytest.approx(0.93)
    assert runs.loc["sgd-1-0", "flat_curve/fisher"] == 3.0  # measured at epoch 3, the last up to epoch 4
    # per tuning, the mean over matched seeds of sam - sgd: (-0.10 - 0.08) / 2 and (-0.12 - 0.12) / 2
    c = r.claims["val/accuracy"][0]
    assert c.arm == "sam" and c.per_tuning == pytest.approx((-0.09, -0.12))
    assert c.estimate.mean == pytest.approx(-0.105) and c.direction == -1
    assert c.margin == 0.01 and c.margin_source == "default (1 point)"
    assert r.claims["test/accuracy"][0].per_tuning == pytest.approx((-0.09, -0.12))
    f = r.claims["flat_curve/fisher"][0]
    assert f.per_tuning == pytest.approx((-1.0, -1.0)) and f.label == "shown" and f.text == "flatter than sgd"
    assert r.medians["sgd"]["val/accuracy"] == pytest.approx(0.915)  # 0.90, 0.91, 0.92, 0.93
    frame = r.frame()
    assert set(frame["quantity"]) == set(r.quantities) and len(frame) == 6


def test_at_equal_seconds_and_one_tuning():
    r = at_equal(histories(), unit="seconds", metric="val/accuracy", reference="sgd")
    assert r.budget == 5.0  # sam: 2 epochs of 2.5 s; sgd is read at epoch 5
    assert set(r.per_run.loc[r.per_run["arm"] == "sgd", "epoch"]) == {5}
    one = histories()
    one = one[one["tuning"] == 1]
    c = at_equal(one, unit="passes", metric="val/accuracy", reference="sgd").claims["val/accuracy"][0]
    assert c.per_tuning == pytest.approx((-0.1, -0.08))  # seeds as the units


def test_at_equal_bad_input():
    with pytest.raises(ConfigError, match="cost unit 'epochs'"):
        at_equal(histories(), unit="epochs", metric="val/accuracy", reference="sgd")
    with pytest.raises(ConfigError, match="reference arm 'adamw'"):
        at_equal(histories(), unit="passes", metric="val/accuracy", reference="adamw")
    assert quantities_of(histories().drop(columns="flat_curve/fisher"), "val/accuracy") == (
        "val/accuracy",
        "test/accuracy",
    )


def test_cost_curves_by_hand(tmp_path):
    c = cost_curves(histories(), "val/accuracy", "passes", points=7)  # 0, 100, ..., 600
    sgd = c[c["arm"] == "sgd"].set_index("cost")
    assert list(sgd.index) == [100, 200, 300, 400, 500, 600]  # no value before the first epoch ends
    assert sgd.loc[100, "median"] == pytest.approx(0.615)  # 0.60, 0.61, 0.62, 0.63
    assert (sgd.loc[100, "low"], sgd.loc[100, "high"]) == pytest.approx(
        tuple(np.percentile([0.6, 0.61, 0.62, 0.63], [25, 75]))
    )
    sam = c[c["arm"] == "sam"].set_index("cost")
    assert list(sam.index) == [200, 300, 400]  # none beyond its own 400 passes
    assert sam.loc[300, "median"] == pytest.approx(0.705)  # epoch 1 until 400: 0.70, 0.73, 0.70, 0.71
    assert set(sam["n"]) == {4}
    path = plot_cost_curves(c, "val/accuracy", tmp_path / "curves.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ConfigError, match="points must be at least 2"):
        cost_curves(histories(), "val/accuracy", "passes", points=1)
