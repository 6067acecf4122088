"""The trainer's ``test_every_epoch``: per-epoch test metrics for published per-epoch test curves
(DeepOBS), off by default, recorded as a trainer param, never a study's selection metric."""

import dataclasses

import pytest

from flatlab.errors import ConfigError
from flatlab.study.validate import validate
from flatlab.train.resolved import resolve_spec
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits").load_data(0)


def spec(**trainer):
    return TrialSpec(
        workload="digits",
        optimizer="sgd",
        epochs=2,
        seed=3,
        workload_params={"model": "mlp", "width": 16},
        optimizer_params={"lr": 0.1},
        trainer_params={"batch_size": 64, **trainer},
    )


def test_off_by_default_and_recorded_as_a_trainer_param():
    assert resolve_spec(spec())["trainer"]["test_every_epoch"] is False
    assert resolve_spec(spec(test_every_epoch=True))["trainer"]["test_every_epoch"] is True
    with pytest.raises(ConfigError, match=r"test_every_epoch='yes' is not allowed; expected True or False"):
        resolve_spec(spec(test_every_epoch="yes"))


def test_every_epoch_reports_the_test_metrics_of_that_epochs_model(digits):
    plain, tested = Trainer(spec(), digits), Trainer(spec(test_every_epoch=True), digits)
    for _epoch in (1, 2):
        a, b = plain.run_epoch(), tested.run_epoch()
        assert not any(k.startswith("test/") for k in a)
        assert set(k for k in b if k.startswith("test/")) == {"test/loss", "test/accuracy"}
        assert {k: b[k] for k in ("test/loss", "test/accuracy")} == tested.evaluate_test() == plain.evaluate_test()
        assert a["val/loss"] == b["val/loss"] and a["train/loss"] == b["train/loss"]  # training itself is unchanged


def test_a_validation_split_that_is_the_test_split_is_not_evaluated_twice(digits):
    same = dataclasses.replace(digits, val=digits.test)  # e.g. fashion_mnist with val_size = 0
    t = Trainer(spec(test_every_epoch=True), same)
    calls = []
    evaluate = t.workload.evaluate
    t.workload.evaluate = lambda model, split: calls.append(split) or evaluate(model, split)
    m = t.run_epoch()
    assert len(calls) == 1 and calls[0] is digits.test
    assert (m["test/loss"], m["test/accuracy"]) == (m["val/loss"], m["val/accuracy"])


def test_a_study_may_not_select_on_the_test_split():
    from flatlab import Arm, Study

    study = Study(
        name="s", workload="digits", arms=(Arm("sgd"),), train={"test_every_epoch": True}, metric="test/accuracy"
    )
    with pytest.raises(ConfigError, match=r"metric='test/accuracy' is reported only after the last epoch"):
        validate(study)
