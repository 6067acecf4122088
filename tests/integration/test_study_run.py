"""A 4-trial study through Ray Tune on local Ray (2 CPUs), checked in MLflow, results and export."""

import io

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.cli.main import app
from flatlab.study.validate import validate
from flatlab.tracking import runs
from flatlab.tracking.logged_model import run_model_id

pytestmark = pytest.mark.integration

EPOCHS = 3


@pytest.fixture(scope="module")
def study_run(tmp_path_factory):
    import ray

    from flatlab.study.runner import RunOptions, run_study

    root = tmp_path_factory.mktemp("root")
    study = validate(
        Study(
            name="it4",
            workload="digits",
            workload_params={"width": 32},
            arms=(
                Arm("sgd", space={"lr": sp.loguniform(0.01, 0.5), "momentum": 0.9}),
                Arm("adamw", space={"lr": sp.loguniform(1e-3, 1e-2)}),
                Arm("sgd", name="sgd_fixed", space={"lr": 0.1}),
                Arm("sgd", name="boom", space={"lr": 1e7, "momentum": 0.9}),  # diverges
            ),
            num_trials=1,
            max_epochs=EPOCHS,
            scheduler="fifo",
            max_concurrent=2,
        )
    )
    outcome = run_study(study, RunOptions(root=root, num_cpus=2))
    ray.shutdown()
    return root, outcome


def test_parent_and_child_runs(study_run):
    root, outcome = study_run
    c = runs.client(outcome.tracking_uri)
    parent = c.get_run(outcome.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[runs.TAG_ROLE] == "study" and parent.data.params["workload"] == "digits"
    children = c.search_runs([outcome.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{outcome.parent_run_id}'")
    assert len(children) == 4
    by_arm = {r.data.tags[runs.TAG_ARM]: r for r in children}
    assert set(by_arm) == {"sgd", "adamw", "sgd_fixed", "boom"}
    for arm, r in by_arm.items():
        assert r.data.tags[runs.TAG_STUDY] == "it4" and r.data.tags[runs.TAG_WORKLOAD] == "digits"
        assert r.data.tags[runs.TAG_OPT] == ("adamw" if arm == "adamw" else "sgd")
        assert r.data.tags[runs.TAG_COMMIT] and r.data.tags[runs.TAG_VERSION]
        assert r.data.tags[runs.TAG_SOURCE] == runs.source_digest()  # which code ran, with or without git
        # the trial set its CPU threads' subnormal mode before computing: every thread flushes (Resources' default)
        assert r.data.tags["flatlab.cpu_denormals"] == "flush"
        assert r.data.params["arm"] == arm and r.data.params["seed"] == "0" and "lr" in r.data.params
    assert by_arm["sgd_fixed"].data.params["lr"] == "0.1"
    assert 0.01 <= float(by_arm["sgd"].data.params["lr"]) <= 0.5
    for arm in ("sgd", "adamw", "sgd_fixed"):
        r = by_arm[arm]
        assert r.info.status == "FINISHED" and r.data.tags[runs.TAG_OUTCOME] == "completed"
        hist = c.get_metric_history(r.info.run_id, "val/accuracy")
        assert sorted(m.step for m in hist) == list(range(1, EPOCHS + 1))
        times = [m.timestamp for m in sorted(hist, key=lambda m: m.step)]
        assert times == sorted(times) and len(set(times)) == EPOCHS  # each epoch timed when it ended
        # the final model's test metric: a summary value at step 0, timed with the last epoch
        assert [(m.step, m.timestamp) for m in c.get_metric_history(r.info.run_id, "test/accuracy")] == [(0, times[-1])]
        for k in ("train/loss", "train/accuracy", "val/loss", "lr", "time/epoch_s", "test/accuracy"):
            assert k in r.data.metrics, k
        assert "trial.json" in {a.path for a in c.list_artifacts(r.info.run_id)}  # logged by the worker
        assert run_model_id(c, r.info.run_id) is not None  # and the final model, as an MLflow logged model
        assert r.info.run_name == f"{arm} · {r.data.tags[runs.TAG_TRIAL]}"
    boom = by_arm["boom"]
    assert boom.info.status == "FAILED" and boom.data.tags[runs.TAG_OUTCOME] == "diverged"
    assert boom.data.metrics["diverged"] == 1.0
    assert all(r.info.status != "RUNNING" for r in children)


def test_results_cli_and_parquet_round_trip(study_run, tmp_path):
    root, outcome = study_run
    cli = CliRunner()
    res = cli.invoke(app, ["results", "it4", "--root", str(root)])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if "FINISHED" in line or "FAILED" in line]
    assert len(lines) == 4 and "boom" in lines[-1]  # best first, the diverged trial last
    out = tmp_path / "it4.parquet"
    res = cli.invoke(app, ["results", "it4", "--root", str(root), "--format", "parquet", "--output", str(out)])
    assert res.exit_code == 0, res.output
    back = pq.read_table(out).to_pandas()
    from flatlab.tracking.trials import trials_frame

    df = trials_frame(outcome.tracking_uri, "it4")
    pd.testing.assert_frame_equal(back.reset_index(drop=True), df.reset_index(drop=True), check_dtype=False)
    assert list(back["arm"])[-1] == "boom"
    done = df["outcome"] == "completed"
    assert (
        "lr" not in df.columns and df.loc[done, "last_lr"].gt(0).all() and "param.lr" in df.columns
    )  # no two lr columns
    res = cli.invoke(app, ["results", "it4", "--root", str(root), "--format", "csv"])  # csv to stdout
    assert res.exit_code == 0, res.output
    csv = pd.read_csv(io.StringIO(res.output), dtype={"trial_id": str})
    assert list(csv["trial_id"]) == list(df["trial_id"].astype(str)) and list(csv["arm"])[-1] == "boom"
    res = cli.invoke(app, ["results", "it4", "--root", str(root), "--by-config", "--format", "csv"])
    assert res.exit_code == 0, res.output
    per_config = pd.read_csv(io.StringIO(res.output))
    assert per_config["trials"].sum() == 4 and {"seeds", "val/accuracy mean", "val/accuracy std"} <= set(
        per_config.columns
    )
    res = cli.invoke(app, ["results", "it4", "--root", str(root), "--by-config", "--best"])
    assert res.exit_code == 0 and "it4 (3 configurations)" in res.output and "seeds" in res.output, res.output
    assert "no completed trial (pruned, diverged, failed or unfinished), so no best for: boom" in res.output
    res = cli.invoke(app, ["results", "nope", "--root", str(root)])
    assert res.exit_code == 2 and "no study 'nope'" in res.output and "it4" in res.output


def test_pruned_and_errored_trials_get_terminal_statuses():
    from flatlab.tracking.callback import MLflowTrialLogger

    cb = MLflowTrialLogger("sqlite:///:memory:", "0", "p", {}, {}, metric="val/accuracy", mode="max")

    class T:
        def __init__(self, tid, last):
            self.trial_id, self.last_result, self.config = tid, last, {}

    # a trial completed when its last report says so (its whole budget, or its training-loss target);
    # one that ended without that flag was stopped by the scheduler
    for tid, last in (
        ("a", {"epoch": 10, "completed": 1, "val/accuracy": 0.9}),
        ("b", {"epoch": 4, "val/accuracy": 0.5}),
        ("c", {"epoch": 2, "diverged": 1}),
    ):
        cb._last[tid] = last
        cb.on_trial_complete(0, [], T(tid, last))
    cb.on_trial_error(0, [], T("d", {}))
    got = [cb._queue.get_nowait()[2][:2] for _ in range(4)]
    assert got == [("FINISHED", "completed"), ("FINISHED", "pruned"), ("FAILED", "diverged"), ("FAILED", "error")]


@pytest.mark.parametrize("failed, expected", [(False, ("KILLED", "interrupted")), (True, ("FAILED", "error"))])
def test_runs_left_open_end_as_interrupted_or_failed_with_the_launch(tmp_path, failed, expected):
    from flatlab.study.launches import log_file
    from flatlab.tracking.callback import MLflowTrialLogger

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "open")
    parent = runs.client(uri).create_run(exp).info.run_id
    out = tmp_path / "root" / "open"  # the study's output folder
    cb = MLflowTrialLogger(uri, exp, parent, {}, {"sgd": "sgd"}, metric="val/accuracy", mode="max", log=log_file(out))

    class T:
        trial_id, config = "t1", {"arm": "sgd", "seed": 0}

    cb.on_trial_start(0, [], T())
    cb.close(interrupted=not failed, failed=failed)
    run = runs.client(uri).search_runs([exp], filter_string=f"tags.`{runs.TAG_TRIAL}` = 't1'")[0]
    assert (run.info.status, run.data.tags[runs.TAG_OUTCOME]) == expected
    # a failed launch names the study's log file, absolute (right from any working directory)
    error = f"the launch failed; see {tmp_path}/root/open/logs/flatlab.log" if failed else None
    assert run.data.tags.get(runs.TAG_ERROR) == error


def test_full_config_environment_and_study_report(study_run):
    """The arm 'adamw' searches only lr: its run still records every resolved value; the parent run has the
    environment, the best values per arm and the report's plots; the experiment opens as a training one."""
    import json

    import ray
    import torch

    root, outcome = study_run
    c = runs.client(outcome.tracking_uri)
    assert c.get_experiment(outcome.experiment_id).tags[runs.TAG_EXPERIMENT_KIND] == "custom_model_development"
    children = c.search_runs([outcome.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{outcome.parent_run_id}'")
    adamw = next(r for r in children if r.data.tags[runs.TAG_ARM] == "adamw")
    p = adamw.data.params
    assert 1e-3 <= float(p["lr"]) <= 1e-2 and p["opt.lr"] == p["lr"]  # the searched value under its own name too
    assert p["opt.beta1"] == "0.9" and p["opt.weight_decay"] == "0.0"  # adamw's declared defaults
    assert p["train.batch_size"] == "64" and p["train.schedule"] == "cosine" and p["train.epochs"] == str(EPOCHS)
    assert p["wl.width"] == "32" and p["wl.model"] == "mlp" and p["wl.depth"] == "2"
    trial = json.loads(open(c.download_artifacts(adamw.info.run_id, "trial.json", str(root))).read())
    assert trial["resolved"]["trainer"]["batch_size"] == 64 and trial["resolved"]["optimizer"]["beta2"] == 0.999
    assert trial["resolved"]["optimizer"]["lr"] == float(p["lr"])
    parent = c.get_run(outcome.parent_run_id)
    for run in (parent, adamw):
        assert run.data.tags["flatlab.env.ray"] == ray.__version__
        assert run.data.tags["flatlab.env.cuda"] == (torch.version.cuda or "none")
    packages = open(c.download_artifacts(outcome.parent_run_id, "environment/requirements.txt", str(root))).read()
    assert f"ray=={ray.__version__}" in packages.splitlines()
    report = {a.path for a in c.list_artifacts(outcome.parent_run_id, "report")}
    # one completed trial per arm: parallel coordinates of the searching arms, no importances (needs >= 2)
    assert report == {
        "report/learning_curves.png",
        "report/parallel_coordinate_sgd.png",
        "report/parallel_coordinate_adamw.png",
        "report/best_per_arm.json",
    }
    # one per-arm table instead of per-arm metrics: the parent's charts are the trials' curves
    assert not [m for m in parent.data.metrics if m.startswith("best/")]
    table = json.loads(open(c.download_artifacts(outcome.parent_run_id, "report/best_per_arm.json", str(root))).read())
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["data"]}
    assert rows["adamw"]["val/accuracy"] == float(f"{adamw.data.metrics['val/accuracy']:.4g}")
    assert rows["adamw"]["test/accuracy"] == float(f"{adamw.data.metrics['test/accuracy']:.4g}")
    assert rows["adamw"]["run_id"] == adamw.info.run_id and rows["adamw"]["trial"] == adamw.info.run_name
    assert "boom" not in rows  # it diverged: no completed trial
    assert parent.data.params["wl.width"] == "32" and "workload_params" not in parent.data.params  # no Python reprs
    assert not [v for v in parent.data.params.values() if v.startswith(("{", "["))]
    # the experiment's default view in MLflow's UI names this launch and the test metric its trials logged
    view = json.loads(c.get_experiment(outcome.experiment_id).tags["mlflow.sharedViewState.flatlab"])
    assert (
        view["runsExpanded"] == {outcome.parent_run_id: True} and "metrics.`test/accuracy`" in view["selectedColumns"]
    )
