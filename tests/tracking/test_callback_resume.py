"""A trial resumed from an earlier checkpoint re-runs epochs that MLflow already holds: none is logged twice."""

from flatlab.tracking import runs
from flatlab.tracking.callback import MLflowTrialLogger

METRIC = "val/accuracy"


class T:
    trial_id, config = "t1", {"arm": "sgd", "seed": 0}


def _logger(uri, exp, parent):
    return MLflowTrialLogger(uri, exp, parent, {}, {"sgd": "sgd"}, metric=METRIC, mode="max")


def test_epochs_rerun_after_a_restart_are_not_logged_twice(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "resume", artifact_root=str(tmp_path / "art"))
    c = runs.client(uri)
    parent = c.create_run(exp).info.run_id
    first = _logger(uri, exp, parent)
    first.on_trial_start(0, [], T())
    for epoch, acc in ((1, 0.5), (2, 0.8), (3, 0.6)):
        first.on_trial_result(0, [], T(), {"epoch": epoch, METRIC: acc})
    first.close(interrupted=True)  # Ctrl-C after epoch 3; the trial's last checkpoint is epoch 1

    second = _logger(uri, exp, parent)  # a new driver process (--resume): nothing in memory
    second.on_trial_restore(0, [], T())
    for epoch, acc in ((2, 0.7), (3, 0.65), (2, 0.1), (4, 0.75)):  # re-runs 2 and 3 (and a stray repeat of 2), then 4
        second.on_trial_result(0, [], T(), {"epoch": epoch, METRIC: acc})
    second._last["t1"] = {"epoch": 4, METRIC: 0.75, "completed": 1}
    second.on_trial_complete(0, [], T())
    second.close()

    run = c.search_runs([exp], filter_string=f"tags.`{runs.TAG_TRIAL}` = 't1'")
    assert len(run) == 1 and run[0].info.status == "FINISHED"
    rid = run[0].info.run_id
    assert [(m.step, m.value) for m in c.get_metric_history(rid, METRIC)] == [(1, 0.5), (2, 0.8), (3, 0.6), (4, 0.75)]
    assert [m.step for m in c.get_metric_history(rid, "epoch")] == [1, 2, 3, 4]
    # the best continues from what was logged before the restart (0.8 at epoch 2), not from 0.75
    assert [(m.step, m.value) for m in c.get_metric_history(rid, f"best/{METRIC}")] == [
        (1, 0.5),
        (2, 0.8),
        (3, 0.8),
        (4, 0.8),
    ]
    assert first.errors == second.errors == []


def test_a_trial_whose_reports_never_reached_the_driver_is_logged_whole_when_rerun(tmp_path):
    # The worker finished the trial and logged its model, but the driver was killed before Tune took the
    # reports: on --resume Tune runs the trial again, and every epoch must reach MLflow once, from the
    # driver, with the final report's metrics linked to the model the final report names.
    import torch

    from flatlab.tracking.artifacts import WorkerTracking, log_trial_artifacts
    from flatlab.tracking.logged_model import run_model_id
    from flatlab.train.trainer import TrialSpec

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "rerun", artifact_root=str(tmp_path / "art"))
    c = runs.client(uri)
    parent = c.create_run(exp).info.run_id
    first = _logger(uri, exp, parent)
    first.on_trial_start(0, [], T())
    first.flush()
    final = {"epoch": 2, METRIC: 0.8, "test/accuracy": 0.7, runs.SUMMARY_KEY: "test/accuracy"}
    spec = TrialSpec(workload="digits", optimizer="sgd", epochs=2)
    log_trial_artifacts(WorkerTracking(uri, exp, parent), "t1", torch.nn.Linear(64, 10), spec, final)
    old_model = final[runs.MODEL_ID_KEY]
    first.close(interrupted=True)  # the driver dies before any report arrives
    rid = c.search_runs([exp], filter_string=f"tags.`{runs.TAG_TRIAL}` = 't1'")[0].info.run_id
    assert c.get_metric_history(rid, "epoch") == []  # the worker logged the model, no metric

    second = _logger(uri, exp, parent)
    second.on_trial_restore(0, [], T())
    second.on_trial_result(0, [], T(), {"epoch": 1, METRIC: 0.5})
    rerun = {"epoch": 2, METRIC: 0.8, "test/accuracy": 0.7, runs.SUMMARY_KEY: "test/accuracy"}
    log_trial_artifacts(WorkerTracking(uri, exp, parent), "t1", torch.nn.Linear(64, 10), spec, rerun)
    second.on_trial_result(0, [], T(), rerun)
    second._last["t1"] = {**rerun, "completed": 1}
    second.on_trial_complete(0, [], T())
    second.close()

    assert [m.step for m in c.get_metric_history(rid, "epoch")] == [1, 2]
    assert [(m.step, m.value) for m in c.get_metric_history(rid, METRIC)] == [(1, 0.5), (2, 0.8)]
    model = rerun[runs.MODEL_ID_KEY]
    assert model != old_model and run_model_id(c, rid) == model
    linked = {m.key: (m.step, m.value) for m in c.get_logged_model(model).metrics}
    assert linked["test/accuracy"] == (0, 0.7) and linked[METRIC] == (2, 0.8) and linked["epoch"] == (2, 2.0)
    assert second.errors == []
