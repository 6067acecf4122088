"""The trainer parameter ``measure_at_train_loss`` through the trial loop, without Ray: the study's measures
run on the model of the first epoch whose mean training loss reaches the target (``flat_at_target/*``,
equal to a direct ``compute_measures`` call on that model), training goes on to ``max_epochs`` and the
final model is measured as ``flat/*``; a resumed trial neither measures again nor loses the values; a
miss is recorded; bad combinations are refused before anything runs."""

from __future__ import annotations

import pytest
import torch

from flatlab import Arm, Study
from flatlab.errors import ConfigError
from flatlab.sharpness.measures import compute_measures, measure_subset, resolve_measures
from flatlab.study import trial_loop as loop
from flatlab.study.trial_spec import trial_spec
from flatlab.study.validate import validate
from flatlab.train.checkpoint import load_state
from flatlab.train.resolved import resolve_trainer
from flatlab.train.trainer import Trainer
from flatlab.workloads import build_workload

WL = {"model": "mlp", "width": 8, "depth": 1}
MEASURES = {"fisher_trace": {}, "neighbourhood_loss": {"sigma": 0.05, "draws": 3}}
# SGD lr 0.05, momentum 0.9, batch 128, constant lr on digits: mean training loss 2.29, 2.10, 1.73, 1.24, 0.85, 0.65
TARGET, TARGET_EPOCH, EPOCHS = 2.0, 3, 6


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits", **WL).load_data(0)


def study(target=TARGET, epochs=EPOCHS, **kw) -> Study:
    base = dict(
        name="mat",
        workload="digits",
        workload_params=WL,
        arms=(Arm("sgd", space={"lr": 0.05, "momentum": 0.9}),),
        num_trials=1,
        max_epochs=epochs,
        scheduler="fifo",
        checkpoint_every=100,
        train={"batch_size": 128, "schedule": "constant", "measure_at_train_loss": target},
        measures=MEASURES,
        measure_examples=64,
        measure_seed=3,
    )
    return validate(Study(**{**base, **kw}))


class Recorder:
    """The loop's ``report``: keeps every report and writes every checkpoint to ``root/epoch_<n>``."""

    def __init__(self, root):
        self.root, self.reports, self.checkpointed = root, [], []

    def __call__(self, metrics, snapshot):
        self.reports.append(dict(metrics))
        if snapshot is not None:
            epoch = int(metrics["epoch"])
            snapshot.write(str(self.root / f"epoch_{epoch}"))
            self.checkpointed.append(epoch)


def run(s: Study, data, root, resume_from=None, calls=None, monkeypatch=None) -> Recorder:
    if monkeypatch is not None:  # count the measuring calls
        measure = loop.measure_trial

        def counted(trainer, st):
            calls.append(trainer.epoch)
            return measure(trainer, st)

        monkeypatch.setattr(loop, "measure_trial", counted)
    trainer = Trainer(trial_spec(s, {"arm": "sgd", "seed": 0}), data)
    if resume_from is not None:
        trainer.load(str(resume_from))
    rec = Recorder(root)
    loop.trial_loop(trainer, s, rec)
    return rec


def direct_measures(s: Study, data, checkpoint_dir):
    """``compute_measures`` on the model a checkpoint holds, over the study's subset and seed."""
    workload = build_workload("digits", **WL)
    model = workload.build_model()
    state = load_state(str(checkpoint_dir))
    model.load_state_dict(state["model"])
    subset = measure_subset(data.train, s.measure_examples, s.measure_seed)
    return compute_measures(
        model, subset, lambda o, t: workload.loss(o, t, 0.0), resolve_measures(MEASURES, "t"), seed=s.measure_seed
    )


@pytest.fixture(scope="module")
def full(digits, tmp_path_factory):
    torch.set_num_threads(1)
    s = study()
    root = tmp_path_factory.mktemp("full")
    return s, root, run(s, digits, root)


def test_measures_at_the_target_then_trains_on_and_measures_the_end(full, digits):
    s, root, rec = full
    losses = [r["train/loss"] for r in rec.reports]
    assert [r["epoch"] for r in rec.reports] == list(range(1, EPOCHS + 1))  # did not stop at the target
    assert next(e for e, v in enumerate(losses, 1) if v <= TARGET) == TARGET_EPOCH and losses[TARGET_EPOCH - 2] > TARGET
    last = rec.reports[-1]
    assert (
        last["completed"] == 1
        and last["train/target_reached"] == 1.0
        and last["train/epochs_to_target"] == TARGET_EPOCH
    )
    at = direct_measures(s, digits, root / f"epoch_{TARGET_EPOCH}")  # the checkpoint that goes with the measured epoch
    for key in ("fisher_trace", "neighbourhood_loss", "neighbourhood_loss_var", "neighbourhood_loss_clean"):
        assert last[f"flat_at_target/{key}"] == pytest.approx(at[f"flat/{key}"], rel=1e-6), key
    end = direct_measures(s, digits, root / f"epoch_{EPOCHS}")
    for key in ("fisher_trace", "neighbourhood_loss"):
        assert last[f"flat/{key}"] == pytest.approx(end[f"flat/{key}"], rel=1e-6), key
    assert last["flat/fisher_trace"] != pytest.approx(last["flat_at_target/fisher_trace"], rel=1e-3)  # two models
    assert last["time/measures_at_target_s"] > 0
    # summary values of the last report only; the epoch of the target carries a checkpoint, no values
    assert all(not any(k.startswith("flat") for k in r) for r in rec.reports[:-1])
    assert rec.checkpointed == [TARGET_EPOCH, EPOCHS]  # checkpoint_every=100: only the measured and the last
    summary = set(last["summary_metrics"].split(","))
    assert {"flat_at_target/fisher_trace", "flat/fisher_trace", "train/epochs_to_target"} <= summary


def test_the_checkpoint_keeps_the_target_state(full):
    _, root, rec = full
    state = load_state(str(root / f"epoch_{TARGET_EPOCH}"))
    assert state["target_epoch"] == TARGET_EPOCH
    assert state["target_metrics"] == {
        k: v for k, v in rec.reports[-1].items() if k.startswith("flat_at_target/") or k == "time/measures_at_target_s"
    }


def test_a_trial_resumed_after_the_target_does_not_measure_again(full, digits, tmp_path, monkeypatch):
    s, root, rec = full
    calls = []
    resumed = run(s, digits, tmp_path, resume_from=root / f"epoch_{TARGET_EPOCH}", calls=calls, monkeypatch=monkeypatch)
    assert [r["epoch"] for r in resumed.reports] == list(range(TARGET_EPOCH + 1, EPOCHS + 1))
    assert calls == [EPOCHS]  # only the final model
    a, b = rec.reports[-1], resumed.reports[-1]
    for key in [k for k in a if k.startswith(("flat_at_target/", "flat/", "train/"))]:
        assert b[key] == a[key], key  # kept from the checkpoint; the end bit-identical on CPU
    assert b["train/epochs_to_target"] == TARGET_EPOCH


def test_a_trial_resumed_before_the_target_measures_it_once(full, digits, tmp_path, monkeypatch):
    s, _, rec = full
    first = tmp_path / "first"
    run(study(checkpoint_every=1), digits, first)  # a checkpoint every epoch
    calls = []
    resumed = run(s, digits, tmp_path / "again", resume_from=first / "epoch_2", calls=calls, monkeypatch=monkeypatch)
    assert calls == [TARGET_EPOCH, EPOCHS]
    assert resumed.reports[-1]["flat_at_target/fisher_trace"] == rec.reports[-1]["flat_at_target/fisher_trace"]


def test_reaching_the_target_at_the_last_epoch_measures_once(digits, tmp_path, monkeypatch):
    calls = []
    rec = run(study(epochs=TARGET_EPOCH), digits, tmp_path, calls=calls, monkeypatch=monkeypatch)
    last = rec.reports[-1]
    assert calls == [TARGET_EPOCH] and last["train/epochs_to_target"] == TARGET_EPOCH
    assert last["flat_at_target/fisher_trace"] == last["flat/fisher_trace"]


def test_a_missed_target_is_recorded_and_the_end_still_measured(digits, tmp_path):
    rec = run(study(target=1e-3, epochs=2), digits, tmp_path)
    last = rec.reports[-1]
    assert last["train/target_reached"] == 0.0 and last["completed"] == 1
    assert "train/epochs_to_target" not in last and not any(k.startswith("flat_at_target/") for k in last)
    assert "flat/fisher_trace" in last


def test_stop_at_train_loss_still_stops_at_the_target(digits, tmp_path):
    s = study(train={"batch_size": 128, "schedule": "constant", "stop_at_train_loss": TARGET})
    rec = run(s, digits, tmp_path)
    last = rec.reports[-1]
    assert last["epoch"] == TARGET_EPOCH and last["train/epochs_to_target"] == TARGET_EPOCH
    assert "flat/fisher_trace" in last and not any(k.startswith("flat_at_target/") for k in last)


# ---------------------------------------------------------------------------------------------------
# Validation: every problem before anything runs


def test_both_targets_are_refused_by_the_study_and_the_trainer():
    with pytest.raises(
        ConfigError, match=r"field 'train': stop_at_train_loss=0\.1 and measure_at_train_loss=0\.2 are both set"
    ):
        study(train={"stop_at_train_loss": 0.1, "measure_at_train_loss": 0.2})
    from flatlab.workloads.base import TrainDefaults

    with pytest.raises(
        ConfigError,
        match=r"trainer: stop_at_train_loss=0\.1 and measure_at_train_loss=0\.2 are both set; set at most one",
    ):
        resolve_trainer(TrainDefaults(), {"stop_at_train_loss": 0.1, "measure_at_train_loss": 0.2})


def test_target_errors_are_collected_with_the_others():
    arms = (
        Arm("sgd", space={"lr": 0.05, "measure_at_train_loss": 0.5}),
        Arm("adamw", space={"stop_at_train_loss": 0.5}),
    )
    with pytest.raises(ConfigError) as err:
        study(train={"measure_at_train_loss": 0.0}, arms=arms, measures={}, max_epochs=0)
    text = str(err.value)
    assert "measure_at_train_loss=0.0 is not allowed; expected float in (0, inf) or None" in text
    assert "arm 'sgd': field 'measure_at_train_loss' is study-wide" in text
    assert "arm 'adamw': field 'stop_at_train_loss' is study-wide" in text
    assert "max_epochs=0" in text


def test_measure_at_train_loss_needs_measures():
    with pytest.raises(
        ConfigError, match=r"measure_at_train_loss=0\.5 runs the study's measures at the target, but measures is empty"
    ):
        study(target=0.5, measures={})
