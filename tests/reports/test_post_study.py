"""The post-study pipeline reads the launch's trials once: steps to target logs on the trial runs and hands
the sample on with its values, and every later step and declared report is handed that sample."""

import time

from mlflow.entities import Metric, Param

from flatlab import Arm, Study
from flatlab.reports import post_study as ps
from flatlab.reports.declared import REPORTS, StudyReport
from flatlab.reports.launched import Launched
from flatlab.reports.speedup import SPEEDUP_METRIC, STEPS_METRIC
from flatlab.tracking import runs
from flatlab.tracking import trials as trials_module
from flatlab.tracking.artifacts import CURVE_METRIC

# arm, seed, val/loss, smoothed training-loss curve
TRIALS = [
    ("adamw", 0, 0.5, [(1, 3.0), (5, 1.5), (10, 1.0)]),
    ("fast", 0, 0.4, [(2, 2.0), (4, 0.9)]),
    ("slow", 0, 0.9, [(5, 2.0), (10, 1.5)]),
]


def launch(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "pst", runs.artifact_location(tmp_path))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/loss"), Param("mode", "min"), Param("reference_arm", "adamw")])
    ids = {}
    now = int(time.time() * 1000)
    for arm, seed, loss, curve in TRIALS:
        tags = {runs.PARENT: parent, runs.TAG_ARM: arm, runs.TAG_SEED: str(seed), runs.TAG_OUTCOME: "completed"}
        run_id = c.create_run(exp, tags=tags).info.run_id
        metrics = [Metric(CURVE_METRIC, v, now, s) for s, v in curve] + [Metric("val/loss", loss, now, 1)]
        c.log_batch(run_id, metrics=metrics, params=[Param("arm", arm), Param("lr", "0.1")])
        c.set_terminated(run_id, "FINISHED")
        ids[arm] = run_id
    return uri, exp, parent, ids


def test_every_step_sees_steps_to_target_in_the_one_sample_read(tmp_path, monkeypatch):
    uri, exp, parent, ids = launch(tmp_path)
    reads = {"read_sample": 0, "trials_frame": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            reads[name] += 1
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(ps, "read_sample", counted("read_sample", ps.read_sample))
    monkeypatch.setattr(trials_module, "trials_frame", counted("trials_frame", trials_module.trials_frame))
    seen = {}
    monkeypatch.setattr(ps, "STEPS", (("record", lambda launched, sample: seen.setdefault("step", sample)),))

    def report(given, params):
        seen["report"] = given
        return []

    monkeypatch.setitem(REPORTS._entries, "seen", StudyReport("seen", "test", report))
    study = Study(
        name="pst",
        workload="digits",
        arms=(Arm("adamw"), Arm("sgd", name="fast"), Arm("sgd", name="slow")),
        metric="val/loss",
        mode="min",
        seeds=(0,),
        reference_arm="adamw",
        reports={"seen": {}},
    )
    ps.post_study(Launched(study, uri, exp, parent, out=tmp_path / "pst", log=tmp_path / "driver.log"))

    assert reads == {"read_sample": 1, "trials_frame": 1}
    by_run = seen["step"].trials.set_index("run_id")
    assert by_run.loc[ids["fast"], STEPS_METRIC] == 4.0 and by_run.loc[ids["fast"], SPEEDUP_METRIC] == 2.5
    assert by_run.loc[ids["adamw"], STEPS_METRIC] == 10.0 and by_run.loc[ids["adamw"], SPEEDUP_METRIC] == 1.0
    assert by_run[[STEPS_METRIC, SPEEDUP_METRIC]].loc[ids["slow"]].isna().all()  # never reached: nothing logged
    assert runs.client(uri).get_run(ids["fast"]).data.metrics[STEPS_METRIC] == 4.0  # and logged on the run
    assert seen["report"].trials is seen["step"].trials and seen["report"].parent_run_id == parent
    assert (seen["report"].study, seen["report"].out_dir) == ("pst", tmp_path / "pst" / "report")
