"""The worker's smoothed training-loss curve as an MLflow metric history (flatlab.tracking.artifacts), on a
temporary SQLite store."""

from flatlab.tracking import runs
from flatlab.tracking.artifacts import CURVE_METRIC, WorkerTracking, log_curve, log_trial_artifacts
from flatlab.train.trainer import TrialSpec


def new_launch(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "worker", runs.artifact_location(tmp_path))
    parent = runs.client(uri).create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    return uri, exp, parent


def test_log_curve_sends_batches_of_at_most_1000():
    class Recorder:
        calls = []

        def log_batch(self, run_id, metrics):
            self.calls.append((run_id, [(m.key, m.step, m.value) for m in metrics]))

    rec = Recorder()
    log_curve(rec, "r", [(s, 1.0 / s) for s in range(1, 2501)])
    assert [len(m) for _, m in rec.calls] == [1000, 1000, 500]
    assert rec.calls[2][1][-1] == (CURVE_METRIC, 2500, 1.0 / 2500) and {r for r, _ in rec.calls} == {"r"}


def test_trial_artifacts_log_the_curve_as_a_metric_history(tmp_path):
    uri, exp, parent = new_launch(tmp_path)
    c = runs.client(uri)
    run_id = c.create_run(exp, tags={runs.PARENT: parent, runs.TAG_TRIAL: "t1"}).info.run_id
    spec = TrialSpec(workload="digits", optimizer="sgd", epochs=1)
    import torch

    curve = [(4 * i, 3.0 - i / 1000) for i in range(1, 1202)]
    got = log_trial_artifacts(
        WorkerTracking(uri, exp, parent, log_models=False), "t1", torch.nn.Linear(1, 1), spec, {}, curve=curve
    )
    assert got == run_id
    history = sorted((m.step, m.value) for m in c.get_metric_history(run_id, CURVE_METRIC))
    assert history == curve
