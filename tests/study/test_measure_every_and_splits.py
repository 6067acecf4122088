"""The study's ``measure_every`` (measures over training, ``flat_curve/*`` at step = epoch) and
``measure_extra_splits`` (the same measures on the test split, ``flat_test/*``) through the trial loop,
without Ray; values checked against the mean loss of the checkpointed models computed by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flatlab import Arm, Study
from flatlab.errors import ConfigError
from flatlab.sharpness.measures import measure_subset
from flatlab.study import trial_loop as loop
from flatlab.study.trial_spec import trial_spec
from flatlab.study.validate import validate
from flatlab.tracking.runs import on_split, over_training
from flatlab.train.checkpoint import load_state
from flatlab.train.trainer import Trainer
from flatlab.workloads import build_workload
from flatlab.workloads.base import Data

WL = {"model": "mlp", "width": 8, "depth": 1}
EPOCHS, EVERY = 4, 2


def study(**kw) -> Study:
    base = dict(
        name="every",
        workload="digits",
        workload_params=WL,
        arms=(Arm("sgd", space={"lr": 0.05, "momentum": 0.9}),),
        num_trials=1,
        max_epochs=EPOCHS,
        scheduler="fifo",
        checkpoint_every=1,
        train={"batch_size": 128, "schedule": "constant"},
        measures={"erm_objective": {}},
        measure_examples=64,
        measure_seed=3,
        measure_extra_splits=("test",),
        measure_every=EVERY,
    )
    return validate(Study(**{**base, **kw}))


def mean_loss(checkpoint, split, s):
    """The cross-entropy of the checkpointed model over the study's subset of ``split``, by hand."""
    model = build_workload("digits", **WL).build_model()
    model.load_state_dict(load_state(str(checkpoint))["model"])
    model.eval()
    rows = torch.randperm(len(split.targets), generator=torch.Generator().manual_seed(s.measure_seed))[:64].sort()
    with torch.no_grad():
        return float(F.cross_entropy(model(split.inputs[rows.values]), split.targets[rows.values]))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    torch.set_num_threads(1)
    data = build_workload("digits", **WL).load_data(0)
    s, root, reports, calls = study(), tmp_path_factory.mktemp("every"), [], []
    measure = loop.measure_trial

    def counted(trainer, st):
        calls.append(trainer.epoch)
        return measure(trainer, st)

    def report(metrics, snapshot):
        reports.append(dict(metrics))
        if snapshot is not None:
            snapshot.write(str(root / f"epoch_{int(metrics['epoch'])}"))

    loop.measure_trial, saved = counted, loop.measure_trial
    try:
        loop.trial_loop(Trainer(trial_spec(s, {"arm": "sgd", "seed": 0}), data), s, report)
    finally:
        loop.measure_trial = saved
    return s, data, root, reports, calls


def test_every_kth_epoch_logs_the_curve_on_both_splits(ran):
    s, data, root, reports, calls = ran
    assert calls == [2, 4]  # the last epoch's point is the final model's measures: measured once
    for r in reports:
        has = "flat_curve/erm_objective" in r
        assert has == (r["epoch"] % EVERY == 0) and ("flat_curve_test/erm_objective" in r) == has
    for epoch in (2, 4):
        r = reports[epoch - 1]
        assert r["flat_curve/erm_objective"] == pytest.approx(mean_loss(root / f"epoch_{epoch}", data.train, s), 1e-5)
        assert r["flat_curve_test/erm_objective"] == pytest.approx(
            mean_loss(root / f"epoch_{epoch}", data.test, s), 1e-5
        )
    assert reports[1]["flat_curve/erm_objective"] > reports[3]["flat_curve/erm_objective"]  # training lowers it
    last = reports[-1]
    assert last["flat/erm_objective"] == last["flat_curve/erm_objective"]
    assert last["flat_test/erm_objective"] == last["flat_curve_test/erm_objective"]
    summary = set(last["summary_metrics"].split(","))  # the final model's values are summary values (step 0) ...
    assert {"flat/erm_objective", "flat_test/erm_objective"} <= summary
    assert not any(k.startswith("flat_curve") for k in summary)  # ... the curve's are per-epoch (step = epoch)


def test_key_names():
    measured = {"flat/a": 1.0, "flat/a_stderr": 0.1, "time/measures_s": 2.0, "val/loss": 3.0}
    assert on_split(measured, "test") == {"flat_test/a": 1.0, "flat_test/a_stderr": 0.1, "time/measures_test_s": 2.0}
    both = {**measured, "flat_test/a": 4.0, "flat_at_target/a": 5.0}
    assert over_training(both) == {
        "flat_curve/a": 1.0,
        "flat_curve/a_stderr": 0.1,
        "flat_curve_test/a": 4.0,
        "time/measures_curve_s": 2.0,
    }


def test_a_split_the_data_lacks_is_named():
    data = build_workload("digits", **WL).load_data(0)
    s = study(max_epochs=1, measure_every=None)
    trainer = Trainer(trial_spec(s, {"arm": "sgd", "seed": 0}), Data(data.train, data.val))
    with pytest.raises(ConfigError, match=r"measure_extra_splits names 'test', which this workload's data does not"):
        loop.measure_trial(trainer, s)
    assert measure_subset(data.test, 64, 3).m == 64


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"measure_extra_splits": ("train",)}, r"measure_extra_splits=\('train',\) repeats a split or names"),
        ({"measure_extra_splits": ("ood",)}, r"measure_extra_splits=\('ood',\); expected a tuple of splits from"),
        ({"measure_every": 0}, r"measure_every=0; expected None or an int >= 1"),
        ({"measures": {}}, r"measure_extra_splits or measure_every is set but measures is empty"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(kw, message):
    with pytest.raises(ConfigError, match=message):
        study(**kw)
