"""TSAM Figs. 5-6 on the kink toy (studies/toy_tsam_objectives.py): the objectives' sweeps against their
closed forms, and the sweep tables the study's figure is drawn from."""

import math
from pathlib import Path

import pandas as pd
import pytest

from flatlab.analysis.flatness_sweep import plot_sweep, sweep_table, wants_sweep
from flatlab.sharpness.measures import compute_measures, measure_subset, resolve_measures
from flatlab.sharpness.objectives import log_mean_exp, tilted_objective
from flatlab.study.loader import load_studies
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload

STUDY = Path(__file__).resolve().parents[2] / "studies" / "toy_tsam_objectives.py"


def _at(theta):
    """The toy at ``theta`` after the study's one plain-GD step, with its measure subset and loss."""
    wp = {"steps_per_epoch": 1, "tail": 1, "theta0": theta}
    wl = build_workload("toy/tsam_kink", **wp)
    data = wl.load_data(0)
    spec = TrialSpec(
        "toy/tsam_kink",
        "sgd",
        1,
        workload_params=wp,
        optimizer_params={"lr": 0.005, "momentum": 0.0, "weight_decay": 0.0},
    )
    trainer = Trainer(spec, data)
    trainer.run_epoch()
    return trainer.model, measure_subset(data.train, 1, 0), lambda o, t: wl.loss(o, t, 0.0)


def test_both_minima_are_stationary_and_the_sam_sweep_is_the_closed_form():
    study = load_studies(str(STUDY), "smoke")[0]
    for theta, closed in ((1.0, lambda r: r - 0.01), (3.0, lambda r: r * r)):
        model, subset, loss = _at(theta)
        assert float(model.theta.detach()) == theta  # one GD step from a stationary point does not move it
        spec = resolve_measures({"sam_objective": study.measures["sam_objective"]}, "t")
        out = compute_measures(model, subset, loss, spec, seed=0)
        for r in study.measures["sam_objective"]["rhos"]:  # 0.005, 0.5, 0.99: sharp, flat, sharp preferred
            assert out[f"flat/sam_objective/rho_{r:g}"] == pytest.approx(closed(r), abs=1e-12)
    # SAM's ascent from the stationary point itself (init_radius 0) cannot leave it: L(3) = 0
    model, subset, loss = _at(3.0)
    from_theta = compute_measures(model, subset, loss, resolve_measures({"sam_objective": {"rho": 0.5}}, "t"))
    assert from_theta["flat/sam_objective"] == 0.0


def test_the_tilted_sweep_reuses_one_set_of_draws_and_meets_the_closed_form_at_t_0():
    model, subset, loss = _at(1.0)
    r, s = 0.015, 400
    params = {"t": 1.0, "ts": [0.0, 20.0, 1000.0], "s": s, "rho": 0.0, "noise_radius": r, "noise": "uniform"}
    out = compute_measures(model, subset, loss, resolve_measures({"tilted_objective": params}, "t"), seed=3)
    got = tilted_objective(model, subset, t=1.0, s=s, rho=0.0, noise_radius=r, noise="uniform", seed=3, loss_fn=loss)
    assert all(-0.01 <= x <= r - 0.01 + 1e-12 for x in got.losses)  # L(1 + eps) = |eps| - 0.01, |eps| <= r
    for t in params["ts"]:
        assert out[f"flat/tilted_objective/t_{t:g}"] == pytest.approx(log_mean_exp(got.losses, t), abs=1e-15)
    # t = 0: the mean of |eps| - 0.01 with eps ~ U[-r, r] is r/2 - 0.01; 4 standard errors (r / sqrt(12 s))
    assert out["flat/tilted_objective/t_0"] == pytest.approx(r / 2 - 0.01, abs=4 * r / math.sqrt(12 * s))
    # t = 1000: -0.01 + (1/t) log((e^{tr} - 1)/(tr)) = 0.00229; the estimate is below the max of the draws
    closed = -0.01 + math.log(math.expm1(1000 * r) / (1000 * r)) / 1000
    assert out["flat/tilted_objective/t_1000"] == pytest.approx(closed, abs=5e-4)
    assert out["flat/tilted_objective/t_1000"] <= max(got.losses)


def test_the_study_sweeps_both_objectives_and_its_tables_take_any_swept_measure(tmp_path):
    study = load_studies(str(STUDY), "paper")[0]
    assert [(a.name, a.constants()["theta0"]) for a in study.arms] == [("sharp_min", 1.0), ("flat_min", 3.0)]
    assert wants_sweep(study.measures, "sam_objective", "rhos") and wants_sweep(
        study.measures, "tilted_objective", "ts"
    )
    assert not wants_sweep(study.measures)  # no neighbourhood-loss sweep here
    frame = pd.DataFrame(
        [
            {
                "arm": "sharp_min",
                "outcome": "completed",
                "flat/tilted_objective/t_0": -0.0025,
                "flat/tilted_objective/t_1000": 0.0023,
            },
            {
                "arm": "flat_min",
                "outcome": "completed",
                "flat/tilted_objective/t_0": 7.5e-5,
                "flat/tilted_objective/t_1000": 7.7e-5,
            },
        ]
    )
    table = sweep_table(frame, "tilted_objective", "t")
    assert list(table["t"]) == [0.0, 1000.0, 0.0, 1000.0] and list(table["mean"]) == [-0.0025, 0.0023, 7.5e-5, 7.7e-5]
    assert table["var"].isna().all() and list(table["seeds"]) == [1] * 4
    png = plot_sweep(table, tmp_path / "t.png", measure="tilted_objective", param="t")  # t = 0: symlog axis
    from PIL import Image

    with Image.open(png) as im:
        assert im.size == (600, 480)  # one panel (no variance), 5 x 4 inches at 120 dpi
