"""Time to target in passes and seconds on hand-made histories (no Ray, no MLflow)."""

import math

import pandas as pd
import pytest

from flatlab.analysis.compute_text import time_to_target_cells
from flatlab.analysis.time_to_target import reference_target, time_to_target
from flatlab.errors import ConfigError

# per arm: passes and seconds one epoch costs
COST = {"sgd": (100, 1.0), "sam": (200, 2.5), "ire": (110, 1.1)}
# (arm, tuning, seed) -> val/accuracy per epoch
ACC = {
    ("sgd", 1, 0): [0.5, 0.8, 0.9],  # target 0.8 at epoch 2: 200 passes, 2 s
    ("sgd", 1, 1): [0.6, 0.7, 0.85],  # epoch 3: 300, 3 s
    ("sgd", 2, 0): [0.9, 0.92, 0.95],  # epoch 1: 100, 1 s
    ("sgd", 2, 1): [0.5, 0.6, 0.8],  # epoch 3: 300, 3 s
    ("sam", 1, 0): [0.85, 0.9, 0.9],  # epoch 1: 200
    ("sam", 1, 1): [0.7, 0.82, 0.9],  # epoch 2: 400
    ("sam", 2, 0): [0.5, 0.9, 0.9],  # epoch 2: 400
    ("sam", 2, 1): [0.5, 0.6, 0.7],  # a miss
    ("ire", 1, 0): [0.8, 0.9, 0.9],  # epoch 1: 110
    ("ire", 1, 1): [0.7, 0.8, 0.9],  # epoch 2: 220
    ("ire", 2, 0): [0.81, 0.9, 0.9],  # epoch 1: 110
    ("ire", 2, 1): [0.9, 0.9, 0.9],  # epoch 1: 110
}


def histories(acc=ACC):
    rows = []
    for (arm, tuning, seed), values in acc.items():
        passes, seconds = COST[arm]
        for e, v in enumerate(values, start=1):
            rows.append(
                {
                    "run_id": f"{arm}-{tuning}-{seed}",
                    "arm": arm,
                    "tuning": tuning,
                    "seed": seed,
                    "epoch": e,
                    "compute/passes": passes * e,
                    "compute/train_s": seconds * e,
                    "val/accuracy": v,
                }
            )
    return pd.DataFrame(rows)


def test_times_medians_and_misses_by_hand():
    r = time_to_target(histories(), metric="val/accuracy", reference="sgd", target=0.8)
    runs = r.per_run.set_index("run_id")
    assert runs.loc["sgd-1-1", "epoch"] == 3 and runs.loc["sgd-1-1", "passes"] == 300
    assert runs.loc["sam-1-1", "seconds"] == 5.0
    assert math.isinf(runs.loc["sam-2-1", "passes"]) and math.isnan(runs.loc["sam-2-1", "epoch"])
    # AlgoPerf's median over seeds and tunings, a miss as infinity
    assert r.medians["sgd"] == {"passes": 250.0, "seconds": 2.5, "reached": 4, "runs": 4}
    assert r.medians["sam"]["passes"] == 400.0 and r.medians["sam"]["reached"] == 3
    assert r.medians["ire"]["passes"] == 110.0 and r.medians["ire"]["seconds"] == pytest.approx(1.1)
    assert r.target_source == "given"


def test_speedup_per_tuning_and_its_interval_by_hand():
    r = time_to_target(histories(), metric="val/accuracy", reference="sgd", target=0.8)
    by = {(s.unit, s.arm): s for s in r.speedups}
    ire = by[("passes", "ire")]
    # tuning 1: sgd median(200, 300) = 250, ire median(110, 220) = 165; tuning 2: 200 against 110
    d1, d2 = math.log(250 / 165), math.log(200 / 110)
    assert ire.per_unit == pytest.approx((d1, d2))
    assert ire.ratio_of_medians == pytest.approx(250 / 110)
    mean, se = (d1 + d2) / 2, abs(d1 - d2) / 2  # sd = |d1 - d2| / sqrt 2, over sqrt 2 tunings
    half = 12.706204736174698 * se  # t_{0.975, 1}
    assert ire.claim.estimate.mean == pytest.approx(mean)
    assert (ire.claim.estimate.low, ire.claim.estimate.high) == pytest.approx((mean - half, mean + half))
    g = ire.speedup
    assert g == pytest.approx((math.exp(mean), math.exp(mean - half), math.exp(mean + half)))
    # sam's tuning 2: median(400, inf) = inf, so no finite d_2 and no test, but its tuning 1 is kept
    sam = by[("passes", "sam")]
    assert sam.per_unit[0] == pytest.approx(math.log(250 / 300)) and sam.per_unit[1] == -math.inf
    assert sam.missed == 1 and sam.claim is None and math.isnan(sam.speedup[0])
    assert sam.ratio_of_medians == pytest.approx(250 / 400)
    # in seconds: tuning 1, sgd 2.5 s against ire 1.65 s
    assert by[("seconds", "ire")].per_unit[0] == pytest.approx(math.log(2.5 / 1.65))
    frame = r.frame().set_index("arm")
    assert frame.loc["sam", "passes_claim"] == "not tested: 1 unit(s) missed the target"
    assert frame.loc["ire", "passes_speedup"] == pytest.approx(math.exp(mean))


def test_target_from_the_reference_arm_and_a_loss():
    h = histories()
    # the median of sgd's final values 0.9, 0.85, 0.95, 0.8
    assert reference_target(h, "val/accuracy", "sgd") == pytest.approx(0.875)
    r = time_to_target(h, metric="val/accuracy", reference="sgd")
    assert r.target == pytest.approx(0.875) and r.target_source == "median final val/accuracy of sgd"
    assert r.per_run.set_index("run_id").loc["sgd-1-0", "passes"] == 300  # 0.9 at epoch 3
    h["val/loss"] = 1 - h["val/accuracy"]
    low = time_to_target(h, metric="val/loss", reference="sgd", target=0.2, higher_is_better=False)
    high = time_to_target(h, metric="val/accuracy", reference="sgd", target=0.8)
    assert list(low.per_run["passes"]) == list(high.per_run["passes"])


def test_one_tuning_takes_the_seeds_as_units():
    one = {k: v for k, v in ACC.items() if k[1] == 1}
    r = time_to_target(histories(one), metric="val/accuracy", reference="sgd", target=0.8)
    ire = next(s for s in r.speedups if s.unit == "passes" and s.arm == "ire")
    assert ire.per_unit == pytest.approx((math.log(200 / 110), math.log(300 / 220)))


def test_bad_input():
    with pytest.raises(ConfigError, match="reference arm 'adamw'"):
        time_to_target(histories(), metric="val/accuracy", reference="adamw", target=0.8)
    with pytest.raises(ConfigError, match="lack the column"):
        time_to_target(histories().drop(columns="compute/train_s"), metric="val/accuracy", reference="sgd")
    with pytest.raises(ConfigError, match="finite number"):
        time_to_target(histories(), metric="val/accuracy", reference="sgd", target=math.nan)


def test_profiles_across_studies_in_one_unit():
    from flatlab.analysis.compare.profiles import performance_ratios
    from flatlab.analysis.time_to_target import cost_matrix

    a = time_to_target(histories(), metric="val/accuracy", reference="sgd", target=0.8)
    only = {k: v for k, v in ACC.items() if k[0] != "ire"}
    b = time_to_target(histories(only), metric="val/accuracy", reference="sgd", target=0.9)
    m = cost_matrix({"a": a, "b": b}, "passes")
    assert m.loc["ire", "a"] == 110 and math.isnan(m.loc["ire", "b"]) and m.loc["sam", "a"] == 400
    # b at 0.9: sgd 300, miss, 100, miss -> median (300 + inf) / 2 = inf; sam 400, 600, 400, miss -> 500
    assert math.isinf(m.loc["sgd", "b"]) and m.loc["sam", "b"] == 500
    r = performance_ratios(m)
    assert r.loc["ire", "a"] == 1 and r.loc["sgd", "a"] == pytest.approx(250 / 110)
    assert r.loc["sam", "b"] == 1 and math.isinf(r.loc["sgd", "b"]) and math.isinf(r.loc["ire", "b"])
    with pytest.raises(ConfigError, match="cost unit 'steps'"):
        cost_matrix({"a": a}, "steps")


def test_the_table_says_which_median_is_infinite_not_a_ratio_of_zero():
    acc = {**ACC, ("sam", 1, 0): [0.5, 0.6, 0.7], ("sam", 2, 0): [0.5, 0.6, 0.7]}  # sam: 3 misses of 4
    acc = {**acc, ("ire", 1, 0): [0.5] * 3, ("ire", 1, 1): [0.5] * 3, ("ire", 2, 1): [0.5] * 3}
    r = time_to_target(histories(acc), metric="val/accuracy", reference="sgd", target=0.8)
    by = {(s.unit, s.arm): s for s in r.speedups}
    assert by[("passes", "sam")].ratio_of_medians == 0.0  # 250 / median(400, inf, inf, inf) = 250 / inf
    _, body, _ = time_to_target_cells(r)
    rows = {row[0]: row for row in body}
    assert rows["sam"][1:3] == ["1/4", "∞"] and rows["sam"][4:6] == ["arm's median ∞", "not tested: 2 unit(s) missed"]
    assert rows["ire"][4] == "arm's median ∞" and rows["sgd"][4] == "(reference)"
