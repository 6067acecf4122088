"""What a resume makes of the trial runs a killed driver left: finished runs stand, orphans are taken over
by the trial with their configuration, and the rest end KILLED."""

from mlflow.entities import Metric, Param

from flatlab.analysis.selection import trial_outcome
from flatlab.study.recovery import LaunchRecords, recorded_result
from flatlab.tracking import runs


def _store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "rec", (tmp_path / "art").as_uri())
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    return uri, exp, c, parent


def _trial(c, exp, parent, trial_id, config, status="RUNNING", outcome=None, epochs=0, stage="search"):
    run = c.create_run(
        exp, tags={runs.TAG_ROLE: "trial", runs.PARENT: parent, runs.TAG_TRIAL: trial_id, runs.TAG_STAGE: stage}
    )
    rid = run.info.run_id
    c.log_batch(
        rid,
        params=[Param(k, v) for k, v in runs.trial_params(config).items()],
        metrics=[
            Metric(k, v, 0, e)
            for e in range(1, epochs + 1)
            for k, v in (("epoch", float(e)), ("val/accuracy", 0.5 + e / 100))
        ],
    )
    if outcome:
        c.set_tag(rid, runs.TAG_OUTCOME, outcome)
    if status != "RUNNING":
        c.set_terminated(rid, status=status)
    return rid


def test_finished_runs_stand_orphans_are_taken_over_and_the_rest_end_killed(tmp_path):
    uri, exp, c, parent = _store(tmp_path)
    done = _trial(c, exp, parent, "t1", {"arm": "sgd", "seed": 0, "lr": 0.1}, "FINISHED", "completed", epochs=3)
    pruned = _trial(c, exp, parent, "t2", {"arm": "sgd", "seed": 1, "lr": 0.2}, "KILLED", "pruned", epochs=2)
    running = _trial(c, exp, parent, "t3", {"arm": "sgd", "seed": 2, "lr": 0.3}, epochs=1)
    orphan_done = _trial(c, exp, parent, "o1", {"arm": "sgd", "seed": 0, "lr": 0.4}, "FINISHED", "completed", epochs=3)
    orphan_running = _trial(c, exp, parent, "o2", {"arm": "sgd", "seed": 1, "lr": 0.5}, epochs=2)
    stray = _trial(c, exp, parent, "o3", {"arm": "sgd", "seed": 2, "lr": 0.6}, epochs=1)
    errored = _trial(c, exp, parent, "t4", {"arm": "sgd", "seed": 0, "lr": 0.7}, "FAILED", "error", epochs=1)
    rec = LaunchRecords(uri, exp, parent)

    result = rec.on_add("t1", {"arm": "sgd", "seed": 0, "lr": 0.1})  # finished after Tune's last save: stands
    assert result["epoch"] == 3 and result["training_iteration"] == 3 and result["completed"] == 1
    assert result["val/accuracy"] == 0.53 and trial_outcome(result, False, "val/accuracy") == "completed"
    assert trial_outcome(rec.on_add("t2", {"arm": "sgd", "seed": 1, "lr": 0.2}), False, "val/accuracy") == "pruned"
    assert rec.on_add("t3", {"arm": "sgd", "seed": 2, "lr": 0.3}) is None  # was running: runs again
    assert rec.on_add("t4", {"arm": "sgd", "seed": 0, "lr": 0.7}) is None  # errored: retried

    # new trials with an orphan's configuration take its run over (a different stage or value does not)
    assert (
        rec.on_add("n0", {"arm": "sgd", "seed": 0, "lr": 0.4, "stage": "final"}) is None and rec.claimed("n0") is None
    )
    assert rec.on_add("n1", {"arm": "sgd", "seed": 0, "lr": 0.4})["completed"] == 1
    assert rec.claimed("n1") == orphan_done and rec.took_over("n1") == "o1"  # the id MLflow knows it by
    assert rec.on_add("n2", {"arm": "sgd", "seed": 1, "lr": 0.5}) is None and rec.claimed("n2") == orphan_running
    assert rec.on_add("n3", {"arm": "sgd", "seed": 1, "lr": 0.5}) is None and rec.claimed("n3") is None  # taken once
    assert rec.took_over("n3") is None and rec.took_over("t1") is None  # its own run, or a new one
    assert rec.on_add("n1", {"arm": "sgd", "seed": 0, "lr": 0.4})["completed"] == 1  # asked again: the same run

    assert rec.end_unclaimed() == [stray]  # never added, never taken over
    assert c.get_run(stray).info.status == "KILLED" and c.get_run(stray).data.tags[runs.TAG_OUTCOME] == "interrupted"
    for rid, status in (
        (done, "FINISHED"),
        (pruned, "KILLED"),
        (running, "RUNNING"),
        (orphan_running, "RUNNING"),
        (errored, "FAILED"),
    ):
        assert c.get_run(rid).info.status == status  # the records are only read, never changed, by on_add


def test_a_diverged_run_gives_back_its_outcome():
    class Run:
        class data:
            metrics = {"epoch": 2.0, "train/loss": 9.0}
            tags = {runs.TAG_OUTCOME: "diverged"}

    result = recorded_result(Run())
    assert trial_outcome(result, False, "val/accuracy") == "diverged" and result["training_iteration"] == 2


def test_a_run_killed_before_its_params_were_logged_is_taken_over_by_its_digest_and_given_them(tmp_path):
    # The driver creates a trial run (tags), then logs its params in a second call; a SIGKILL between the
    # two leaves a run with no params. A resume must still take it over (one run per trial), by the
    # configuration digest the run carried from its creation, and the callback must log the params then.
    from flatlab.tracking.callback import MLflowTrialLogger

    uri, exp, c, parent = _store(tmp_path)
    config = {"arm": "sgd", "seed": 1, "lr": 0.25}
    bare = c.create_run(
        exp,
        tags={
            runs.TAG_ROLE: "trial",
            runs.PARENT: parent,
            runs.TAG_TRIAL: "old",
            runs.TAG_STAGE: "search",
            runs.TAG_CONFIG: runs.config_digest(config),
        },
    ).info.run_id
    other = c.create_run(
        exp,
        tags={
            runs.TAG_ROLE: "trial",
            runs.PARENT: parent,
            runs.TAG_TRIAL: "old2",
            runs.TAG_STAGE: "search",
            runs.TAG_CONFIG: runs.config_digest({**config, "lr": 0.5}),
        },
    ).info.run_id
    assert c.get_run(bare).data.params == {}
    rec = LaunchRecords(uri, exp, parent)
    assert rec.on_add("new", dict(config)) is None and rec.claimed("new") == bare  # runs again, in that run

    cb = MLflowTrialLogger(uri, exp, parent, {}, {"sgd": "sgd"}, metric="val/accuracy", mode="max")
    cb.claimed = rec.claimed

    class T:
        trial_id = "new"

    T.config = dict(config)
    cb.on_trial_start(0, [], T())
    cb.on_trial_result(0, [], T(), {"epoch": 1, "val/accuracy": 0.5, "completed": 1})
    cb.on_trial_complete(0, [], T())
    cb.close()
    run = c.get_run(bare)
    assert run.data.params == runs.trial_params(config) and run.data.tags[runs.TAG_TRIAL] == "new"
    assert run.info.status == "FINISHED" and cb.errors == []
    assert rec.end_unclaimed() == [other]  # a different configuration is not taken over


def test_the_config_digest_depends_on_the_configuration_only():
    a = runs.config_digest({"arm": "sgd", "seed": 0, "lr": 0.1, "stage": "final"})
    assert a == runs.config_digest({"lr": 0.1, "seed": 0, "arm": "sgd"})  # order and stage do not count
    assert len(a) == 16 and int(a, 16) >= 0
    assert a != runs.config_digest({"arm": "sgd", "seed": 0, "lr": 0.1000001})
    assert a != runs.config_digest({"arm": "sgd", "seed": 1, "lr": 0.1})
