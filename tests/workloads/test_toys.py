"""The papers' toy losses as workloads: closed forms, the curvature pass's ranking, the end points the
optimizer tests state (tests/optim/test_ire.py, test_tsam.py) reached through the trainer, and the
study's figure from a real MLflow store."""

import json
from pathlib import Path

import pytest
import torch

from flatlab.reports.declared import ReportInput, toy_figure
from flatlab.study.loader import load_studies
from flatlab.study.validate import validate
from flatlab.train.closure import BatchClosure
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads.registry import build_workload
from flatlab.workloads.toys import ToyModel, ire_valley, tsam_kink, tsam_wave

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"
NO_DECAY = {"momentum": 0.0, "weight_decay": 0.0}


def train(workload, wp, optimizer, op, epochs, seed=0):
    wl = build_workload(workload, **wp)
    trainer = Trainer(
        TrialSpec(
            workload=workload,
            optimizer=optimizer,
            epochs=epochs,
            seed=seed,
            workload_params=wp,
            optimizer_params={**NO_DECAY, **op},
        ),
        wl.load_data(0),
    )
    history = [trainer.run_epoch() for _ in range(epochs)]
    return history


def test_closed_forms():
    t = lambda *x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    assert float(ire_valley(t(2.0, 0.5))) == pytest.approx(0.5 * 5 * 0.25)
    assert float(tsam_wave(t(0.25))) == pytest.approx(0.0 / 0.25 + 0.005 * 0.75**2, abs=1e-12)  # sin(pi) = 0
    assert float(tsam_wave(t(0.375))) == pytest.approx(-1 / 0.375 + 0.005 * 0.625**2)  # sin(3 pi / 2) = -1
    assert [float(tsam_kink(t(x))) for x in (1.0, 0.5, 2.0, 2.5, 3.0)] == pytest.approx([-0.01, 0.49, 0.99, 0.25, 0.0])


def test_the_sampled_label_gradient_is_a_multiple_of_the_true_gradient():
    """IRE's curvature pass sees (L, -L) logits: its gradient is c * grad L with c != 0, so IRE ranks the
    coordinates by (grad L)^2."""
    torch.manual_seed(0)
    model = ToyModel((0.95, 0.3), ire_valley)
    closure = BatchClosure(
        model, lambda out, y: out[..., 0].mean(), torch.zeros(1, 1), torch.zeros(1, dtype=torch.long)
    )
    loss, (sampled,) = closure.with_sampled_grads([model.theta])
    true = torch.tensor([0.95 * 0.3**2, (1 + 0.95**2) * 0.3], dtype=torch.float64)  # (u v^2, (1+u^2) v)
    assert float(loss) == pytest.approx(0.5 * (1 + 0.95**2) * 0.09)
    assert torch.allclose(model.theta.grad, true)
    c = float(sampled[0] / true[0])
    assert abs(c) > 1e-3 and torch.allclose(sampled, c * true)


def test_ire_toy_through_the_trainer_reaches_the_stated_end_points():
    ends = {}
    for kappa in (0.0, 5.0):
        history = train(
            "toy/ire_fig1", {}, "sgd_ire", {"lr": 1.0, "kappa": kappa, "gamma": 0.5, "mask_interval": 1}, 20
        )
        last = history[-1]
        assert abs(last["val/v"]) < 1e-20 and last["val/trace_hessian"] == pytest.approx(1 + last["val/u"] ** 2)
        path = [h["val/abs_u"] for h in history]  # the trajectory, one point per 10 steps
        assert len(path) == 20 and path == sorted(path, reverse=True) and path[0] < 0.95
        ends[kappa] = last["val/abs_u"]
    assert ends == pytest.approx({0.0: 0.749, 5.0: 0.241}, abs=2e-3)  # tests/optim/test_ire.py: GD 0.749, kappa 5 0.241


@pytest.mark.slow
def test_tsam_wave_toy_through_the_trainer_ends_in_the_stated_basins():
    op = {"lr": 0.005, "rho": 0.2, "s": 3, "noise_radius": 0.1, "noise": "gaussian"}
    erm = train("toy/tsam_wave", {}, "tsam", {**op, "t": 0.0}, 100)[-1]
    tilted = train("toy/tsam_wave", {}, "tsam", {**op, "t": 1.0}, 100)[-1]
    assert erm["val/basin"] == pytest.approx(0.358, abs=2e-3) and erm["val/basin_curvature"] == pytest.approx(
        431, rel=0.01
    )
    assert tilted["val/basin"] == pytest.approx(0.868, abs=2e-3) and tilted["val/basin_curvature"] == pytest.approx(
        181, rel=0.01
    )
    assert (
        0.5 < erm["val/theta_tail"] < 0.6 and 0.6 < tilted["val/theta_tail"] < 0.7
    )  # test_tsam.py: means 0.558, 0.652


def test_tsam_kink_toy_basins_and_sharpness():
    wl = build_workload("toy/tsam_kink", theta0=1.5)
    data = wl.load_data(0)
    assert len(data.train) == 4 and wl.basin(1.99) == 1.0 and wl.basin(2.01) == 3.0
    last = train("toy/tsam_kink", {"theta0": 1.5}, "sgd", {"lr": 0.005}, 30)[-1]  # 120 steps of slope 1: 0.6 to go left
    assert last["val/basin"] == 1.0 and last["val/basin_loss"] == pytest.approx(-0.01)
    assert last["val/basin_sharpness"] == pytest.approx(0.1)  # (|r| + |r|) / 2 at the kink, r = 0.1
    assert last["val/basin_curvature"] == pytest.approx(2 / 1e-4, rel=1e-6)  # no second derivative: 2/h
    flat = train("toy/tsam_kink", {"theta0": 2.5}, "sgd", {"lr": 0.1}, 10)[-1]
    assert (
        flat["val/basin"] == 3.0
        and flat["val/basin_sharpness"] == pytest.approx(0.01)
        and flat["val/basin_curvature"] == pytest.approx(2.0)
    )
    assert flat["val/theta"] == pytest.approx(
        3.0 - 0.5 * 0.8**40, rel=1e-12
    )  # GD on (theta-3)^2: theta-3 shrinks by 1 - 2 lr


@pytest.mark.slow  # a fresh MLflow store and matplotlib: about 30 s on a loaded 2-core machine
def test_toy_figure_from_a_real_store(tmp_path):
    from mlflow.entities import Metric, Param

    from flatlab.tracking import runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "toy", runs.artifact_location(tmp_path))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/loss"), Param("mode", "min")])
    for kappa, u in ((0.0, 0.749), (2.0, 0.511), (5.0, 0.241)):
        run = c.create_run(
            exp, tags={runs.PARENT: parent, runs.TAG_ARM: "sgd_ire", runs.TAG_OUTCOME: "completed"}
        ).info.run_id
        c.log_batch(
            run,
            params=[Param("kappa", str(kappa))],
            metrics=[
                Metric("val/loss", 0.0, 0, 20),
                Metric("val/abs_u", u, 0, 20),
                Metric("val/trace_hessian", 1 + u * u, 0, 20),
            ],
        )
    lines = toy_figure(ReportInput.latest(uri, "toy", tmp_path / "out"), "val/abs_u", "val/trace_hessian")
    assert lines == [
        f"toy figure: toy_figure.png and toy_summary.json in {tmp_path / 'out'}, logged under toy/ on run {parent}"
    ]
    summary = json.loads((tmp_path / "out" / "toy_summary.json").read_text())
    assert summary["x"] == "kappa" and summary["values"]["5.0"] == {
        "end": [0.241],
        "flatness": [pytest.approx(1 + 0.241**2)],
    }
    assert sorted(a.path for a in c.list_artifacts(parent, "toy")) == ["toy/toy_figure.png", "toy/toy_summary.json"]


@pytest.mark.parametrize("name", ["toy_ire_fig1.py", "toy_tsam_fig1.py"])
def test_toy_study_files_validate(name):
    for study in load_studies(str(STUDIES_DIR / name)):
        validate(study)
        assert study.workload.startswith("toy/") and study.searcher == "grid"
        (figure,) = study.reports.values()  # the toy figure, asked for by the study (not its workload)
        assert list(study.reports) == ["toy_figure"] and set(figure.values()) <= set(
            build_workload(study.workload).metrics
        )
